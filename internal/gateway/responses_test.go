package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// newResponsesHarness is newHarness with an in-memory response store.
func newResponsesHarness(t *testing.T) *harness {
	t.Helper()
	cfg := testConfig()
	tokens := NewStaticTokens(NewTokenHasher(nil), map[string]*Principal{
		aliceToken: {Name: "alice"},
		bobToken:   {Name: "bob"},
	})
	logs := &syncBuffer{}
	q := &fakeQueue{engine: newEngine(engineOptions{chunkSize: 7})}
	g, err := New(cfg, q, Options{Tokens: tokens, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Responses: NewMemoryResponseStore()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return &harness{g: g, srv: srv, q: q, logs: logs}
}

// engineMessages are the chat messages of the last job sent to the engine.
func engineMessages(t *testing.T, h *harness) []chatMessage {
	t.Helper()
	job := h.q.lastJob(t)
	if job.Path != "/v1/chat/completions" {
		t.Fatalf("engine path %q, want /v1/chat/completions", job.Path)
	}
	var body struct {
		Messages []chatMessage `json:"messages"`
	}
	if err := json.Unmarshal(job.Body, &body); err != nil {
		t.Fatal(err)
	}
	return body.Messages
}

// TestResponsesWithSDK creates, continues, reads, lists and deletes stored
// responses with the official Go SDK, non-streamed and streamed.
func TestResponsesWithSDK(t *testing.T) {
	h := newResponsesHarness(t)
	ctx := context.Background()
	alice, bob := h.client(aliceToken), h.client(bobToken)
	answer := strings.Join(chatWords, "")

	first, err := alice.Responses.New(ctx, responses.ResponseNewParams{
		Model:        "llama-3-8b",
		Instructions: openai.String("Be brief."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("Hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if first.OutputText() != answer || first.Status != "completed" || !strings.HasPrefix(first.ID, "resp_") {
		t.Fatalf("response = %q, status %q, id %q", first.OutputText(), first.Status, first.ID)
	}
	if first.Usage.InputTokens != fakePromptTokens || first.Usage.OutputTokens != fakeCompletionTokens || first.Usage.TotalTokens != fakePromptTokens+fakeCompletionTokens {
		t.Errorf("usage = %+v", first.Usage)
	}
	if diff := cmp.Diff([]chatMessage{{"system", "Be brief."}, {"user", "Hi"}}, engineMessages(t, h)); diff != "" {
		t.Errorf("engine messages (-want +got):\n%s", diff)
	}

	// Continued, streamed: the conversation goes first, the instructions
	// do not carry over.
	stream := alice.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model:              "llama-3-8b",
		PreviousResponseID: openai.String(first.ID),
		Input:              responses.ResponseNewParamsInputUnion{OfString: openai.String("And again?")},
	})
	var types []string
	var deltas strings.Builder
	var second responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
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
	wantTypes := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for range chatWords {
		wantTypes = append(wantTypes, "response.output_text.delta")
	}
	wantTypes = append(wantTypes, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
	if diff := cmp.Diff(wantTypes, types); diff != "" {
		t.Errorf("event types (-want +got):\n%s", diff)
	}
	if deltas.String() != answer || second.OutputText() != answer || second.PreviousResponseID != first.ID {
		t.Errorf("streamed %q, completed %q (previous %q)", deltas.String(), second.OutputText(), second.PreviousResponseID)
	}
	if second.Usage.OutputTokens != fakeCompletionTokens {
		t.Errorf("streamed usage = %+v", second.Usage)
	}
	if diff := cmp.Diff([]chatMessage{{"user", "Hi"}, {"assistant", answer}, {"user", "And again?"}}, engineMessages(t, h)); diff != "" {
		t.Errorf("engine messages of the continuation (-want +got):\n%s", diff)
	}

	got, err := alice.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != answer {
		t.Fatalf("Get = %v, %v", got, err)
	}
	items, err := alice.Responses.InputItems.List(ctx, second.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc})
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, it := range items.Data {
		m := it.AsMessage()
		if len(m.Content) == 0 {
			t.Fatalf("item %+v has no content", it)
		}
		texts = append(texts, it.Role+": "+m.Content[0].Text)
	}
	if diff := cmp.Diff([]string{"user: Hi", "assistant: " + answer, "user: And again?"}, texts); diff != "" {
		t.Errorf("input items (-want +got):\n%s", diff)
	}

	// Another token cannot read, continue or delete it.
	var apiErr *openai.Error
	if _, err := bob.Responses.Get(ctx, second.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("bob's Get = %v, want 404", err)
	}
	_, err = bob.Responses.New(ctx, responses.ResponseNewParams{Model: "small", PreviousResponseID: openai.String(second.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "previous_response_id" {
		t.Errorf("bob continuing alice's response = %v, want 404 on previous_response_id", err)
	}
	if err := bob.Responses.Delete(ctx, second.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("bob's Delete = %v, want 404", err)
	}

	if err := alice.Responses.Delete(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Responses.Get(ctx, second.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("Get after Delete = %v, want 404", err)
	}

	// store: false keeps nothing.
	unstored, err := alice.Responses.New(ctx, responses.ResponseNewParams{Model: "llama-3-8b", Store: openai.Bool(false),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Responses.Get(ctx, unstored.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("Get of a store:false response = %v, want 404", err)
	}
}

// TestResponsesRefusesWhatItCannotServe checks that fields the gateway
// cannot honour get a 400 naming them, before anything is queued.
func TestResponsesRefusesWhatItCannotServe(t *testing.T) {
	h := newResponsesHarness(t)
	tests := []struct{ name, body, param string }{
		{"built-in tool", `{"model":"llama-3-8b","input":"Hi","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{"function tool", `{"model":"llama-3-8b","input":"Hi","tools":[{"type":"function","name":"f","parameters":{}}]}`, "tools[0]"},
		{"background", `{"model":"llama-3-8b","input":"Hi","background":true}`, "background"},
		{"reasoning", `{"model":"llama-3-8b","input":"Hi","reasoning":{"effort":"high"}}`, "reasoning"},
		{"unknown field", `{"model":"llama-3-8b","input":"Hi","frobnicate":1}`, "frobnicate"},
		{"no input", `{"model":"llama-3-8b"}`, "input"},
		{"function call output item", `{"model":"llama-3-8b","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`, "input[0].type"},
		{"image part", `{"model":"llama-3-8b","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}]}`, "input[0].content[0].type"},
		{"bad role", `{"model":"llama-3-8b","input":[{"role":"robot","content":"x"}]}`, "input[0].role"},
		{"auto truncation", `{"model":"llama-3-8b","input":"Hi","truncation":"auto"}`, "truncation"},
		{"max_output_tokens zero", `{"model":"llama-3-8b","input":"Hi","max_output_tokens":0}`, "max_output_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.q.submitted()
			resp, body := h.do(t, "POST", "/v1/responses", aliceToken, tt.body)
			var e errorBody
			if resp.StatusCode != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Error.Param == nil || *e.Error.Param != tt.param {
				t.Errorf("answer %d %s, want 400 naming %q", resp.StatusCode, body, tt.param)
			}
			if h.q.submitted() != before {
				t.Error("a refused request reached the queue")
			}
		})
	}
	// Neutral values of unsupported fields are accepted.
	resp, body := h.do(t, "POST", "/v1/responses", aliceToken, `{"model":"llama-3-8b","input":"Hi","tools":[],"include":[],"background":false,"reasoning":null}`)
	if resp.StatusCode != 200 {
		t.Errorf("neutral unsupported fields: %d %s", resp.StatusCode, body)
	}
	resp, body = h.do(t, "POST", "/v1/responses", aliceToken, `{"model":"llama-3-8b","input":"Hi","previous_response_id":"resp_nope"}`)
	if resp.StatusCode != 404 || !strings.Contains(body, `"param":"previous_response_id"`) {
		t.Errorf("unknown previous_response_id: %d %s", resp.StatusCode, body)
	}
	// Tokens count as for chat: the engine's usage, for the token's name.
	if got := testutil.ToFloat64(h.g.metrics.tokens.WithLabelValues("llama-3-8b", "alice", "completion")); got != fakeCompletionTokens {
		t.Errorf("completion tokens counted for alice = %v, want %d", got, fakeCompletionTokens)
	}
}

// flushRecorder records what was written before each flush.
type flushRecorder struct {
	header  http.Header
	status  int
	pending bytes.Buffer
	flushes []string
}

func (r *flushRecorder) Header() http.Header { return r.header }
func (r *flushRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *flushRecorder) Write(p []byte) (int, error) { return r.pending.Write(p) }
func (r *flushRecorder) Flush() {
	if r.pending.Len() > 0 {
		r.flushes = append(r.flushes, r.pending.String())
		r.pending.Reset()
	}
}

// A streamed response's opening events go to the client in one write with
// what of the answer is there, not one write each: each write is a
// wake-up of the client (and of every proxy between), before the first token.
func TestResponsesStreamOpensInOneWrite(t *testing.T) {
	h := newResponsesHarness(t)
	req := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(`{"model":"llama-3-8b","input":"Hi","stream":true}`))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	req.Header.Set("Content-Type", "application/json")
	rec := &flushRecorder{header: http.Header{}}
	h.g.Handler().ServeHTTP(rec, req)
	rec.Flush()
	if rec.status != http.StatusOK || len(rec.flushes) == 0 {
		t.Fatalf("status %d, %d flushes", rec.status, len(rec.flushes))
	}
	for _, typ := range []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"} {
		if !strings.Contains(rec.flushes[0], "event: "+typ+"\n") {
			t.Errorf("the first write lacks %s:\n%s", typ, rec.flushes[0])
		}
	}
	all := strings.Join(rec.flushes, "")
	if !strings.Contains(all, "event: response.completed\n") || strings.Count(all, "event: response.output_text.delta\n") != len(chatWords) {
		t.Errorf("the stream lacks its deltas or its end:\n%s", all)
	}
}
