package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/model-orchestra/operator/internal/dispatch"
)

// route is where one request went and what the deciding dispatcher saw:
// the replica (index among the run's replicas, -1 when unknown), and for
// prefix and CHWBL the decision's outcome, the chosen replica's matched
// prompt blocks, the longest match over the replicas, the chosen
// replica's load and the least load over the free replicas (requests in
// flight from that dispatcher, before this one), and the load bound.
type route struct {
	Replica    int    `json:"replica"`
	Dispatcher string `json:"dispatcher,omitempty"`
	Outcome    string `json:"outcome,omitempty"`
	Match      int    `json:"matchBlocks"`
	Best       int    `json:"bestBlocks"`
	Load       int    `json:"load"`
	MinLoad    int    `json:"minLoad"`
	Bound      int    `json:"bound"`
}

// tracer joins what the replicas received (Seen) with what the
// dispatchers decided (Observe), by the request's last message. Both
// hooks only copy; the parsing waits for the run's end.
type tracer struct {
	mu     sync.Mutex
	bodies []seenBody
	events []dispatch.RouteEvent
}

type seenBody struct {
	replica int
	body    []byte
}

func newTracer() *tracer { return &tracer{} }

func (t *tracer) seen(replica int) func([]byte) {
	return func(body []byte) {
		b := slices.Clone(body)
		t.mu.Lock()
		t.bodies = append(t.bodies, seenBody{replica, b})
		t.mu.Unlock()
	}
}

func (t *tracer) observe(ev dispatch.RouteEvent) {
	ev.Body = slices.Clone(ev.Body)
	t.mu.Lock()
	t.events = append(t.events, ev)
	t.mu.Unlock()
}

// routes maps each request's last-message key to where it went; urls are
// the replicas' URLs in index order.
func (t *tracer) routes(urls []string) map[uint64]route {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[uint64]route{}
	for _, s := range t.bodies {
		k, ok := bodyKey(s.body)
		if ok {
			out[k] = route{Replica: s.replica}
		}
	}
	for _, ev := range t.events {
		k, ok := bodyKey(ev.Body)
		if !ok {
			continue
		}
		r := out[k]
		r.Replica = slices.Index(urls, ev.Root)
		r.Dispatcher, r.Outcome = ev.Dispatcher, ev.Outcome
		r.Match, r.Best, r.Bound = ev.Match, ev.Best, ev.Bound
		r.MinLoad = -1
		for _, c := range ev.Roots {
			if c.Root == ev.Root {
				r.Load = c.Load
			}
			if c.Free && (r.MinLoad < 0 || c.Load < r.MinLoad) {
				r.MinLoad = c.Load
			}
		}
		out[k] = r
	}
	return out
}

// bodyKey is the key of a chat request's last message.
func bodyKey(body []byte) (uint64, bool) {
	var req struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		return 0, false
	}
	return lastKey(req.Messages[len(req.Messages)-1].Content), true
}

func lastKey(content string) uint64 { return xxh3.HashString(content) }

// explain prints where a run's slowest tenth of requests (TTFT at or
// above the run's p90) lost their time: the prefill of the tokens not
// cached (prompt - cached at the prefill rate) or the wait before it
// (the rest of the TTFT beyond the simulator's fixed first-token time),
// by decision outcome and turn; and writes every request to o.log.
func explain(w io.Writer, o options, workload, routing string, samples []sample) {
	var ttft []time.Duration
	for _, s := range samples {
		if s.err == nil {
			ttft = append(ttft, s.ttft)
		}
	}
	p90 := percentile(ttft, 0.9)
	type agg struct {
		n             int
		prefill, wait time.Duration
		gap           int
		firstTurn     int
	}
	var slow, all agg
	outcomes := map[string]int{}
	slowOutcomes := map[string]int{}
	add := func(a *agg, s sample, prefill, wait time.Duration) {
		a.n++
		a.prefill += prefill
		a.wait += wait
		a.gap += s.Load - s.MinLoad
		if s.turn == 1 {
			a.firstTurn++
		}
	}
	for _, s := range samples {
		if s.err != nil {
			continue
		}
		prefill := time.Duration(float64(s.prompt-s.cache) / o.prefillRate * float64(time.Second))
		wait := max(0, s.ttft-prefill-10*time.Millisecond)
		add(&all, s, prefill, wait)
		outcomes[s.Outcome]++
		if s.ttft >= p90 {
			add(&slow, s, prefill, wait)
			slowOutcomes[s.Outcome]++
		}
		if o.log != nil {
			line, _ := json.Marshal(struct {
				Workload string `json:"workload"`
				Routing  string `json:"routing"`
				Conv     int    `json:"conv"`
				Turn     int    `json:"turn"`
				SentMS   int64  `json:"sentMs"`
				TTFTMS   int64  `json:"ttftMs"`
				Prompt   int    `json:"prompt"`
				Cached   int    `json:"cached"`
				route
			}{workload, routing, s.conv, s.turn, s.sent.Milliseconds(), s.ttft.Milliseconds(), s.prompt, s.cache, s.route})
			_, _ = fmt.Fprintf(o.log, "%s\n", line)
		}
	}
	if slow.n == 0 {
		return
	}
	mean := func(d time.Duration, n int) string { return ms(d / time.Duration(max(n, 1))) }
	fmt.Fprintf(w, "\n  %s/%s: p90 %s; all %d: prefill %s, wait %s, outcomes %v; slowest %d: prefill %s, wait %s, first turns %d, chosen load - least %.2f, outcomes %v\n",
		workload, routing, ms(p90), all.n, mean(all.prefill, all.n), mean(all.wait, all.n), outcomes,
		slow.n, mean(slow.prefill, slow.n), mean(slow.wait, slow.n), slow.firstTurn, float64(slow.gap)/float64(slow.n), slowOutcomes)
}
