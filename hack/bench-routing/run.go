package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/sim"
	"github.com/model-orchestra/operator/internal/ssetest"
)

type options struct {
	duration, warmup     time.Duration
	rounds               int
	prefillRate          float64
	convRate, singleRate float64
	seed                 uint64
	loadCost             float64
	only                 map[string]bool
	// log, when set, receives one JSON line per measured request.
	log io.Writer
}

// Workload shape.
const (
	replicas      = 4
	systemPrompts = 4
	systemWords   = 1500
	userWords     = 300
	minTurns      = 3
	maxTurns      = 6
	thinkMean     = 500 * time.Millisecond
	singleWords   = 1200
	answerTokens  = 32
)

// routing is one row of the table: a policy and how many dispatchers run it.
type routing struct {
	name        string
	cfg         dispatch.Routing
	dispatchers int
}

func routings(o options) []routing {
	all := []routing{
		{"least-loaded", dispatch.Routing{Policy: dispatch.RouteLeastLoaded}, 1},
		{"random", dispatch.Routing{Policy: dispatch.RouteRandom}, 1},
		{"CHWBL", dispatch.Routing{Policy: dispatch.RouteConsistentHash}, 1},
		{"prefix", dispatch.Routing{Policy: dispatch.RoutePrefix, LoadCost: o.loadCost}, 1},
		{"CHWBL, 2 dispatchers", dispatch.Routing{Policy: dispatch.RouteConsistentHash}, 2},
		{"prefix, 2 dispatchers", dispatch.Routing{Policy: dispatch.RoutePrefix, LoadCost: o.loadCost}, 2},
	}
	var out []routing
	for _, r := range all {
		if o.only == nil || o.only[r.name] {
			out = append(out, r)
		}
	}
	return out
}

// conversation is one user's chat: its system prompt, its user messages
// and the pauses between an answer and the next message.
type conversation struct {
	start  time.Duration
	system string // "" for none
	users  []string
	thinks []time.Duration
}

type workload struct {
	name  string
	convs []conversation
	// twoDispatchers: the workload runs with the 2-dispatcher rows too.
	twoDispatchers bool
}

// words returns n pseudo-random words (the simulator counts a word as a
// token).
func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "w%d", rng.IntN(5000))
	}
	return b.String()
}

