package sim_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// cachedTokens posts a chat request and returns its usage.
func chatUsage(t *testing.T, url string, messages ...map[string]string) (prompt, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": messages, "max_tokens": 2})
	res, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	raw, _ := io.ReadAll(res.Body)
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, %v: %s", res.StatusCode, err, raw)
	}
	if out.Usage.PromptTokensDetails == nil {
		t.Fatalf("usage without prompt_tokens_details: %s", raw)
	}
	return out.Usage.PromptTokens, out.Usage.PromptTokensDetails.CachedTokens
}

func TestPrefixCacheReportsCachedTokens(t *testing.T) {
	srv, _ := start(t, fastConfig())
	system := map[string]string{"role": "system", "content": strings.Repeat("be helpful and brief ", 40)} // 160 words
	p1, c1 := chatUsage(t, srv.URL, system, map[string]string{"role": "user", "content": "first question"})
	if c1 != 0 {
		t.Errorf("cold cache reported %d cached tokens", c1)
	}
	// The system message is 164 tokens with its template: 10 whole blocks.
	_, c2 := chatUsage(t, srv.URL, system, map[string]string{"role": "user", "content": "another question from someone else"})
	if c2 != 160 {
		t.Errorf("shared system prompt: %d cached tokens, want 160 (its whole 16-token blocks)", c2)
	}
	// The next turn of the first conversation reuses all of the first turn's whole blocks.
	p3, c3 := chatUsage(t, srv.URL, system, map[string]string{"role": "user", "content": "first question"},
		map[string]string{"role": "assistant", "content": "an answer"}, map[string]string{"role": "user", "content": "and then?"})
	if c3 != p1/16*16 || c3 >= p3 {
		t.Errorf("second turn: %d of %d cached, want %d (the first turn's whole blocks)", c3, p3, p1/16*16)
	}
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	metrics, _ := io.ReadAll(res.Body)
	for _, want := range []string{`vllm:prefix_cache_hits_total{model_name="sim-model"} ` + itoa(c2+c3), `vllm:prefix_cache_queries_total{model_name="sim-model"}`, `orchestra_sim_prefix_cache_tokens`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestPrefixCacheOff(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefixCache.Tokens = 0
	srv, _ := start(t, cfg)
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hello"}]}`
	for range 2 {
		res, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if strings.Contains(string(raw), "prompt_tokens_details") {
			t.Errorf("prefix cache off, yet the usage reports cached tokens: %s", raw)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
