// Command bench-mux measures active-seat multiplexing against the
// hardware: four in-process simulator applications with real weights, each
// behind a real seat agent, share one seat (activeSeats 1) under the
// seatgroup executor. For each weight size it measures the hot tier
// (tmpfs) write and read bandwidth, then drives round-robin traffic (one
// swap per turn) and bursty traffic, and reports each swap's time against
// the bound bytes out ÷ write bandwidth + bytes in ÷ read bandwidth (no
// bytes out when the sleep reused the offload kept since the last wake), the
// swaps made while the swapped-out application had requests in flight, and
// the requests lost or cut. With -docs it writes the table between the
// <!-- bench-mux:start --> and <!-- bench-mux:end --> markers.
//
//	go run ./hack/bench-mux --sizes 0.25GiB,1GiB
package main

import (
	"bufio"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/checkpoint/arena"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/seatgroup/seatgrouptest"
	"github.com/model-orchestra/operator/internal/sim"
)

const (
	startMarker = "<!-- bench-mux:start -->"
	endMarker   = "<!-- bench-mux:end -->"
	simTTFT     = 10 * time.Millisecond
	simITL      = 5 * time.Millisecond
	// tokens per request: with simITL, a request takes about 170 ms, so
	// bursts overlap with swaps and holders have to be drained.
	tokens = 32
	apps   = 4
)

// swap is one swap of the round-robin run, split into the engines' own
// work (the simulator's sleep and wake stages) and the rest.
type swap struct {
	seconds     float64
	engineSleep float64 // copy to tmpfs + free
	engineWake  float64 // alloc + copy + verify
	wakeAlloc   float64 // of which: take a region of the device pool
	// wrote is true when the sleep wrote the offload; false when it reused
	// the one kept since the engine's last wake (sim.Sleep.KeepOffload).
	wrote bool
}

// bound is the swap's physical bound: the bytes the sleep wrote ÷ the
// write bandwidth + the bytes the wake read ÷ the read bandwidth.
func (r row) bound(s swap) float64 {
	b := float64(r.size) / r.read.BytesPerSecond
	if s.wrote {
		b += float64(r.size) / r.write.BytesPerSecond
	}
	return b
}

type row struct {
	size              int64
	write, read       checkpoint.Bandwidth
	swaps             []swap
	burstySwaps       int
	burstyDrains      int
	inFlightSwaps     int
	requests, lost    int
	wakes, verified   int
	firstLost         string
	skipped, checkErr string
}

func main() {
	sizes := flag.String("sizes", "0.25GiB,1GiB", "comma-separated weight sizes per application")
	hotRoot := flag.String("hot-dir", "/dev/shm", "a directory on a tmpfs (the hot tier)")
	rounds := flag.Int("rounds", 3, "round-robin rounds (each a turn per application)")
	docs := flag.String("docs", "", "markdown file to update between the bench-mux markers")
	flag.Parse()
	if err := run(*sizes, *hotRoot, *docs, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench-mux:", err)
		os.Exit(1)
	}
}

func run(sizeList, hotRoot, docs string, rounds int) error {
	var sizes []int64
	for _, s := range strings.Split(sizeList, ",") {
		n, err := arena.ParseSize(s)
		if err != nil {
			return err
		}
		sizes = append(sizes, int64(n))
	}
	loadBefore := loadavg()
	start := time.Now()
	var rows []row
	for _, n := range sizes {
		fmt.Fprintf(os.Stderr, "measuring %s …\n", arena.Size(n))
		r, err := measure(n, hotRoot, rounds)
		if err != nil {
			return fmt.Errorf("%s: %w", arena.Size(n), err)
		}
		rows = append(rows, r)
	}
	table := render(rows, rounds, loadBefore, loadavg(), time.Since(start))
	fmt.Print(table)
	if docs != "" {
		if err := updateDocs(docs, table); err != nil {
			return err
		}
	}
	for _, r := range rows {
		if r.checkErr != "" || r.lost > 0 {
			return fmt.Errorf("%s: the seat group broke a rule (see the table)", arena.Size(r.size))
		}
	}
	return nil
}

