package ollamatest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/ollamatest"
	"github.com/model-orchestra/operator/internal/ssetest"
)

func tinyModel(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := modelgen.Write(&b, modelgen.Tiny()); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func post(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// TestRealOllamaServesTheGeneratedModel is the generator's proof: the real
// engine loads the tiny model, recognises its chat template as ChatML, and
// answers through its native and OpenAI APIs, streamed and not.
func TestRealOllamaServesTheGeneratedModel(t *testing.T) {
	s := ollamatest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Create(ctx, "tiny", tinyModel(t)); err != nil {
		t.Fatal(err)
	}

	// The template Ollama derived from tokenizer.chat_template.
	var show struct {
		Template string `json:"template"`
		Details  struct {
			Family            string `json:"family"`
			QuantizationLevel string `json:"quantization_level"`
		} `json:"details"`
		ModelInfo map[string]any `json:"model_info"`
	}
	resp := post(t, s.URL+"/api/show", map[string]any{"model": "tiny"}) //nolint:bodyclose // post closes it at cleanup
	if err := json.NewDecoder(resp.Body).Decode(&show); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/api/show: %d %v", resp.StatusCode, err)
	}
	if !strings.Contains(show.Template, "<|im_start|>") || show.Details.Family != "llama" || show.Details.QuantizationLevel != "F16" {
		t.Errorf("/api/show: template %q, family %q, quantization %q; want ChatML, llama, F16", show.Template, show.Details.Family, show.Details.QuantizationLevel)
	}
	if n, _ := show.ModelInfo["general.parameter_count"].(float64); uint64(n) != modelgen.Tiny().Parameters() {
		t.Errorf("Ollama counts %v parameters, the generator %d", show.ModelInfo["general.parameter_count"], modelgen.Tiny().Parameters())
	}

	// Native chat, not streamed: content and token counts.
	var chat struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Done            bool `json:"done"`
		PromptEvalCount int  `json:"prompt_eval_count"`
		EvalCount       int  `json:"eval_count"`
	}
	resp = post(t, s.URL+"/api/chat", map[string]any{ //nolint:bodyclose // post closes it at cleanup
		"model": "tiny", "stream": false,
		"messages": []map[string]string{{"role": "user", "content": "Tell me about the orchestra."}},
		"options":  map[string]any{"num_predict": 16, "seed": 1, "temperature": 0},
	})
	if err := json.NewDecoder(resp.Body).Decode(&chat); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/api/chat: %d %v", resp.StatusCode, err)
	}
	if !chat.Done || chat.EvalCount == 0 || chat.PromptEvalCount == 0 {
		t.Errorf("/api/chat: %+v; want done with prompt and generated tokens counted", chat)
	}

	// OpenAI-compatible, streamed, with usage: chunks, usage, [DONE].
	resp = post(t, s.URL+"/v1/chat/completions", map[string]any{ //nolint:bodyclose // post closes it at cleanup
		"model": "tiny", "stream": true, "max_tokens": 16, "seed": 1,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": "Hello"}},
	})
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/chat/completions: %d", resp.StatusCode)
	}
	res, err := ssetest.Read(resp.Body, nil)
	if err != nil || res.Chunks == 0 || res.Usage == nil || res.Usage.CompletionTokens == 0 {
		t.Errorf("streamed chat: %+v, %v; want content chunks, completion tokens in usage and [DONE]", res, err)
	}
}
