package dataplanetest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/sim"
)

func startStack(t *testing.T, simCfg sim.Config, mut func(*dataplanetest.StackConfig)) *dataplanetest.Stack {
	t.Helper()
	cfg := dataplanetest.StackConfig{Sim: simCfg}
	if testing.Verbose() {
		cfg.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	if mut != nil {
		mut(&cfg)
	}
	s, err := dataplanetest.StartStack(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func dispatcher(t *testing.T, s *dataplanetest.Stack) *dataplanetest.Dispatcher {
	t.Helper()
	d, err := s.StartDispatcher()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func clientFor(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey(dataplanetest.APIKey), option.WithMaxRetries(0))
}

func chat(prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
}

func TestOpenAIClientThroughTheDataPlane(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.InterTokenLatency = time.Millisecond
	s := startStack(t, simCfg, nil)
	dispatcher(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	viaGateway, direct := clientFor(s.Gateway.URL), clientFor(s.Engine.URL)

	t.Run("chat", func(t *testing.T) {
		got, err := viaGateway.Chat.Completions.New(ctx, chat("hello orchestra"))
		if err != nil {
			t.Fatal(err)
		}
		want, err := direct.Chat.Completions.New(ctx, chat("hello orchestra"))
		if err != nil {
			t.Fatal(err)
		}
		if got.Choices[0].Message.Content != want.Choices[0].Message.Content || got.Usage.TotalTokens != want.Usage.TotalTokens {
			t.Errorf("through the gateway: %q %+v\ndirect: %q %+v", got.Choices[0].Message.Content, got.Usage, want.Choices[0].Message.Content, want.Usage)
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		p := chat("stream through the queue")
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := viaGateway.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		want, err := direct.Chat.Completions.New(ctx, chat("stream through the queue"))
		if err != nil {
			t.Fatal(err)
		}
		if acc.Choices[0].Message.Content != want.Choices[0].Message.Content {
			t.Errorf("streamed %q, want %q", acc.Choices[0].Message.Content, want.Choices[0].Message.Content)
		}
		if acc.Usage.CompletionTokens != want.Usage.CompletionTokens {
			t.Errorf("streamed usage %+v, want %+v", acc.Usage, want.Usage)
		}
	})

	t.Run("completions and embeddings", func(t *testing.T) {
		c, err := viaGateway.Completions.New(ctx, openai.CompletionNewParams{
			Model:     "sim-model",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once")},
			MaxTokens: openai.Int(5),
		})
		if err != nil {
			t.Fatal(err)
		}
		if c.Usage.CompletionTokens != 5 {
			t.Errorf("completion usage %+v", c.Usage)
		}
		e, err := viaGateway.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "sim-model",
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("vector")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Data) != 1 || len(e.Data[0].Embedding) != simCfg.EmbeddingDim {
			t.Errorf("embedding: %d vectors", len(e.Data))
		}
	})

	t.Run("many at once", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for i := range 50 {
			wg.Go(func() {
				if _, err := viaGateway.Chat.Completions.New(ctx, chat(fmt.Sprint("request ", i))); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestDispatcherKilledMidAnswer(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 60
	simCfg.InterTokenLatency = 25 * time.Millisecond
	s := startStack(t, simCfg, nil)
	client := clientFor(s.Gateway.URL)

	t.Run("non-streamed completes on redelivery", func(t *testing.T) {
		victim := dispatcher(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done := make(chan error, 1)
		var got *openai.ChatCompletion
		go func() {
			var err error
			got, err = client.Chat.Completions.New(ctx, chat("survive the crash"))
			done <- err
		}()
		eventually(t, 5*time.Second, holds("the engine to start", func() bool { return s.Engine.Active.Load() == 1 }))
		victim.Kill()
		survivor := dispatcher(t, s)
		defer func() { _ = survivor.Stop() }() // teardown only; the stack stops it again
		if err := <-done; err != nil {
			t.Fatalf("request failed instead of being redelivered: %v", err)
		}
		if got.Usage.CompletionTokens != 60 {
			t.Errorf("answer after redelivery: %+v", got.Usage)
		}
	})

	t.Run("streamed ends with a clean error", func(t *testing.T) {
		victim := dispatcher(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stream := client.Chat.Completions.NewStreaming(ctx, chat("interrupted"))
		chunks := 0
		for stream.Next() {
			chunks++
			if chunks == 5 {
				victim.Kill()
				replacement := dispatcher(t, s)
				defer func() { _ = replacement.Stop() }() // teardown only; the stack stops it again
			}
		}
		err := stream.Err()
		if err == nil {
			t.Fatalf("an interrupted stream ended without an error after %d chunks", chunks)
		}
		if ctx.Err() != nil {
			t.Fatalf("the client hung until its deadline: %v", err)
		}
		t.Logf("stream ended after %d chunks with: %v", chunks, err)
	})
}

func TestQueuedRequestsSurviveANATSRestart(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), func(c *dataplanetest.StackConfig) {
		c.Queue = func(q *natsqueue.ClientConfig) { q.StallTimeout = 30 * time.Second }
	})
	// Provision, then leave the queue without a consumer running.
	if err := dispatcherStop(t, s); err != nil {
		t.Fatal(err)
	}
	client := clientFor(s.Gateway.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const n = 10
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := client.Chat.Completions.New(ctx, chat(fmt.Sprint("queued ", i)))
			errs <- err
		}()
	}
	eventually(t, 10*time.Second, holds("all requests to be queued", func() bool {
		return streamMsgs(s) == n
	}))
	if err := s.RestartNATS(); err != nil {
		t.Fatal(err)
	}
	if got := streamMsgs(s); got != n {
		t.Fatalf("after the restart the stream holds %d requests, want %d", got, n)
	}
	d := dispatcher(t, s)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("queued request failed: %v", err)
		}
	}
	// Attempts that started before the gateway had resubscribed are run
	// again; the clients see each answer once.
	t.Logf("engine ran %d attempts for %d requests", s.Engine.Requests.Load(), n)

	// A running dispatcher and gateway ride through a restart too.
	if err := s.RestartNATS(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holds("the dispatcher to reconnect", d.Ready))
	if _, err := client.Chat.Completions.New(ctx, chat("after the second restart")); err != nil {
		t.Fatalf("request after a restart: %v", err)
	}
}

func TestUnknownModelIsAnOpenAIError(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), nil)
	dispatcher(t, s)
	client := clientFor(s.Gateway.URL)
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "nope", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("err = %v, want a 404 OpenAI error", err)
	}
}

func dispatcherStop(t *testing.T, s *dataplanetest.Stack) error {
	t.Helper()
	return dispatcher(t, s).Stop()
}

func streamMsgs(s *dataplanetest.Stack) int {
	n, err := s.Queued(context.Background())
	if err != nil {
		return -1
	}
	return n
}
