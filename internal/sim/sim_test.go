package sim_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/model-orchestra/operator/internal/sim"
)

func fastConfig() sim.Config {
	cfg := sim.Default()
	cfg.TimeToFirstToken = 0
	cfg.InterTokenLatency = 0
	cfg.OutputTokens = 12
	return cfg
}

func start(t *testing.T, cfg sim.Config) (*httptest.Server, openai.Client) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	srv := httptest.NewServer(sim.New(cfg).Handler())
	t.Cleanup(srv.Close)
	return srv, openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
}

func chatParams(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(maxTokens)
	}
	return p
}

func TestChatCompletionIsDeterministicAndHonoursMaxTokens(t *testing.T) {
	_, client := start(t, fastConfig())
	ctx := context.Background()

	a, err := client.Chat.Completions.New(ctx, chatParams("hello there", 0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Chat.Completions.New(ctx, chatParams("hello there", 0))
	if err != nil {
		t.Fatal(err)
	}
	if a.Choices[0].Message.Content != b.Choices[0].Message.Content {
		t.Errorf("same request gave different answers:\n%q\n%q", a.Choices[0].Message.Content, b.Choices[0].Message.Content)
	}
	if a.ID == b.ID {
		t.Errorf("two completions share the id %q", a.ID)
	}
	if got := a.Choices[0].FinishReason; got != "stop" {
		t.Errorf("finish reason = %q, want stop", got)
	}
	if a.Usage.CompletionTokens != 12 || a.Usage.PromptTokens == 0 || a.Usage.TotalTokens != a.Usage.PromptTokens+12 {
		t.Errorf("usage = %+v, want 12 completion tokens and a consistent total", a.Usage)
	}

	other, err := client.Chat.Completions.New(ctx, chatParams("something else entirely", 0))
	if err != nil {
		t.Fatal(err)
	}
	if other.Choices[0].Message.Content == a.Choices[0].Message.Content {
		t.Error("different prompts gave the same answer")
	}

	short, err := client.Chat.Completions.New(ctx, chatParams("hello there", 5))
	if err != nil {
		t.Fatal(err)
	}
	if short.Usage.CompletionTokens != 5 || short.Choices[0].FinishReason != "length" {
		t.Errorf("max_tokens=5: usage %+v finish %q, want 5 tokens and length", short.Usage, short.Choices[0].FinishReason)
	}
	if !strings.HasPrefix(a.Choices[0].Message.Content, short.Choices[0].Message.Content) {
		t.Errorf("a shorter answer is not a prefix of the full one: %q vs %q", short.Choices[0].Message.Content, a.Choices[0].Message.Content)
	}
}

func TestChatStreamMatchesNonStreamed(t *testing.T) {
	_, client := start(t, fastConfig())
	ctx := context.Background()
	full, err := client.Chat.Completions.New(ctx, chatParams("stream me", 0))
	if err != nil {
		t.Fatal(err)
	}

	p := chatParams("stream me", 0)
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, p)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks != 1+12+1 {
		t.Errorf("got %d chunks, want role + 12 tokens + usage", chunks)
	}
	if got, want := acc.Choices[0].Message.Content, full.Choices[0].Message.Content; got != want {
		t.Errorf("streamed text %q, want %q", got, want)
	}
	if acc.Usage.CompletionTokens != 12 {
		t.Errorf("streamed usage = %+v, want 12 completion tokens", acc.Usage)
	}
}

func TestRawStreamFormat(t *testing.T) {
	srv, _ := start(t, fastConfig())
	body := `{"model":"sim-model","prompt":"hi","max_tokens":3,"stream":true}`
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
		t.Errorf("content type %q", ct)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not an SSE data line", line)
		}
		events = append(events, data)
	}
	if len(events) != 4 || events[3] != "[DONE]" {
		t.Fatalf("events = %q, want 3 tokens and [DONE]", events)
	}
	var last struct {
		Object  string `json:"object"`
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(events[2]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Object != "text_completion" || last.Choices[0].FinishReason == nil || *last.Choices[0].FinishReason != "length" {
		t.Errorf("last token chunk = %s", events[2])
	}
}

func TestCompletionsEmbeddingsAndModels(t *testing.T) {
	_, client := start(t, fastConfig())
	ctx := context.Background()

	c, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "sim-model",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(7),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.CompletionTokens != 7 || c.Choices[0].Text == "" {
		t.Errorf("completion = %+v", c)
	}

	e, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "sim-model",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", "b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Data) != 2 || len(e.Data[0].Embedding) != 384 {
		t.Fatalf("embeddings: %d vectors of %d", len(e.Data), len(e.Data[0].Embedding))
	}
	if cmp.Equal(e.Data[0].Embedding, e.Data[1].Embedding) {
		t.Error("different inputs have equal embeddings")
	}

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "sim-model" {
		t.Errorf("models = %+v", models.Data)
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: err = %v, want a 404 API error", err)
	}
}

func TestInjectedErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.ErrorRate = 1
	cfg.Faults.ErrorStatus = 503
	_, client := start(t, cfg)
	_, err := client.Chat.Completions.New(context.Background(), chatParams("x", 0))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Fatalf("err = %v, want a 503 API error", err)
	}
}

func TestCrashAbortsTheStreamAfterNTokens(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.CrashRate = 1
	cfg.Faults.CrashAfterTokens = 3
	_, client := start(t, cfg)
	stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams("x", 0))
	var content string
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			content += c.Delta.Content
		}
	}
	if stream.Err() == nil {
		t.Fatal("a crashed stream ended without an error")
	}
	if n := len(strings.Fields(content)); n != 3 {
		t.Errorf("received %d tokens before the crash, want 3 (%q)", n, content)
	}
}

func TestHangEndsWhenTheClientGoesAway(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.HangRate = 1
	_, client := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := client.Chat.Completions.New(ctx, chatParams("x", 0))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
}

func TestPacingAndMetrics(t *testing.T) {
	cfg := fastConfig()
	cfg.TimeToFirstToken = 40 * time.Millisecond
	cfg.InterTokenLatency = 5 * time.Millisecond
	cfg.OutputTokens = 5
	srv, client := start(t, cfg)
	began := time.Now()
	if _, err := client.Chat.Completions.New(context.Background(), chatParams("pace", 0)); err != nil {
		t.Fatal(err)
	}
	if took, min := time.Since(began), 40*time.Millisecond+4*5*time.Millisecond; took < min {
		t.Errorf("answer took %v, want at least TTFT + 4 ITL = %v", took, min)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	text, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`vllm:generation_tokens_total{model_name="sim-model"} 5`,
		`vllm:num_requests_running{model_name="sim-model"} 0`,
		`vllm:num_requests_waiting{model_name="sim-model"} 0`,
		`vllm:time_to_first_token_seconds_count{model_name="sim-model"} 1`,
		`vllm:request_success_total{finished_reason="stop",model_name="sim-model"} 1`,
		`vllm:prompt_tokens_total{model_name="sim-model"}`,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestValidate(t *testing.T) {
	cfg := sim.Default()
	cfg.Model = ""
	cfg.Faults.ErrorRate = 2
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "model") || !strings.Contains(err.Error(), "error rate") {
		t.Errorf("Validate() = %v, want both problems reported", err)
	}
	if err := sim.Default().Validate(); err != nil {
		t.Errorf("default config invalid: %v", err)
	}
}

func TestCrashWithExitStopsTheServer(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.CrashRate = 1
	cfg.Faults.CrashAfterTokens = 2
	cfg.Faults.CrashExits = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sim.Serve(context.Background(), ln, sim.New(cfg), slog.New(slog.DiscardHandler)) }()
	client := openai.NewClient(option.WithBaseURL("http://"+ln.Addr().String()+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	if _, err := client.Chat.Completions.New(context.Background(), chatParams("x", 0)); err == nil {
		t.Fatal("a crashing request succeeded")
	}
	select {
	case err := <-done:
		if !errors.Is(err, sim.ErrCrashed) {
			t.Fatalf("Serve returned %v, want ErrCrashed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server kept running after an injected crash")
	}
	if resp, err := http.Get("http://" + ln.Addr().String() + "/health"); err == nil {
		_ = resp.Body.Close()
		t.Error("the crashed server still answers")
	}
}