func measure(n int64, hotRoot string, rounds int) (row, error) {
	r := row{size: n}
	// The seat's device pool keeps every engine's region (each loads its
	// weights at start, as a real engine does), and the sleeping engines'
	// hot copies sit beside it.
	need := int64(2*apps)*n + 2<<30
	if avail := memAvailable(); avail < need {
		r.skipped = fmt.Sprintf("skipped: %s available, %s needed", arena.Size(avail), arena.Size(need))
		return r, nil
	}
	hot, err := os.MkdirTemp(hotRoot, "mo-bench-mux-")
	if err != nil {
		return r, err
	}
	defer func() { _ = os.RemoveAll(hot) }()
	// The shared machine's bandwidth moves from one second to the next:
	// each side is the median of three probes.
	var writes, reads []checkpoint.Bandwidth
	for range 3 {
		w, err := measureWrite(hot, n)
		if err != nil {
			return r, err
		}
		rd, err := checkpoint.MeasureRead("tmpfs", hot, n, arena.FileOptions{})
		if err != nil {
			return r, err
		}
		writes, reads = append(writes, w), append(reads, rd)
	}
	r.write, r.read = medianBW(writes), medianBW(reads)
	runtime.GC()

	// Round-robin: every turn swaps; minResidency 0, so a swap waits only
	// for the turn before it to finish.
	g := seatgroup.Default("bench")
	g.MinResidency, g.MaxSwapWait, g.Tick = 0, time.Minute, 10*time.Millisecond
	swaps, rs, h, err := runHarness(n, hot, g, func(h *seatgrouptest.Harness) []seatgrouptest.Result {
		return h.RoundRobin(names(), rounds, 2, tokens)
	})
	if err != nil {
		return r, err
	}
	r.swaps = swaps
	r.note(h, rs)
	h.Close()
	runtime.GC()

	// Bursty: bursts to random applications overlap, so holders are busy
	// when others wait: swaps happen by draining.
	g.MinResidency, g.MaxSwapWait = 300*time.Millisecond, time.Second
	_, rs, h, err = runHarness(n, hot, g, func(h *seatgrouptest.Harness) []seatgrouptest.Result {
		return h.Bursty(names(), 7, 40, 4, tokens, 100*time.Millisecond)
	})
	if err != nil {
		return r, err
	}
	for _, ev := range h.Events() {
		switch {
		case ev.Kind == seatgroup.ActionWake && ev.SwapSeconds > 0:
			r.burstySwaps++
		case ev.Kind == seatgroup.ActionDrain:
			r.burstyDrains++
		}
	}
	r.note(h, rs)
	h.Close()
	// The next size maps regions of its own size.
	sim.ProcessDevice().Trim()
	return r, nil
}

// note adds a run's requests, losses, rule checks and verified wakes.
func (r *row) note(h *seatgrouptest.Harness, rs []seatgrouptest.Result) {
	r.requests += len(rs)
	for _, f := range seatgrouptest.Failed(rs) {
		r.lost++
		if r.firstLost == "" {
			r.firstLost = fmt.Sprintf("%s: %v", f.App, f.Err)
		}
	}
	for _, e := range h.Engines {
		_, _, n := e.Counts()
		r.inFlightSwaps += n
		if st, ok := e.Status(); ok {
			r.wakes += st.Wakes
			r.verified += st.Verified
		}
	}
	if err := h.CheckSwaps(); err != nil && r.checkErr == "" {
		r.checkErr = err.Error()
	}
}

func names() []string {
	var out []string
	for i := range apps {
		out = append(out, string(rune('a'+i)))
	}
	return out
}

// runHarness starts a group of four applications of n bytes, runs load,
// and returns the swaps it timed.
func runHarness(n int64, hot string, g seatgroup.Config, load func(*seatgrouptest.Harness) []seatgrouptest.Result) ([]swap, []seatgrouptest.Result, *seatgrouptest.Harness, error) {
	var mu sync.Mutex
	var swaps []swap
	var cur swap
	var h *seatgrouptest.Harness
	o := seatgrouptest.Options{Group: g, HotDir: hot, KeepOffload: true, TTFT: simTTFT, ITL: simITL, MaxConcurrency: 4}
	for _, name := range names() {
		o.Apps = append(o.Apps, seatgrouptest.AppOptions{Name: name, WeightsBytes: n})
	}
	o.OnEvent = func(ev seatgroup.Event) {
		mu.Lock()
		defer mu.Unlock()
		if h == nil {
			return // settling
		}
		st, _ := h.Engines[ev.App].Status()
		switch {
		case ev.Kind == seatgroup.ActionSleep && ev.Err == "" && st.LastSleep != nil:
			cur.engineSleep = st.LastSleep.TotalSeconds
			cur.wrote = !st.LastSleep.ReusedOffload
		case ev.Kind == seatgroup.ActionWake && ev.SwapSeconds > 0 && st.LastWake != nil:
			cur.seconds = ev.SwapSeconds
			cur.engineWake = st.LastWake.TotalSeconds
			cur.wakeAlloc = st.LastWake.AllocSeconds
			swaps = append(swaps, cur)
			cur = swap{}
		}
	}
	hh, err := seatgrouptest.Start(o)
	if err != nil {
		return nil, nil, nil, err
	}
	mu.Lock()
	h = hh
	mu.Unlock()
	rs := load(hh)
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(swaps), rs, hh, nil
}

// measureWrite writes n bytes to a new file on the tmpfs, as a level-1
// sleep does.
func measureWrite(dir string, n int64) (checkpoint.Bandwidth, error) {
	a, err := arena.New(n, arena.Options{})
	if err != nil {
		return checkpoint.Bandwidth{}, err
	}
	defer a.Free()
	arena.Synthesize(a.Bytes(), 3)
	path := dir + "/.write-probe"
	t := time.Now()
	err = arena.WriteFile(path, a.Bytes(), false)
	d := time.Since(t)
	_ = os.Remove(path)
	if err != nil {
		return checkpoint.Bandwidth{}, err
	}
	return checkpoint.Bandwidth{What: "tmpfs write", Bytes: n, Seconds: d.Seconds(), BytesPerSecond: float64(n) / d.Seconds(), Method: "write"}, nil
}

