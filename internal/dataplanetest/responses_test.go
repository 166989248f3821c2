package dataplanetest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/model-orchestra/operator/internal/dataplanetest"
)

// TestResponsesThroughTheDataPlane serves the Responses API through the
// real queue, dispatcher and engine simulator, with the responses stored in
// JetStream: a stored response is continued in a stream, read back after a
// NATS restart, and continued again.
func TestResponsesThroughTheDataPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	simCfg := dataplanetest.FastSim()
	s := startStack(t, simCfg, nil)
	dispatcher(t, s)
	client := clientFor(s.Gateway.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	first, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: simCfg.Model,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me about queues.")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != "completed" || first.OutputText() == "" || first.Usage.OutputTokens != int64(simCfg.OutputTokens) {
		t.Fatalf("first response: status %q, text %q, usage %+v", first.Status, first.OutputText(), first.Usage)
	}

	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model:              simCfg.Model,
		PreviousResponseID: openai.String(first.ID),
		Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("And then?")},
	})
	var deltas strings.Builder
	var second responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed":
			second = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if second.ID == "" || deltas.String() == "" || second.Output[0].Content[0].Text != deltas.String() {
		t.Fatalf("streamed continuation: id %q, deltas %q", second.ID, deltas.String())
	}
	// The simulator's usage counts the prompt: the continuation's holds
	// the first exchange.
	if second.Usage.InputTokens <= first.Usage.InputTokens {
		t.Errorf("the continuation's input tokens %d do not exceed the first's %d: the conversation was not sent", second.Usage.InputTokens, first.Usage.InputTokens)
	}

	if err := s.RestartNATS(); err != nil {
		t.Fatal(err)
	}
	var got *responses.Response
	eventually(t, 15*time.Second, func() error {
		got, err = client.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
		return err
	})
	if got.Output[0].Content[0].Text != deltas.String() {
		t.Errorf("after a NATS restart the stored response reads %q, want %q", got.Output[0].Content[0].Text, deltas.String())
	}
	var third *responses.Response
	eventually(t, 15*time.Second, func() error {
		third, err = client.Responses.New(ctx, responses.ResponseNewParams{
			Model:              simCfg.Model,
			PreviousResponseID: openai.String(second.ID),
			Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("Last one.")},
		})
		return err
	})
	if third.PreviousResponseID != second.ID || third.Usage.InputTokens <= second.Usage.InputTokens {
		t.Errorf("third response: previous %q, input tokens %d (second's %d)", third.PreviousResponseID, third.Usage.InputTokens, second.Usage.InputTokens)
	}
	var apiErr *openai.Error
	if _, err := client.Responses.Get(ctx, "resp_doesnotexist", responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("Get of an unknown id = %v, want 404", err)
	}
}
