package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/model-orchestra/operator/internal/queue"
)

const (
	aliceToken = "sk-alice-7f3c9a12d4e5b6a7"
	bobToken   = "sk-bob-only-small-0a1b2c3d"
)

func testConfig() Config {
	cfg := Default()
	cfg.Models = []ModelConfig{
		{Name: "llama-3-8b", App: "llama"},
		{Name: "small", App: "small-app", OwnedBy: "team-small"},
		{Name: "embed", App: "embedder"},
	}
	cfg.Limits.Default = Limits{}
	cfg.Server.DrainDelay.Duration = 0
	return cfg
}

// syncBuffer collects logs written from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type harness struct {
	g    *Gateway
	srv  *httptest.Server
	q    *fakeQueue
	logs *syncBuffer
}

// newHarness serves a gateway over a fake queue. alice may use every
// model; bob only "small". Limits come from cfg.Limits.Default.
func newHarness(t *testing.T, cfg Config, engine engineFunc) *harness {
	t.Helper()
	tokens := NewStaticTokens(NewTokenHasher(nil), map[string]*Principal{
		aliceToken: {Name: "alice", Limits: cfg.Limits.Default},
		bobToken:   {Name: "bob", Models: map[string]bool{"small": true}, Limits: cfg.Limits.Default},
	})
	return newHarnessWithTokens(t, cfg, engine, tokens)
}

func newHarnessWithTokens(t *testing.T, cfg Config, engine engineFunc, tokens TokenSource) *harness {
	t.Helper()
	logs := &syncBuffer{}
	q := &fakeQueue{engine: engine}
	g, err := New(cfg, q, Options{Tokens: tokens, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return &harness{g: g, srv: srv, q: q, logs: logs}
}

func (h *harness) client(token string) *openai.Client {
	c := openai.NewClient(
		option.WithBaseURL(h.srv.URL+"/v1/"),
		option.WithAPIKey(token),
		option.WithMaxRetries(0),
	)
	return &c
}

// do sends a raw request and returns the response and its whole body.
// answer is what the tests look at in a response whose body do has
// already read and closed.
type answer struct {
	StatusCode int
	Header     http.Header
}

func (h *harness) do(t *testing.T, method, path, token, body string) (*answer, string) {
	t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s %s: %v", method, path, err)
	}
	return &answer{StatusCode: resp.StatusCode, Header: resp.Header}, string(b)
}

const chatBody = `{"model":"llama-3-8b","messages":[{"role":"user","content":"Hi"}]}`

func TestChatCompletionWithSDK(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{chunkSize: 13}))
	c := h.client(aliceToken)
	res, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "llama-3-8b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
	})
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	if got, want := res.Choices[0].Message.Content, "Hello from the engine"; got != want {
		t.Errorf("content = %q, want %q", got, want)
	}
	if res.Usage.PromptTokens != fakePromptTokens || res.Usage.CompletionTokens != fakeCompletionTokens {
		t.Errorf("usage = %+v, want %d prompt and %d completion tokens", res.Usage, fakePromptTokens, fakeCompletionTokens)
	}

	job := h.q.lastJob(t)
	if job.App != "llama" || job.Path != "/v1/chat/completions" || job.Stream || job.ID == "" {
		t.Errorf("job = %+v, want app llama, chat path, not streaming, an id", job)
	}
	if !strings.Contains(res.ID, job.ID) {
		t.Errorf("answer id %q does not come from job %q", res.ID, job.ID)
	}
	eventually(t, 5*time.Second, metricEquals("requests_total{model=llama-3-8b,endpoint=chat,code=200}", h.g.metrics.requests.WithLabelValues("llama-3-8b", "chat", "200", "queue"), 1))
	eventually(t, 5*time.Second, metricEquals("tokens_total{kind=completion}", h.g.metrics.tokens.WithLabelValues("llama-3-8b", "alice", "completion"), fakeCompletionTokens))
	eventually(t, 5*time.Second, holds("the reply to be closed", h.q.lastReply(t).closed.Load))
}

