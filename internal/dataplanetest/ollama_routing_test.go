package dataplanetest_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/ollamatest"
	"github.com/model-orchestra/operator/internal/ssetest"
)

var (
	ollamaRoutingBench = flag.Bool("ollama-routing-bench", false, "run the multi-turn routing benchmark against 2 real Ollama processes (make bench-routing)")
	ollamaRoutingDocs  = flag.String("ollama-routing-docs", "", "Markdown file whose bench-routing-ollama section receives the table")
	// ollamaConvs is how many conversations run at once: 12 over the 2
	// engines' 8 slots saturates them (the bench-routing-ollama table);
	// 6 leaves every conversation a slot (bench-routing-ollama-light).
	ollamaConvs  = flag.Int("ollama-routing-conversations", 12, "conversations of the Ollama routing benchmark (the engines have 8 slots)")
	ollamaRounds = flag.Int("ollama-routing-rounds", 2, "rounds of the Ollama routing benchmark (each routing once per round)")
	ollamaMarker = flag.String("ollama-routing-marker", "bench-routing-ollama", "the marked section of -ollama-routing-docs that receives the table")
)

// TestOllamaRoutingBenchmark runs multi-turn conversations with shared
// system prompts through the gateway and a dispatcher to 2 real Ollama
// processes (4 parallel slots each, the generated tiny model), routed
// least-loaded and by prefix, interleaved, and reports the engines' own
// prompt-cache reuse: Ollama's runner logs, per request, how many prompt
// tokens it took from a cache slot ("loading cache slot ... prompt=N
// used=M", OLLAMA_DEBUG=1). Its usage and prompt_eval_count report the whole
// prompt whatever it reused, so the log is where the effect shows.
func TestOllamaRoutingBenchmark(t *testing.T) {
	if !*ollamaRoutingBench {
		t.Skip("a benchmark: make bench-routing runs it (-ollama-routing-bench)")
	}
	t.Setenv("OLLAMA_NUM_PARALLEL", "4")
	t.Setenv("OLLAMA_DEBUG", "1")
	cfg := modelgen.Tiny()
	cfg.Context = 4096
	var model bytes.Buffer
	if _, err := modelgen.Write(&model, cfg); err != nil {
		t.Fatal(err)
	}
	type row struct {
		name       string
		policy     string
		ttft       []time.Duration
		prompt     int
		used       int
		errs       int
		perReplica [][2]int
	}
	rows := []*row{{name: "least-loaded", policy: dispatch.RouteLeastLoaded}, {name: "prefix", policy: dispatch.RoutePrefix}}
	load := loadAvg()
	rounds := *ollamaRounds
	for round := range rounds {
		for i := range rows {
			r := rows[(i+round)%len(rows)]
			var servers []*ollamatest.Server
			var urls []string
			for range 2 {
				s := ollamatest.Start(t)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := s.Create(ctx, "tiny", model.Bytes())
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				servers = append(servers, s)
				urls = append(urls, s.URL)
			}
			simCfg := dataplanetest.FastSim()
			simCfg.Model = "tiny"
			stack, err := dataplanetest.StartStack(dataplanetest.StackConfig{Sim: simCfg, Dispatcher: func(c *dispatch.Config) {
				c.Apps[0].Endpoints = urls
				c.Apps[0].MaxConcurrency = 4
				c.Apps[0].Routing = dispatch.Routing{Policy: r.policy}
				c.Health.Path = "/api/version"
			}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := stack.StartDispatcher(); err != nil {
				t.Fatal(err)
			}
			ttft, errs := ollamaConversations(t, stack.Gateway.URL)
			stack.Close()
			r.ttft = append(r.ttft, ttft...)
			r.errs += errs
			var per [2]int
			for k, s := range servers {
				s.Stop()
				prompt, used := cacheSlotUse(t, filepath.Join(s.Dir, "ollama.log"))
				r.prompt += prompt
				r.used += used
				per[k] = prompt
			}
			r.perReplica = append(r.perReplica, per)
			t.Logf("round %d, %s: %d requests, %d errors", round+1, r.name, len(ttft), errs)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Measured with Ollama %s (2 `ollama serve` processes, `OLLAMA_NUM_PARALLEL=4`, CPU), the generated tiny llama model (`modelgen.Tiny`, context 4096), through the gateway, JetStream and one dispatcher (maxConcurrency 4); %d rounds, each routing once per round in rotated order, fresh engines each run; load average %s before the run, %s after. "+
		"Workload: %d conversations started 300 ms apart, each opening with one of 2 system prompts of %d words and %d turns of %d-word user messages (answers of %d tokens in the next turn's prompt), 200 ms think time. "+
		"Reused = prompt tokens the engines took from a cache slot ÷ prompt tokens, as their runners log them.\n\n",
		ollamatest.Version, rounds, load, loadAvg(), *ollamaConvs, ollamaSystemWords, ollamaTurns, ollamaUserWords, ollamaAnswer)
	b.WriteString("| Routing | Requests | TTFT p50 | TTFT p90 | Prompt tokens reused by the engines | Prompt tokens per engine, max ÷ mean | Errors |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		reuse := 0.0
		if r.prompt > 0 {
			reuse = 100 * float64(r.used) / float64(r.prompt)
		}
		imbalance := 0.0
		for _, per := range r.perReplica {
			if sum := per[0] + per[1]; sum > 0 {
				imbalance += float64(max(per[0], per[1])) / (float64(sum) / 2) / float64(len(r.perReplica))
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f ms | %.0f ms | %.1f %% (%d of %d) | %.2f | %d |\n", r.name, len(r.ttft), msOf(pct(r.ttft, 0.5)), msOf(pct(r.ttft, 0.9)), reuse, r.used, r.prompt, imbalance, r.errs)
	}
	t.Log("\n" + b.String())
	for _, r := range rows {
		if r.errs > 0 {
			t.Errorf("%s: %d requests failed", r.name, r.errs)
		}
	}
	if *ollamaRoutingDocs != "" {
		if err := writeMarked(*ollamaRoutingDocs, *ollamaMarker, b.String()); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	ollamaSystemWords = 300
	ollamaTurns       = 4
	ollamaUserWords   = 40
	ollamaAnswer      = 16
)

// ollamaConversations runs the workload through the gateway and returns
// the times to first token and the number of failed requests.
func ollamaConversations(t *testing.T, gateway string) ([]time.Duration, int) {
	rng := rand.New(rand.NewPCG(7, 7))
	text := func(n int) string {
		w := make([]string, n)
		for i := range w {
			w[i] = vocabulary[rng.IntN(len(vocabulary))]
		}
		return strings.Join(w, " ")
	}
	systems := []string{text(ollamaSystemWords), text(ollamaSystemWords)}
	users := make([][]string, *ollamaConvs)
	for c := range users {
		for range ollamaTurns {
			users[c] = append(users[c], text(ollamaUserWords))
		}
	}
	var mu sync.Mutex
	var ttfts []time.Duration
	errs := 0
	var wg sync.WaitGroup
	for c := range *ollamaConvs {
		wg.Go(func() {
			time.Sleep(time.Duration(c) * 300 * time.Millisecond)
			msgs := []map[string]string{{"role": "system", "content": systems[c%2]}}
			for turn := range ollamaTurns {
				msgs = append(msgs, map[string]string{"role": "user", "content": users[c][turn]})
				ttft, answer, err := streamChat(gateway, msgs)
				mu.Lock()
				if err != nil {
					errs++
					t.Logf("conversation %d turn %d: %v", c, turn, err)
				} else {
					ttfts = append(ttfts, ttft)
				}
				mu.Unlock()
				if err != nil {
					return
				}
				msgs = append(msgs, map[string]string{"role": "assistant", "content": answer})
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return ttfts, errs
}

// vocabulary: words the tiny model's tokenizer knows.
var vocabulary = strings.Fields("the orchestra plays a quiet tune while tokens flow through queue and every request finds its engine in time latency stays low because nothing is lost or repeated workers sing together under one root cache warm weights prompt answer stream batch memory replica signal harmony")

// streamChat sends a streamed chat completion and returns the time to the
// first non-empty content and the answer.
func streamChat(gateway string, msgs []map[string]string) (time.Duration, string, error) {
	sent, res, err := ssetest.Post(context.Background(), gateway+"/v1/chat/completions", dataplanetest.APIKey, nil,
		map[string]any{"model": "tiny", "messages": msgs, "stream": true, "max_tokens": ollamaAnswer, "seed": 1}, nil)
	if err != nil {
		return 0, "", err
	}
	if res.FirstContent.IsZero() {
		return 0, "", errors.New("no content")
	}
	return res.FirstContent.Sub(sent), res.Content, nil
}

var cacheSlotLine = regexp.MustCompile(`loading cache slot.* prompt=(\d+) used=(\d+)`)

// cacheSlotUse sums the prompt tokens and the tokens reused from a cache
// slot over an Ollama log.
func cacheSlotUse(t *testing.T, path string) (prompt, used int) {
	f, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cacheSlotLine.FindAllStringSubmatch(string(f), -1) {
		p, _ := strconv.Atoi(m[1])
		u, _ := strconv.Atoi(m[2])
		prompt += p
		used += u
	}
	return prompt, used
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

// writeMarked replaces the text between <!-- name:start --> and
// <!-- name:end --> in path.
func writeMarked(path, name, section string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	start, end := "<!-- "+name+":start -->", "<!-- "+name+":end -->"
	text := string(old)
	i, j := strings.Index(text, start), strings.Index(text, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s lacks the markers %s and %s", path, start, end)
	}
	return os.WriteFile(path, []byte(text[:i]+start+"\n"+section+end+text[j+len(end):]), 0o644)
}