func medianBW(bs []checkpoint.Bandwidth) checkpoint.Bandwidth {
	slices.SortFunc(bs, func(a, b checkpoint.Bandwidth) int { return cmp.Compare(a.BytesPerSecond, b.BytesPerSecond) })
	return bs[len(bs)/2]
}

func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	return 0
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func render(rows []row, rounds int, loadBefore, loadAfter string, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`go run ./hack/bench-mux`: %d CPUs, load average %s before and %s after, %s in all. ", runtime.NumCPU(), loadBefore, loadAfter, took.Round(time.Second))
	fmt.Fprintf(&b, "Four in-process simulator applications per size (real synthetic weights of that size each, TTFT %v, %d tokens per request at %v each), each behind a real seat agent, share one seat (activeSeats 1) under the seatgroup executor, with the flags the chart renders for a seat group: sleep level 1 gives the weights' memory back to the seat's device pool after writing them to a tmpfs (the hot tier), or, when the offload its last wake kept is still that same file, without writing anything (`--keep-offload`); every wake reads them back into a region of the pool (already faulted in, as GPU memory stays on the device) and verifies every byte. The four engines share the process's one device pool, which keeps a region per engine from its start (each loads its weights at start). ", simTTFT, tokens, simITL)
	fmt.Fprintf(&b, "Round-robin: %d rounds of a turn per application, 2 requests a turn, minResidency 0. Bursty: 40 bursts of 1–4 requests to random applications, 0–100 ms apart, minResidency 300 ms, maxSwapWait 1 s. ", rounds)
	b.WriteString("A swap is timed by the executor from the start of the sleep to the end of the wake, and split into the simulators' own sleep (write to tmpfs unless reused, release the region) and wake (take a region, read, hash) and the rest (seat agents, drain check, memory reading); its bound is the bytes the wake read ÷ the tmpfs read bandwidth, plus, for a sleep that wrote, the bytes written ÷ the tmpfs write bandwidth, each bandwidth the median of three probes just before the runs. Bandwidths in GB/s (10^9 bytes/s).\n\n")
	b.WriteString("| Weights per application | tmpfs write | tmpfs read | bound per swap (sleep reused; wrote) | round-robin swaps (sleeps reused) | swap p50 | swap max | swap ÷ bound p50 (≤ 1.3) | swap ÷ bound max | swap ÷ bound p50, sleeps that reused | engine sleep p50 | engine wake p50 (of which alloc) | rest p50 | bursty swaps (drains) | swaps with requests in flight | requests lost or cut | wakes verified |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.skipped != "" {
			fmt.Fprintf(&b, "| %s | %s |%s\n", arena.Size(r.size), r.skipped, strings.Repeat("  |", 15))
			continue
		}
		var secs, ratios, reusedRatios, sl, wk, alloc, rest []float64
		for _, s := range r.swaps {
			secs = append(secs, s.seconds)
			ratio := s.seconds / r.bound(s)
			ratios = append(ratios, ratio)
			if !s.wrote {
				reusedRatios = append(reusedRatios, ratio)
			}
			sl = append(sl, s.engineSleep)
			wk = append(wk, s.engineWake)
			alloc = append(alloc, s.wakeAlloc)
			rest = append(rest, s.seconds-s.engineSleep-s.engineWake)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %.3f s; %.3f s | %d (%d) | %.3f s | %.3f s | %.2f | %.2f | %.2f | %.3f s | %.3f s (%.3f s) | %.3f s | %d (%d) | %d | %d of %d | %d/%d |\n",
			arena.Size(r.size), r.write.BytesPerSecond/1e9, r.read.BytesPerSecond/1e9, r.bound(swap{}), r.bound(swap{wrote: true}), len(r.swaps), len(reusedRatios),
			quantile(secs, 0.5), quantile(secs, 1), quantile(ratios, 0.5), quantile(ratios, 1), quantile(reusedRatios, 0.5),
			quantile(sl, 0.5), quantile(wk, 0.5), quantile(alloc, 0.5), quantile(rest, 0.5),
			r.burstySwaps, r.burstyDrains, r.inFlightSwaps, r.lost, r.requests, r.verified, r.wakes)
	}
	var notes []string
	for _, r := range rows {
		if r.firstLost != "" {
			notes = append(notes, fmt.Sprintf("%s: first lost request: %s", arena.Size(r.size), r.firstLost))
		}
		if r.checkErr != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", arena.Size(r.size), r.checkErr))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

func updateDocs(path, table string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, startMarker), strings.Index(s, endMarker)
	if i < 0 || j < i {
		return errors.New(path + " has no " + startMarker + " … " + endMarker + " section")
	}
	s = s[:i+len(startMarker)] + "\n" + table + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