func TestNonStreamingBodyIsPassedUnchanged(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	body := `{"model":"llama-3-8b","messages":[{"role":"user","content":"Hi"}],"temperature":0.2,"x_extra":{"a":[1,2]}}`
	resp, got := h.do(t, "POST", "/v1/chat/completions", aliceToken, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if job := h.q.lastJob(t); string(job.Body) != body {
		t.Errorf("engine got body %s, want the client's %s", job.Body, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if resp.Header.Get("X-Request-Id") != h.q.lastJob(t).ID {
		t.Errorf("X-Request-Id %q is not the job id %q", resp.Header.Get("X-Request-Id"), h.q.lastJob(t).ID)
	}
}

func TestChatStreamWithSDK(t *testing.T) {
	for _, includeUsage := range []bool{false, true} {
		t.Run(map[bool]string{false: "without usage", true: "with usage"}[includeUsage], func(t *testing.T) {
			h := newHarness(t, testConfig(), newEngine(engineOptions{chunkSize: 7}))
			params := openai.ChatCompletionNewParams{
				Model:    "llama-3-8b",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
			}
			if includeUsage {
				params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			}
			stream := h.client(aliceToken).Chat.Completions.NewStreaming(context.Background(), params)
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				acc.AddChunk(stream.Current())
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if got, want := acc.Choices[0].Message.Content, "Hello from the engine"; got != want {
				t.Errorf("content = %q, want %q", got, want)
			}
			wantChunks := 1 + len(chatWords) + 1
			if includeUsage {
				wantChunks++
				if acc.Usage.TotalTokens != fakePromptTokens+fakeCompletionTokens {
					t.Errorf("usage = %+v, want %d total tokens", acc.Usage, fakePromptTokens+fakeCompletionTokens)
				}
			} else if acc.Usage.TotalTokens != 0 {
				t.Errorf("got usage %+v though the client did not ask for it", acc.Usage)
			}
			if chunks != wantChunks {
				t.Errorf("got %d chunks, want %d", chunks, wantChunks)
			}
			// The engine is always asked for usage, so that tokens count.
			job := h.q.lastJob(t)
			var sent struct {
				Stream        bool `json:"stream"`
				StreamOptions struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			if err := json.Unmarshal(job.Body, &sent); err != nil || !sent.Stream || !sent.StreamOptions.IncludeUsage || !job.Stream {
				t.Errorf("engine body %s (job.Stream=%v): want stream with include_usage", job.Body, job.Stream)
			}
			eventually(t, 5*time.Second, metricEquals("tokens_total{kind=prompt}", h.g.metrics.tokens.WithLabelValues("llama-3-8b", "alice", "prompt"), fakePromptTokens))
			if testutil.CollectAndCount(h.g.metrics.ttft) != 1 {
				t.Error("no time to first token was recorded")
			}
		})
	}
}

func TestStreamExactFormat(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{chunkSize: 5}))
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken,
		`{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"Hi"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
		t.Errorf("Content-Type = %q", ct)
	}
	job := h.q.lastJob(t)
	// Exactly the engine's events, minus the usage chunk nobody asked for.
	want := strings.Join(streamEvents(job, "llama-3-8b", false, ""), "")
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Error("stream does not end with data: [DONE]")
	}
}

func TestCompletionsAndEmbeddingsWithSDK(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	c := h.client(aliceToken)
	ctx := context.Background()

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:  "small",
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3}},
	})
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if comp.Choices[0].Text != "Hello from the engine" {
		t.Errorf("completion text = %q", comp.Choices[0].Text)
	}
	if job := h.q.lastJob(t); job.App != "small-app" || job.Path != "/v1/completions" {
		t.Errorf("completion job = %+v", job)
	}

	stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:  "small",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say hello")},
	})
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := stream.Err(); err != nil || text.String() != "Hello from the engine" {
		t.Errorf("streamed completion = %q, %v", text.String(), err)
	}

	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model:          "embed",
		Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", "b"}},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
	})
	if err != nil {
		t.Fatalf("embeddings: %v", err)
	}
	if diff := cmp.Diff([]float64{0.25, -0.5, 1}, emb.Data[0].Embedding); diff != "" {
		t.Errorf("embedding (-want +got):\n%s", diff)
	}
	if job := h.q.lastJob(t); job.App != "embedder" || job.Path != "/v1/embeddings" || job.Stream {
		t.Errorf("embedding job = %+v", job)
	}
}

func TestModelsWithSDK(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	ctx := context.Background()
	ids := func(token string) []string {
		page, err := h.client(token).Models.List(ctx)
		if err != nil {
			t.Fatalf("list models: %v", err)
		}
		var out []string
		for _, m := range page.Data {
			out = append(out, m.ID)
			if m.Object != "model" || m.Created != h.g.created || m.OwnedBy == "" {
				t.Errorf("model %+v lacks object, created or owned_by", m)
			}
		}
		return out
	}
	if diff := cmp.Diff([]string{"llama-3-8b", "small", "embed"}, ids(aliceToken)); diff != "" {
		t.Errorf("alice's models (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"small"}, ids(bobToken)); diff != "" {
		t.Errorf("bob's models (-want +got):\n%s", diff)
	}
	m, err := h.client(bobToken).Models.Get(ctx, "small")
	if err != nil || m.ID != "small" || m.OwnedBy != "team-small" {
		t.Errorf("get small = %+v, %v", m, err)
	}
	resp, body := h.do(t, "GET", "/v1/models/llama-3-8b", bobToken, "")
	wantError(t, resp, body, http.StatusNotFound,
		`{"error":{"message":"The model `+"`llama-3-8b`"+` does not exist or you do not have access to it.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`)
}

// waitMetric waits for a counter or gauge to reach want: the handler
// records a request just after the client received its answer.
// wantError checks an error answer's status and exact body.
func wantError(t *testing.T, resp *answer, body string, status int, want string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status = %d, want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if diff := cmp.Diff(want, strings.TrimSuffix(body, "\n")); diff != "" {
		t.Errorf("error body (-want +got):\n%s", diff)
	}
}

func TestRequestErrors(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.MaxBodyBytes = 1024
	h := newHarness(t, cfg, newEngine(engineOptions{}))
	notFound := func(model string) string {
		return `{"error":{"message":"The model ` + "`" + model + "`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
	}
	tests := []struct {
		name, method, path, token, body string
		status                          int
		want                            string
	}{{
		name: "missing token", method: "POST", path: "/v1/chat/completions", body: chatBody,
		status: 401,
		want:   `{"error":{"message":"You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).","type":"invalid_request_error","param":null,"code":"missing_api_key"}}`,
	}, {
		name: "invalid token", method: "POST", path: "/v1/chat/completions", token: "sk-wrong", body: chatBody,
		status: 401,
		want:   `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
	}, {
		name: "invalid token listing models", method: "GET", path: "/v1/models", token: "sk-wrong",
		status: 401,
		want:   `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
	}, {
		name: "unknown model", method: "POST", path: "/v1/chat/completions", token: aliceToken,
		body:   `{"model":"gpt-9","messages":[{"role":"user","content":"Hi"}]}`,
		status: 404, want: notFound("gpt-9"),
	}, {
		name: "model the token may not use", method: "POST", path: "/v1/chat/completions", token: bobToken,
		body:   chatBody,
		status: 404, want: notFound("llama-3-8b"),
	}, {
		name: "body is not JSON", method: "POST", path: "/v1/chat/completions", token: aliceToken, body: `{"model":`,
		status: 400,
		want:   `{"error":{"message":"We could not parse the JSON body of your request. The body must be a JSON object (see the OpenAI API reference for /v1/chat/completions).","type":"invalid_request_error","param":null,"code":null}}`,
	}, {
		name: "model missing", method: "POST", path: "/v1/chat/completions", token: aliceToken,
		body:   `{"messages":[{"role":"user","content":"Hi"}]}`,
		status: 400,
		want:   `{"error":{"message":"You must provide a model parameter.","type":"invalid_request_error","param":"model","code":null}}`,
	}, {
		name: "messages empty", method: "POST", path: "/v1/chat/completions", token: aliceToken,
		body:   `{"model":"llama-3-8b","messages":[]}`,
		status: 400,
		want:   `{"error":{"message":"Invalid 'messages': empty array. Expected an array with minimum length 1.","type":"invalid_request_error","param":"messages","code":null}}`,
	}, {
		name: "bad role", method: "POST", path: "/v1/chat/completions", token: aliceToken,
		body:   `{"model":"llama-3-8b","messages":[{"role":"robot","content":"Hi"}]}`,
		status: 400,
		want:   `{"error":{"message":"Invalid value for 'messages[0].role': \"robot\" is not one of system, developer, user, assistant, tool, function.","type":"invalid_request_error","param":"messages[0].role","code":null}}`,
	}, {
		name: "stream_options without stream", method: "POST", path: "/v1/chat/completions", token: aliceToken,
		body:   `{"model":"llama-3-8b","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}`,
		status: 400,
		want:   `{"error":{"message":"The 'stream_options' parameter is only allowed when 'stream' is enabled.","type":"invalid_request_error","param":"stream_options","code":null}}`,
	}, {
		name: "prompt missing", method: "POST", path: "/v1/completions", token: aliceToken,
		body:   `{"model":"small"}`,
		status: 400,
		want:   `{"error":{"message":"You must provide a prompt parameter.","type":"invalid_request_error","param":"prompt","code":null}}`,
	}, {
		name: "embedding input of mixed types", method: "POST", path: "/v1/embeddings", token: aliceToken,
		body:   `{"model":"embed","input":["a",1]}`,
		status: 400,
		want:   `{"error":{"message":"Invalid 'input': all items must have the same type.","type":"invalid_request_error","param":"input","code":null}}`,
	}, {
		name: "body too large", method: "POST", path: "/v1/chat/completions", token: aliceToken,
		body:   `{"model":"llama-3-8b","messages":[{"role":"user","content":"` + strings.Repeat("x", 1100) + `"}]}`,
		status: 413,
		want:   `{"error":{"message":"The request body is larger than the limit of 1024 bytes.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`,
	}, {
		name: "unknown path", method: "POST", path: "/v1/images/generations", token: aliceToken, body: `{}`,
		status: 404,
		want:   `{"error":{"message":"Invalid URL (POST /v1/images/generations)","type":"invalid_request_error","param":null,"code":null}}`,
	}, {
		name: "wrong method", method: "GET", path: "/v1/chat/completions", token: aliceToken,
		status: 404,
		want:   `{"error":{"message":"Invalid URL (GET /v1/chat/completions)","type":"invalid_request_error","param":null,"code":null}}`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.q.submitted()
			resp, body := h.do(t, tt.method, tt.path, tt.token, tt.body)
			wantError(t, resp, body, tt.status, tt.want)
			if h.q.submitted() != before {
				t.Error("a refused request reached the queue")
			}
		})
	}
	eventually(t, 5*time.Second, metricEquals("rejections_total{reason=unauthenticated}", h.g.metrics.rejections.WithLabelValues(reasonUnauthenticated), 3))
	eventually(t, 5*time.Second, metricEquals("rejections_total{reason=model_forbidden}", h.g.metrics.rejections.WithLabelValues(reasonModelForbidden), 1))
	if strings.Contains(h.logs.String(), aliceToken) || strings.Contains(h.logs.String(), "sk-wrong") {
		t.Error("a token was logged")
	}
}

func TestBodyTooLargeWithoutContentLength(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.MaxBodyBytes = 64
	h := newHarness(t, cfg, newEngine(engineOptions{}))
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(chatBody + strings.Repeat(" ", 100)))
		_ = pw.Close()
	}()
	req, _ := http.NewRequest("POST", h.srv.URL+"/v1/chat/completions", pr)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	wantError(t, &answer{StatusCode: resp.StatusCode, Header: resp.Header}, string(body), 413,
		`{"error":{"message":"The request body is larger than the limit of 64 bytes.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`)
}

func TestAnonymousMode(t *testing.T) {
	cfg := testConfig()
	cfg.Auth.Anonymous = true
	cfg.Auth.SecretSelector = ""
	h := newHarnessWithTokens(t, cfg, newEngine(engineOptions{}), nil)
	if resp, body := h.do(t, "POST", "/v1/chat/completions", "", chatBody); resp.StatusCode != 200 {
		t.Errorf("anonymous request: %d %s", resp.StatusCode, body)
	}
	if resp, body := h.do(t, "POST", "/v1/chat/completions", "sk-unknown", chatBody); resp.StatusCode != 200 {
		t.Errorf("anonymous request with a token: %d %s", resp.StatusCode, body)
	}
}

func TestQueueErrors(t *testing.T) {
	tests := []struct {
		name      string
		submitErr error
		engine    engineFunc
		timeout   time.Duration
		status    int
		want      string
	}{{
		name: "queue unavailable", submitErr: fmt.Errorf("publishing: %w", queue.ErrUnavailable),
		status: 503,
		want:   `{"error":{"message":"The request queue is unavailable; retry the request.","type":"server_error","param":null,"code":"service_unavailable"}}`,
	}, {
		name: "dead-lettered",
		engine: func(context.Context, queue.Job, func(queue.Chunk) bool) error {
			return queue.ErrDeadLettered
		},
		status: 502,
		want:   `{"error":{"message":"The model server failed to complete the request after repeated attempts.","type":"server_error","param":null,"code":"request_dead_lettered"}}`,
	}, {
		name: "retried after partial, before any output reached the client",
		engine: func(_ context.Context, _ queue.Job, send func(queue.Chunk) bool) error {
			send(queue.Chunk{Status: 200, Data: []byte(`{"id":`)})
			return queue.ErrRetriedAfterPartial
		},
		status: 502,
		want:   `{"error":{"message":"The model server was interrupted after part of the answer was sent; the answer cannot be completed. Retry the request.","type":"server_error","param":null,"code":"stream_interrupted"}}`,
	}, {
		name: "timeout",
		engine: func(ctx context.Context, _ queue.Job, _ func(queue.Chunk) bool) error {
			<-ctx.Done()
			return ctx.Err()
		},
		timeout: 50 * time.Millisecond,
		status:  504,
		want:    `{"error":{"message":"The request timed out before the model server finished answering.","type":"server_error","param":null,"code":"timeout"}}`,
	}, {
		name:   "empty reply",
		engine: func(context.Context, queue.Job, func(queue.Chunk) bool) error { return nil },
		status: 502,
		want:   `{"error":{"message":"The model server sent an empty answer.","type":"server_error","param":null,"code":"empty_reply"}}`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			if tt.timeout > 0 {
				cfg.Timeouts.Request.Duration = tt.timeout
			}
			h := newHarness(t, cfg, tt.engine)
			h.q.submitErr = tt.submitErr
			resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
			wantError(t, resp, body, tt.status, tt.want)
			if tt.status == 503 && resp.Header.Get("Retry-After") != "1" {
				t.Errorf("Retry-After = %q, want 1", resp.Header.Get("Retry-After"))
			}
		})
	}
}

