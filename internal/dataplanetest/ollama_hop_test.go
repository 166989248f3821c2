package dataplanetest_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/ollamatest"
	"github.com/model-orchestra/operator/internal/ssetest"
)

var (
	ollamaHopBench   = flag.Bool("ollama-hop-bench", false, "measure first token and tokens/s of a real Ollama process direct, through a plain reverse proxy and through gateway + JetStream + dispatcher (make bench-dataplane-ollama)")
	ollamaHopPairs   = flag.Int("ollama-hop-requests", 40, "requests per path of the Ollama hop benchmark")
	ollamaHopProfile = flag.String("ollama-hop-profile", "", "write a CPU profile of the process over the requests through the queue to this file")
	ollamaHopDocs    = flag.String("ollama-hop-docs", "", "Markdown file whose bench-dataplane-ollama section receives the table")
)

// TestOllamaHopBenchmark measures what each hop adds to a real engine's
// stream on this machine: one `ollama serve` process with the generated
// tiny model, asked for 64 streamed tokens straight, through a plain
// reverse proxy (httputil.ReverseProxy flushing every write: the floor of
// one more process hop), and through the gateway, JetStream and one
// dispatcher, the three interleaved in rotated order. Every request has a
// prompt of its own of the same length, so that no path gains from the
// engine's prompt cache.
func TestOllamaHopBenchmark(t *testing.T) {
	if !*ollamaHopBench {
		t.Skip("a benchmark: make bench-dataplane-ollama runs it (-ollama-hop-bench)")
	}
	srv := ollamatest.Start(t)
	var model bytes.Buffer
	if _, err := modelgen.Write(&model, modelgen.Tiny()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := srv.Create(ctx, "tiny", model.Bytes()); err != nil {
		t.Fatal(err)
	}
	simCfg := dataplanetest.FastSim()
	simCfg.Model = "tiny"
	target, _ := url.Parse(srv.URL)
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
	})
	defer proxy.Close()
	paths := []struct{ name, url, key string }{
		{"direct to Ollama", srv.URL + "/v1/chat/completions", ""},
		{"plain reverse proxy", proxy.URL + "/v1/chat/completions", ""},
	}
	stack, err := dataplanetest.StartStack(dataplanetest.StackConfig{Sim: simCfg, Dispatcher: func(c *dispatch.Config) {
		c.Apps[0].Endpoints = []string{srv.URL}
		c.Apps[0].MaxConcurrency = 1
		c.Health.Path = "/api/version"
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Close()
	if _, err := stack.StartDispatcher(); err != nil {
		t.Fatal(err)
	}
	paths = append(paths, struct{ name, url, key string }{"gateway + JetStream + dispatcher", stack.Gateway.URL + "/v1/chat/completions", dataplanetest.APIKey})

	type result struct {
		ttft []time.Duration
		rate []float64
	}
	results := make([]result, len(paths))
	// Warm every path (connections, the model loaded).
	for i, p := range paths {
		if _, _, err := streamOnce(ctx, p.url, p.key, fmt.Sprintf("warm %d", i)); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
	load := loadAvg()
	for n := range *ollamaHopPairs {
		for k := range paths {
			i := (n + k) % len(paths)
			p := paths[i]
			ttft, rate, err := streamOnce(ctx, p.url, p.key, fmt.Sprintf("request %03d via %d", n, i))
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			results[i].ttft = append(results[i].ttft, ttft)
			if rate > 0 {
				results[i].rate = append(results[i].rate, rate)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make bench-dataplane-ollama`: Ollama %s (`ollama serve`, CPU) with the generated tiny model, 64 streamed tokens a request, %d requests a path interleaved in rotated order, each with a prompt of its own; gateway, NATS with file-backed JetStream, dispatcher, proxy and client in one process; load average %s before, %s after.\n\n",
		ollamatest.Version, *ollamaHopPairs, load, loadAvg())
	b.WriteString("| Path | first token p50 | added to first token | tokens/s p50 | of direct |\n| --- | ---: | ---: | ---: | ---: |\n")
	d50, dr := pct(results[0].ttft, 0.5), median(results[0].rate)
	for i, p := range paths {
		t50, r := pct(results[i].ttft, 0.5), median(results[i].rate)
		fmt.Fprintf(&b, "| %s | %.2f ms | %.2f ms | %.0f | %.2f |\n", p.name, msOf(t50), msOf(t50-d50), r, r/dr)
	}
	t.Log("\n" + b.String())
	if *ollamaHopProfile != "" {
		// Profiled apart from the measurement: the gateway path only.
		stop := profileCPU(t, *ollamaHopProfile)
		for n := range *ollamaHopPairs {
			if _, _, err := streamOnce(ctx, paths[len(paths)-1].url, paths[len(paths)-1].key, fmt.Sprintf("profile %03d", n)); err != nil {
				t.Fatal(err)
			}
		}
		stop()
	}
	if *ollamaHopDocs != "" {
		if err := writeMarked(*ollamaHopDocs, "bench-dataplane-ollama", b.String()); err != nil {
			t.Fatal(err)
		}
	}
}

// profileCPU profiles the process into path until the returned function is
// called.
func profileCPU(t *testing.T, path string) func() {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// streamOnce sends one streamed chat of 64 tokens (see streamAttempt), and
// asks again with the prompt's last character changed, the same length,
// when the answer had no content: the generated model's weights are
// random, and now and then a prompt draws the end token first.
func streamOnce(ctx context.Context, url, key, prompt string) (time.Duration, float64, error) {
	var err error
	for k := range 5 {
		p := prompt
		if k > 0 {
			p = prompt[:len(prompt)-1] + string(rune('a'+k))
		}
		var first time.Duration
		var rate float64
		if first, rate, err = streamAttempt(ctx, url, key, p); !errors.Is(err, errNoContent) {
			return first, rate, err
		}
	}
	return 0, 0, err
}

var errNoContent = errors.New("no content before [DONE]")

// streamAttempt sends one streamed chat of 64 tokens and returns the time
// to its first non-empty content and its tokens per second after the first
// (ssetest.Result.TokensPerSecond).
func streamAttempt(ctx context.Context, url, key, prompt string) (time.Duration, float64, error) {
	sent, res, err := ssetest.Post(ctx, url, key, nil, map[string]any{
		"model": "tiny", "stream": true, "max_tokens": 64, "stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	}, nil)
	if err != nil {
		return 0, 0, err
	}
	if res.FirstContent.IsZero() {
		return 0, 0, errNoContent
	}
	return res.FirstContent.Sub(sent), res.TokensPerSecond(), nil
}