func exp(rng *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// multiTurn: conversations arrive as a Poisson process, each opens with one
// of a few shared system prompts and has several turns.
func multiTurn(o options) workload {
	rng := rand.New(rand.NewPCG(o.seed, 1))
	var systems []string
	for range systemPrompts {
		systems = append(systems, words(rng, systemWords))
	}
	w := workload{name: "multi-turn", twoDispatchers: true}
	for at := exp(rng, time.Duration(float64(time.Second)/o.convRate)); at < o.duration; at += exp(rng, time.Duration(float64(time.Second)/o.convRate)) {
		c := conversation{start: at, system: systems[rng.IntN(len(systems))]}
		for range minTurns + rng.IntN(maxTurns-minTurns+1) {
			c.users = append(c.users, words(rng, userWords))
			c.thinks = append(c.thinks, exp(rng, thinkMean))
		}
		w.convs = append(w.convs, c)
	}
	return w
}

// noSharing: single requests with prompts that share nothing.
func noSharing(o options) workload {
	rng := rand.New(rand.NewPCG(o.seed, 2))
	w := workload{name: "no sharing"}
	for at := exp(rng, time.Duration(float64(time.Second)/o.singleRate)); at < o.duration; at += exp(rng, time.Duration(float64(time.Second)/o.singleRate)) {
		w.convs = append(w.convs, conversation{start: at, users: []string{words(rng, singleWords)}, thinks: []time.Duration{0}})
	}
	return w
}

// sample is one request's outcome.
type sample struct {
	sent          time.Duration // since the run started
	done          time.Duration
	ttft          time.Duration
	prompt, cache int
	output        int
	err           error
	// Where it went and why (see trace.go).
	conv, turn int
	key        uint64 // hash of the request's last message
	route
}

type result struct {
	workload, routing string
	dispatchers       int
	samples           []sample
	perReplica        [][]int64 // requests per replica, per run
}

// runLoads is the 1-minute load average at the start of each run.
var runLoads []string

func run(ctx context.Context, o options) ([]*result, error) {
	workloads := []workload{multiTurn(o), noSharing(o)}
	rs := routings(o)
	byKey := map[string]*result{}
	var order []*result
	for round := range o.rounds {
		for _, w := range workloads {
			for i := range rs {
				r := rs[(i+round)%len(rs)]
				if r.dispatchers > 1 && !w.twoDispatchers {
					continue
				}
				key := w.name + "/" + r.name
				res := byKey[key]
				if res == nil {
					res = &result{workload: w.name, routing: r.name, dispatchers: r.dispatchers}
					byKey[key] = res
					order = append(order, res)
				}
				runLoads = append(runLoads, loadAverage())
				fmt.Fprintf(os.Stderr, "round %d: %s, %s (load %s) ... ", round+1, w.name, r.name, runLoads[len(runLoads)-1])
				samples, per, err := runOne(ctx, o, w, r)
				if err != nil {
					return nil, fmt.Errorf("%s, %s: %w", w.name, r.name, err)
				}
				res.samples = append(res.samples, samples...)
				res.perReplica = append(res.perReplica, per)
				fmt.Fprintf(os.Stderr, "%d requests\n", len(samples))
			}
		}
	}
	return order, nil
}

// simConfig is every replica's simulator.
func simConfig(o options) sim.Config {
	cfg := sim.Default()
	cfg.TimeToFirstToken = 10 * time.Millisecond
	cfg.InterTokenLatency = 5 * time.Millisecond
	cfg.OutputTokens = answerTokens
	cfg.MaxModelLen = 32768
	cfg.PrefillRate = o.prefillRate
	return cfg
}

// runOne runs a workload against fresh replicas (empty caches) and a fresh
// data plane routed by r.
func runOne(ctx context.Context, o options, w workload, r routing) ([]sample, []int64, error) {
	cfg := simConfig(o)
	var engines []*dataplanetest.Engine
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	var urls []string
	tr := newTracer()
	for i := range replicas {
		// Each replica keeps its address from run to run, as a pod keeps
		// its name: ties between equal replicas (rendezvous hashing on
		// the URL) then break alike in every run.
		e, err := dataplanetest.StartEngineAt(cfg, fmt.Sprintf("127.77.0.%d:18080", i+1))
		if err != nil {
			return nil, nil, err
		}
		e.Seen = tr.seen(i)
		engines = append(engines, e)
		urls = append(urls, e.URL)
	}
	r.cfg.Observe = tr.observe
	stack, err := dataplanetest.StartStack(dataplanetest.StackConfig{Sim: cfg, Dispatcher: func(c *dispatch.Config) {
		c.Apps[0].Endpoints = urls
		c.Apps[0].MaxConcurrency = 64
		c.Apps[0].Routing = r.cfg
	}})
	if err != nil {
		return nil, nil, err
	}
	defer stack.Close()
	for range r.dispatchers {
		if _, err := stack.StartDispatcher(); err != nil {
			return nil, nil, err
		}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	url := stack.Gateway.URL + "/v1/chat/completions"

	began := time.Now()
	var mu sync.Mutex
	var samples []sample
	var wg sync.WaitGroup
	for ci, c := range w.convs {
		wg.Go(func() {
			if !sleepCtx(ctx, c.start-time.Since(began)) {
				return
			}
			var msgs []map[string]string
			if c.system != "" {
				msgs = append(msgs, map[string]string{"role": "system", "content": c.system})
			}
			for i, u := range c.users {
				msgs = append(msgs, map[string]string{"role": "user", "content": u})
				s, answer := chat(ctx, client, url, msgs, began)
				s.conv, s.turn, s.key = ci, i+1, lastKey(u)
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
				if s.err != nil {
					return
				}
				msgs = append(msgs, map[string]string{"role": "assistant", "content": answer})
				if i < len(c.users)-1 && !sleepCtx(ctx, c.thinks[i]) {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var per []int64
	for _, e := range engines {
		per = append(per, e.Requests.Load())
	}
	routes := tr.routes(urls)
	var measured []sample
	for _, s := range samples {
		if s.sent >= o.warmup {
			s.route = routes[s.key]
			measured = append(measured, s)
		}
	}
	explain(os.Stderr, o, w.name, r.name, measured)
	return measured, per, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// chat sends one streamed chat completion through the gateway and returns
// its sample and the answer's text. The time to first token is ssetest's:
// to the first non-empty content.
func chat(ctx context.Context, client *http.Client, url string, msgs []map[string]string, began time.Time) (sample, string) {
	body, _ := json.Marshal(map[string]any{
		"model": "sim-model", "messages": msgs, "stream": true, "max_tokens": answerTokens,
		"stream_options": map[string]bool{"include_usage": true},
	})
	s := sample{sent: time.Since(began)}
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		s.err = err
		return s, ""
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		s.err = fmt.Errorf("status %d: %s", res.StatusCode, b)
		return s, ""
	}
	r, err := ssetest.Read(res.Body, nil)
	if err != nil {
		s.err = err
	}
	if !r.FirstContent.IsZero() {
		s.ttft = r.FirstContent.Sub(start)
	}
	if u := r.Usage; u != nil {
		s.prompt, s.output = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			s.cache = u.PromptTokensDetails.CachedTokens
		}
	}
	if s.ttft == 0 && s.err == nil {
		s.err = fmt.Errorf("no content")
	}
	s.done = time.Since(began)
	return s, r.Content
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[min(len(d)-1, int(math.Ceil(p*float64(len(d))))-1)]
}

// describe states the workloads and the simulators.
func describe(o options) string {
	return fmt.Sprintf("Replicas: %d simulators, prefix cache 262,144 tokens in 16-token blocks, prefill %.0f tokens/s one prompt at a time, first token 10 ms after the prefill, %d output tokens 5 ms apart; dispatcher maxConcurrency 64 per replica, load factor 1.25 for CHWBL and prefix; prefix's load cost learnt (half the moving mean of the blocks routed requests had to prefill); replicas at fixed addresses (127.77.0.1-4:18080) in every run. "+
		"Multi-turn: conversations arrive as a Poisson process (%.1f/s), each opens with one of %d system prompts of %d tokens and has %d-%d turns of %d-token user messages, the answer of each turn in the next turn's prompt, %v mean think time (exponential); prompts grow to about %d tokens. "+
		"No sharing: single requests of %d unrelated tokens, Poisson (%.0f/s). "+
		"Hit rate = cached prompt tokens / prompt tokens, as the replicas report them in `usage.prompt_tokens_details.cached_tokens`; load = requests per replica, max ÷ mean over the run's 4 replicas (mean of the runs); output tokens/s over the measured requests' span, mean of the runs.\n",
		replicas, o.prefillRate, answerTokens, o.convRate, systemPrompts, systemWords, minTurns, maxTurns, userWords, thinkMean,
		systemWords+maxTurns*(userWords+answerTokens+8), singleWords, o.singleRate)
}

func format(results []*result) string {
	var b strings.Builder
	b.WriteString("| Workload | Routing | Requests | TTFT p50 | TTFT p90 | p90 vs least-loaded | Output tokens/s | Prefix-cache hit rate | Max replica load ÷ mean | Errors |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	base := map[string]time.Duration{}
	for _, r := range results {
		if r.routing == "least-loaded" {
			base[r.workload] = p90(r)
		}
	}
	for _, r := range results {
		var ttft []time.Duration
		var prompt, cached, out, errs int
		var first, last time.Duration = math.MaxInt64, 0
		for _, s := range r.samples {
			if s.err != nil {
				errs++
				continue
			}
			ttft = append(ttft, s.ttft)
			prompt += s.prompt
			cached += s.cache
			out += s.output
			first, last = min(first, s.sent), max(last, s.done)
		}
		// Sent and done times count from each run's start, so the span
		// is one run's: the rate is the mean over the runs.
		rate := 0.0
		if last > first && len(r.perReplica) > 0 {
			rate = float64(out) / (last - first).Seconds() / float64(len(r.perReplica))
		}
		ratio := "—"
		if bp := base[r.workload]; bp > 0 && r.routing != "least-loaded" {
			ratio = fmt.Sprintf("%.2f×", float64(bp)/float64(percentile(ttft, 0.9)))
		}
		hit := 0.0
		if prompt > 0 {
			hit = float64(cached) / float64(prompt)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %.0f | %.1f %% | %.2f | %d |\n", r.workload, r.routing, len(ttft),
			ms(percentile(ttft, 0.5)), ms(percentile(ttft, 0.9)), ratio, rate, 100*hit, imbalance(r.perReplica), errs)
	}
	b.WriteString("\n\"p90 vs least-loaded\" is least-loaded's p90 divided by the row's (above 1: lower time to first token).\n")
	return b.String()
}

func p90(r *result) time.Duration {
	var ttft []time.Duration
	for _, s := range r.samples {
		if s.err == nil {
			ttft = append(ttft, s.ttft)
		}
	}
	return percentile(ttft, 0.9)
}

// imbalance is the mean over runs of max ÷ mean requests per replica.
func imbalance(runs [][]int64) float64 {
	var sum float64
	n := 0
	for _, per := range runs {
		var total, top int64
		for _, v := range per {
			total += v
			top = max(top, v)
		}
		if total > 0 {
			sum += float64(top) / (float64(total) / float64(len(per)))
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