func TestEngineErrorIsPassedOn(t *testing.T) {
	engineErr := `{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}`
	h := newHarness(t, testConfig(), func(_ context.Context, _ queue.Job, send func(queue.Chunk) bool) error {
		send(queue.Chunk{Status: 400, Header: http.Header{"Content-Type": {"application/json"}}, Data: []byte(engineErr)})
		return nil
	})
	for _, body := range []string{chatBody, `{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"Hi"}]}`} {
		resp, got := h.do(t, "POST", "/v1/chat/completions", aliceToken, body)
		if resp.StatusCode != 400 || got != engineErr {
			t.Errorf("engine error answered as %d %s, want 400 %s", resp.StatusCode, got, engineErr)
		}
	}
}

func TestErrorMidStream(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{failAfter: queue.ErrRetriedAfterPartial}))
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken,
		`{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"Hi"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	last := events[len(events)-1]
	want := `data: {"error":{"message":"The model server was interrupted after part of the answer was sent; the answer cannot be completed. Retry the request.","type":"server_error","param":null,"code":"stream_interrupted"}}`
	if last != want || len(events) != 3 {
		t.Errorf("stream = %q, want 2 content events then %q", body, want)
	}
	if strings.Contains(body, "[DONE]") {
		t.Error("a failed stream ended with [DONE]")
	}

	// The SDK reports it as an error.
	stream := h.client(aliceToken).Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: "llama-3-8b", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
	})
	for stream.Next() {
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "stream_interrupted") {
		t.Errorf("SDK stream error = %v, want one about stream_interrupted", err)
	}
	eventually(t, 5*time.Second, metricEquals("requests_total{code=502}", h.g.metrics.requests.WithLabelValues("llama-3-8b", "chat", "502", "queue"), 2))
}

func TestClientDisconnectCancelsReply(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	h := newHarness(t, testConfig(), newEngine(engineOptions{hold: hold}))
	ctx, cancel := context.WithCancel(context.Background())
	stream := h.client(aliceToken).Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "llama-3-8b", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
	})
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	reply := h.q.lastReply(t)
	if reply.closed.Load() {
		t.Fatal("reply closed while the client is still reading")
	}
	cancel()
	eventually(t, 5*time.Second, holds("the reply to be closed", reply.closed.Load))
	select {
	case <-reply.engineCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the engine's request was not cancelled")
	}
	if reply.complete.Load() {
		t.Error("reply completed although the client left")
	}
	eventually(t, 5*time.Second, metricEquals("requests_total{code=499}", h.g.metrics.requests.WithLabelValues("llama-3-8b", "chat", "499", "queue"), 1))
}

func TestAccessLog(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	eventually(t, 5*time.Second, holds("the access log line", func() bool { return strings.Contains(h.logs.String(), "\n") }))
	var line map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(h.logs.String())), &line); err != nil {
		t.Fatalf("access log is not one JSON line: %v\n%s", err, h.logs.String())
	}
	for key, want := range map[string]any{
		"msg": "request", "status": float64(200), "model": "llama-3-8b", "app": "llama",
		"consumer": "alice", "stream": false, "prompt_tokens": float64(fakePromptTokens),
		"request_id": h.q.lastJob(t).ID, "path": "/v1/chat/completions",
	} {
		if line[key] != want {
			t.Errorf("access log %s = %v, want %v", key, line[key], want)
		}
	}
	if strings.Contains(h.logs.String(), aliceToken) {
		t.Error("the token was logged")
	}
}

func TestHealthAndMetricsEndpoints(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	ops := httptest.NewServer(h.g.OpsHandler())
	defer ops.Close()
	h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	eventually(t, 5*time.Second, metricEquals("requests_total", h.g.metrics.requests.WithLabelValues("llama-3-8b", "chat", "200", "queue"), 1))
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, base := range []string{h.srv.URL, ops.URL} {
		if code, _ := get(base + "/healthz"); code != 200 {
			t.Errorf("%s/healthz = %d", base, code)
		}
		if code, _ := get(base + "/readyz"); code != 200 {
			t.Errorf("%s/readyz = %d", base, code)
		}
	}
	code, metrics := get(ops.URL + "/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`orchestra_gateway_requests_total{code="200",endpoint="chat",lane="queue",model="llama-3-8b"} 1`,
		`orchestra_gateway_request_duration_seconds_count{endpoint="chat",model="llama-3-8b",stream="false"} 1`,
		`orchestra_gateway_tokens_total{consumer="alice",kind="prompt",model="llama-3-8b"} 7`,
		`orchestra_gateway_rejections_total{reason="requests_per_minute"} 0`,
		`orchestra_gateway_in_flight_requests{endpoint="chat",stream="false"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestReadyzWaitsForQueueAndTokens(t *testing.T) {
	q := &pingQueue{fakeQueue: fakeQueue{engine: newEngine(engineOptions{})}, err: errors.New("no route to NATS")}
	tokens := &unsyncedTokens{}
	g, err := New(testConfig(), q, Options{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		g.OpsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := readyz(); code != 503 || body != "api tokens not loaded yet\n" {
		t.Errorf("readyz before tokens load = %d %q", code, body)
	}
	tokens.synced = true
	if code, body := readyz(); code != 503 || body != "queue unreachable: no route to NATS\n" {
		t.Errorf("readyz with the queue down = %d %q", code, body)
	}
	q.err = nil
	if code, body := readyz(); code != 200 {
		t.Errorf("readyz = %d %q, want 200", code, body)
	}
}

type pingQueue struct {
	fakeQueue
	err error
}

func (q *pingQueue) Ping(context.Context) error { return q.err }

type unsyncedTokens struct{ synced bool }

func (u *unsyncedTokens) Authenticate(string) (*Principal, bool) { return nil, false }
func (u *unsyncedTokens) HasSynced() bool                        { return u.synced }
