package e2e

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

func p50(v []time.Duration) time.Duration { return quantile(v, 50) }

func p90(v []time.Duration) time.Duration { return quantile(v, 90) }

// quantile is the q-th percentile of v (nearest rank, the lower for the
// median of an even count); 0 for none.
func quantile(v []time.Duration, q int) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if q == 50 {
		return s[(len(s)-1)/2]
	}
	return s[min(len(s)*q/100, len(s)-1)]
}

func maxOf(v []time.Duration) time.Duration { return slices.Max(v) }

func p50f(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// engineTable is the wake table: wake from zero against the plain scale,
// and the wake from sleep; then where the time of each went.
func engineTable(sizes []*engineSize, loadBefore, loadAfter string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make bench-engine` (`go test ./internal/e2e -run TestEngineBenchmark -engine-bench\n-engine-bench-rounds %d -engine-bench-wakes %d -engine-bench-large %s`) on the real-node local cluster (%d CPUs; load\naverage %s before, %s after), real Ollama (the pinned build, CPU only) on two generated models;\n%d wakes from zero and %d plain scales a model, alternating, each from zero pods on a settled node.\n\n",
		*benchEngineRounds, *benchEngineWakes, *benchEngineLarge, runtime.NumCPU(), loadBefore, loadAfter, *benchEngineRounds**benchEngineWakes, *benchEngineRounds**benchEngineWakes)
	b.WriteString("| Model | wake from zero -> first token | plain scale 0 -> 1 -> first answer | ratio (target <= 1.1) | sleep -> wake -> first token | sleep wake / wake from zero |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, s := range sizes {
		wake, plain := firsts(s.wake), firsts(s.baseline)
		w, bl, sw := p50(wake), p50(plain), p50(s.sleepWake)
		fmt.Fprintf(&b, "| %s (%d bytes) | %s (p10 – p90 %s – %s) | %s (p10 – p90 %s – %s) | %.2f | %s (max %s) | %.2f |\n", s.label, s.bytes,
			msd(w), msd(quantile(wake, 10)), msd(quantile(wake, 90)), msd(bl), msd(quantile(plain, 10)), msd(quantile(plain, 90)),
			float64(w)/float64(bl), msd(sw), msd(maxOf(s.sleepWake)), float64(sw)/float64(w))
	}
	fmt.Fprintf(&b, "\nMedians; sleep -> wake: one a model and round, %d in all.\n\n", *benchEngineRounds)
	b.WriteString("Where the time went, each step from the start (the request sent, the scale asked), as a watch from the test saw the root pod; medians of each column on its own:\n\n")
	b.WriteString("| Model | start | -> root pod created | -> root pod running (with its IP) | -> first token | running -> first token |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, s := range sizes {
		for _, row := range []struct {
			what string
			v    []startTimes
		}{{"wake from zero (the request)", s.wake}, {"plain scale (the scale)", s.baseline}} {
			var created, running, first, served []time.Duration
			for _, x := range row.v {
				created, running, first = append(created, x.created), append(running, x.running), append(first, x.first)
				served = append(served, x.first-x.running)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", s.label, row.what, msd(p50(created)), msd(p50(running)), msd(p50(first)), msd(p50(served)))
		}
	}
	return b.String()
}

// firsts are the first-token times of ws.
func firsts(ws []startTimes) []time.Duration {
	out := make([]time.Duration, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.first)
	}
	return out
}

// firstTokenRows are the first-token table's rows: path, what it crosses.
var firstTokenRows = []struct{ path, what, pods string }{
	{pathDirect, "direct to the engine's pod IP", "0"},
	{pathRelay, "one plain relay pod", "1"},
	{pathRelays, "three plain relay pods", "3"},
	{pathGateway, "gateway, direct lane (a lease held)", "1 (gateway)"},
	{pathGatewayQueue, "gateway + JetStream + dispatcher (queue lane)", "3 (gateway, NATS, dispatcher)"},
}

// added is the median of the per-set differences between path and direct
// (the sets are interleaved, so each difference is taken at one load).
func (s *engineSize) added(path string) time.Duration { return p50(s.diffs(path)) }

// diffs are the per-set differences of path's first token to direct's.
func (s *engineSize) diffs(path string) []time.Duration {
	d, p := s.first[pathDirect], s.first[path]
	diff := make([]time.Duration, 0, len(p))
	for i := range min(len(d), len(p)) {
		diff = append(diff, p[i]-d[i])
	}
	return diff
}

// firstTokenTable is the first-token table: each path's first token, what
// it adds to direct, the floors of one and three relay pods, the ratios
// and the NATS pod's round trips.
func firstTokenTable(sizes []*engineSize, loadBefore, loadAfter string) string {
	var b strings.Builder
	cmd, flags := "make bench-engine", fmt.Sprintf("-engine-bench-rounds %d -engine-bench-large %s", *benchEngineRounds, *benchEngineLarge)
	if *benchEngineTTFT {
		cmd, flags = "make bench-engine BENCH_ENGINE_TTFT=1", fmt.Sprintf("-engine-bench-rounds %d -engine-bench-ttft", *benchEngineRounds)
	}
	sets := *benchEngineRounds * benchPairs
	fmt.Fprintf(&b, "Measured by `%s` (`go test ./internal/e2e -run TestEngineBenchmark -engine-bench\n%s`) on the real-node local cluster (%d CPUs; load average %s before,\n%s after), real Ollama (the pinned build, CPU only); %d sets a model of one streamed chat (up to 64 tokens)\na path, in rotating order, each with a prompt of its own of one length, after one warm-up set a round. Every path is\nreached by pod IP (the gateway's: one gateway pod); the queue lane is asked for with X-Orchestra-Lane: queue (as with\nspec.gateway.directLane false); the application has two slots (maxConcurrency 2), one for each lane.\n\n",
		cmd, flags, runtime.NumCPU(), loadBefore, loadAfter, sets)
	b.WriteString("| Model | Path | pods between client and engine | first token p50 | p10 – p90 | added to first token (median of per-set differences to direct) | tokens/s p50 |\n| --- | --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, s := range sizes {
		for _, r := range firstTokenRows {
			v := s.first[r.path]
			added := "—"
			if r.path != pathDirect {
				diff := s.diffs(r.path)
				added = fmt.Sprintf("%.2f ms (IQR %.2f – %.2f)", ms(p50(diff)), ms(quantile(diff, 25)), ms(quantile(diff, 75)))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.1f ms | %.1f – %.1f ms | %s | %.0f |\n", s.label, r.what, r.pods,
				ms(p50(v)), ms(quantile(v, 10)), ms(quantile(v, 90)), added, p50f(s.rate[r.path]))
		}
	}
	b.WriteString("\n| Model | gateway, direct lane added (target <= 1 ms) | met | ÷ one relay pod added | gateway + queue added | ÷ three relay pods added | one relay pod added | one more pod, from three relays against one ((three − one) / 2) | round trip through the NATS pod, engine idle | same, engine streaming | direct-lane requests the gateway queued (repeated, not counted) |\n| --- | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	ratio := func(a, b time.Duration) string {
		if b <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", float64(a)/float64(b))
	}
	for _, s := range sizes {
		dl, gw, r1, r3 := s.added(pathGateway), s.added(pathGatewayQueue), s.added(pathRelay), s.added(pathRelays)
		met := "no"
		if dl <= time.Millisecond {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %.2f ms | %s | %s | %.2f ms | %s | %.2f ms | %.2f ms | %.2f ms (p90 %.2f) | %.2f ms (p90 %.2f) | %d |\n", s.label, ms(dl), met, ratio(dl, r1), ms(gw), ratio(gw, r3), ms(r1), ms(r3-r1)/2,
			ms(p50(s.podIdle)), ms(p90(s.podIdle)), ms(p50(s.podBusy)), ms(p90(s.podBusy)), s.laneMisses)
	}
	b.WriteString("\nThe NATS round trips: 20 a set with the engine idle, and as many as fit in one more direct stream, 2 ms apart; each passes through the NATS pod twice.\n")
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// writeMarked replaces the block between start and end of the file at path.
func writeMarked(path, start, end, content string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(raw)
	i, j := strings.Index(doc, start), strings.Index(doc, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s ... %s block", path, start, end)
	}
	return os.WriteFile(path, []byte(doc[:i+len(start)]+"\n"+content+doc[j:]), 0o644)
}
