package dispatch

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestDecidePrefix(t *testing.T) {
	c := func(root string, load int, free bool, match int) candidate {
		return candidate{root: root, load: load, free: free, match: match}
	}
	// A prompt of 20 blocks; a request in flight costs 4 blocks.
	tests := []struct {
		name  string
		cands []candidate
		want  decision
	}{
		{"longest prefix wins", []candidate{c("a", 1, true, 2), c("b", 1, true, 9), c("c", 0, true, 0)},
			decision{root: "b", outcome: outcomeHit, match: 9, best: 9, bound: 3}},
		{"nothing cached anywhere: least loaded", []candidate{c("a", 2, true, 0), c("b", 1, true, 0), c("c", 3, true, 0)},
			decision{root: "b", outcome: outcomeMiss, bound: 4}},
		// Costs: a 11 + 3*4 = 23, b 16 + 0 = 16.
		{"the queue outweighs the saving: elsewhere", []candidate{c("a", 3, true, 9), c("b", 0, true, 4)},
			decision{root: "b", outcome: outcomeOverflow, match: 4, best: 9, bound: 4}},
		// Costs: a 2 + 2*4 = 10, b 20 + 0 = 20.
		{"the saving outweighs the queue: stays", []candidate{c("a", 2, true, 18), c("b", 0, true, 0)},
			decision{root: "a", outcome: outcomeHit, match: 18, best: 18, bound: 3}},
		// 1 in flight + this one over 4 roots: ceil(1.25*0.5) + 1 = 2, so
		// a root with one request in flight is not over the bound.
		{"one request in flight is not over the bound", []candidate{c("a", 1, true, 18), c("b", 0, true, 0), c("c", 0, true, 0), c("d", 0, true, 0)},
			decision{root: "a", outcome: outcomeHit, match: 18, best: 18, bound: 2}},
		// 7 in flight + 1 over 2 roots: ceil(1.25*4) + 1 = 6.
		{"over the bound: least loaded, however long the prefix", []candidate{c("a", 6, true, 20), c("b", 1, true, 0)},
			decision{root: "b", outcome: outcomeOverflow, best: 20, bound: 6}},
		{"longest prefix without a free slot", []candidate{c("a", 1, false, 9), c("b", 1, true, 0)},
			decision{root: "b", outcome: outcomeOverflow, best: 9, bound: 3}},
		{"equal prefixes: least loaded of them", []candidate{c("a", 2, true, 5), c("b", 1, true, 5), c("c", 0, true, 0)},
			decision{root: "b", outcome: outcomeHit, match: 5, best: 5, bound: 3}},
		{"no free root", []candidate{c("a", 4, false, 9)}, decision{}},
		{"no root", nil, decision{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decidePrefix(tt.cands, 20, 1.25, 4, 42); got != tt.want {
				t.Errorf("decidePrefix = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLearntLoadCost(t *testing.T) {
	if got := nextMeanPrefill(0, 0, 40); got != 40 {
		t.Errorf("first decision: %v, want 40", got)
	}
	if got := nextMeanPrefill(40, 5, 8); got != 39 {
		t.Errorf("moving mean: %v, want 40 + (8-40)/32 = 39", got)
	}
	if got := learntLoadCost(39); got != 19.5 {
		t.Errorf("load cost: %v, want half the mean prefill", got)
	}
}

func TestDecideConsistent(t *testing.T) {
	cands := []candidate{{root: "a", load: 3, free: true}, {root: "b", load: 0, free: true}, {root: "c", load: 1, free: true}}
	tests := []struct {
		name  string
		order []string
		want  decision
	}{
		{"its root within the bound", []string{"c", "a", "b"}, decision{root: "c", outcome: outcomeHit, bound: 3}},
		// 4 in flight + 1 over 3 roots, factor 1.25: bound ceil(2.08) = 3.
		{"its root over the bound: the next clockwise", []string{"a", "c", "b"}, decision{root: "c", outcome: outcomeOverflow, bound: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decideConsistent(append([]candidate(nil), cands...), tt.order, 1.25, 0); got != tt.want {
				t.Errorf("decideConsistent = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestBlockHashesNamePrefixes(t *testing.T) {
	a := blockHashes(strings.Repeat("x", 64)+strings.Repeat("y", 64)+"tail", 64)
	b := blockHashes(strings.Repeat("x", 64)+strings.Repeat("z", 64), 64)
	c := blockHashes(strings.Repeat("y", 64)+strings.Repeat("y", 64), 64)
	if len(a) != 2 || a[0] != b[0] || a[1] == b[1] {
		t.Errorf("shared first block must hash alike and the second apart: %x %x", a, b)
	}
	if c[1] == a[1] {
		t.Error("equal blocks after different prefixes hash alike")
	}
}

func TestParsePromptRendersChat(t *testing.T) {
	p := parsePrompt([]byte(`{"messages":[{"role":"system","content":"be kind"},{"role":"user","content":[{"type":"text","text":"hello there"}]}]}`), 5)
	if p.text != "<|system|>\nbe kind<|end|>\n<|user|>\nhello there\n<|end|>\n" || p.key != "hello" {
		t.Errorf("parsePrompt = %q key %q", p.text, p.key)
	}
	if p := parsePrompt([]byte(`{"prompt":"once upon a time"}`), 4); p.text != "once upon a time" || p.key != "once" {
		t.Errorf("completion prompt = %+v", p)
	}
	if p := parsePrompt([]byte(`not json`), 4); p.text != "" {
		t.Errorf("unreadable body rendered %q", p.text)
	}
}

// conversation renders turn n of conversation c of a multi-turn chat that
// opens with one of a few shared system prompts.
func conversation(c, turns int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"messages":[{"role":"system","content":%q}`, strings.Repeat(fmt.Sprintf("system prompt %d. ", c%3), 40))
	for t := range turns {
		fmt.Fprintf(&b, `,{"role":"user","content":%q}`, strings.Repeat(fmt.Sprintf("user %d asks question %d. ", c, t), 8))
		if t < turns-1 {
			fmt.Fprintf(&b, `,{"role":"assistant","content":%q}`, strings.Repeat(fmt.Sprintf("answer %d to %d. ", t, c), 8))
		}
	}
	b.WriteString("]}")
	return []byte(b.String())
}

func testRouter() *router {
	r := newRouter(defaultRouting(Routing{Policy: RoutePrefix}), newRouteMetrics(prometheus.NewRegistry()).forApp("chat"))
	return r
}

// route decides and records one request against roots that all have a
// free slot and the given loads.
func route(r *router, body []byte, roots []string, load map[string]int) decision {
	q := r.prepare(body)
	cands := make([]candidate, len(roots))
	for i, root := range roots {
		cands[i] = candidate{root: root, load: load[root], free: true}
	}
	d := r.decide(q, cands)
	r.record(q, d)
	return d
}

// TestPrefixRoutingChurn: conversations stay where their history is when a
// root joins; when one leaves, only its conversations move.
func TestPrefixRoutingChurn(t *testing.T) {
	r := testRouter()
	roots := []string{"http://r0", "http://r1", "http://r2", "http://r3"}
	load := map[string]int{}
	home := map[int]string{}
	for c := range 40 {
		d := route(r, conversation(c, 1), roots, load)
		load[d.root]++ // conversations spread as they start
		home[c] = d.root
	}
	for k := range load {
		load[k] = 0
	}
	// Scale out: a fifth root joins. Every next turn stays home.
	roots5 := append(append([]string(nil), roots...), "http://r4")
	moved := 0
	for c := range 40 {
		if d := route(r, conversation(c, 2), roots5, load); d.root != home[c] {
			moved++
		} else if d.outcome != outcomeHit {
			t.Errorf("conversation %d: outcome %s at home", c, d.outcome)
		}
	}
	if moved != 0 {
		t.Errorf("a root joining moved %d of 40 conversations, want 0", moved)
	}
	// A root leaves (scale in, restart under a new address): only its
	// conversations move.
	r.forget("http://r1")
	left := []string{"http://r0", "http://r2", "http://r3", "http://r4"}
	for c := range 40 {
		d := route(r, conversation(c, 3), left, load)
		if home[c] != "http://r1" && d.root != home[c] {
			t.Errorf("conversation %d moved from %s to %s though its root stayed", c, home[c], d.root)
		}
	}
	// Scale to zero: everything forgotten; the first requests after the
	// wake are misses, spread by load.
	for _, root := range left {
		r.forget(root)
	}
	if d := route(r, conversation(1, 4), []string{"http://n0", "http://n1"}, nil); d.outcome == outcomeHit {
		t.Errorf("after scale to zero: %+v, want no hit", d)
	}
}

// TestTwoDispatchersAgree: two dispatchers that share their decisions send
// each conversation's turns to one root, whichever of them takes a turn
// (unless the load bound sends it elsewhere); without sharing they often
// disagree.
func TestTwoDispatchersAgree(t *testing.T) {
	roots := []string{"http://r0", "http://r1", "http://r2", "http://r3"}
	run := func(share bool) (home, overflow, turns int) {
		a, b := testRouter(), testRouter()
		// Requests in flight cost next to nothing: what moves a turn here
		// is only the load bound (the trade-off is TestDecidePrefix's).
		a.cfg.LoadCost, b.cfg.LoadCost = 0.001, 0.001
		if share {
			a.publish = func(root string, h []uint64) { b.remember(root, h) }
			b.publish = func(root string, h []uint64) { a.remember(root, h) }
		}
		last := map[int]string{}
		rng := rand.New(rand.NewPCG(1, 2))
		for turn := 1; turn <= 4; turn++ {
			// Each dispatcher's in-flight requests: a turn's requests
			// overlap, so they spread the conversations over the roots.
			// They arrive in another order each turn, each at either
			// dispatcher.
			loadA, loadB := map[string]int{}, map[string]int{}
			for _, c := range rng.Perm(40) {
				r, load := a, loadA
				if rng.IntN(2) == 1 {
					r, load = b, loadB
				}
				d := route(r, conversation(c, turn), roots, load)
				load[d.root]++
				if turn > 1 {
					turns++
					switch {
					case d.root == last[c]:
						home++
					case d.outcome == outcomeOverflow:
						overflow++
					}
				}
				last[c] = d.root
			}
		}
		return home, overflow, turns
	}
	home, overflow, turns := run(true)
	if home+overflow != turns || home < turns*3/4 {
		t.Errorf("sharing: of %d later turns %d went to the root of the turn before and %d overflowed; want all of them one or the other, at least 3/4 home", turns, home, overflow)
	}
	alone, _, _ := run(false)
	if alone >= home {
		t.Errorf("without sharing %d turns found their root, with sharing %d: the test does not exercise sharing", alone, home)
	}
	t.Logf("later turns on the previous turn's root: %d/%d sharing (%d overflowed), %d/%d not sharing", home, turns, overflow, alone, turns)
}

func TestRouteUpdateRoundTrip(t *testing.T) {
	root, hashes, err := decodeRoute(encodeRoute("http://10.0.0.1:8080", []uint64{1, 2, 1 << 63}))
	if err != nil || root != "http://10.0.0.1:8080" || len(hashes) != 3 || hashes[2] != 1<<63 {
		t.Errorf("round trip: %q %v %v", root, hashes, err)
	}
	for _, bad := range [][]byte{nil, {200}, append(encodeRoute("x", nil), 1, 2)} {
		if _, _, err := decodeRoute(bad); err == nil {
			t.Errorf("decodeRoute(%v) accepted a malformed update", bad)
		}
	}
}

func TestRoutingValidation(t *testing.T) {
	for _, r := range []Routing{{Policy: "roundRobin"}, {Policy: RoutePrefix, LoadFactor: 0.5}, {BlockBytes: -1}} {
		if r.validate() == nil {
			t.Errorf("%+v passed validation", r)
		}
	}
	if err := defaultRouting(Routing{Policy: RoutePrefix}).validate(); err != nil {
		t.Error(err)
	}
}
