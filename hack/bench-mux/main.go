// Command bench-mux measures active-seat multiplexing against the
// hardware: four in-process simulator applications with real weights, each
// behind a real sidecar, share one seat (activeSeats 1) under the
// seatgroup executor, on a device (a shared device file, as in a group
// pod, on a huge-page tmpfs as an accelerator maps its memory in large
// pages) with room for fewer engines than the group serves. For each
// weight size it drives round-robin traffic (one swap per turn) with the
// probes (internal/tierprobe) read between turns, and bursty traffic, and
// reports each swap's time against the bound: mapping a region of the
// device + bytes in ÷ read rate + bytes out ÷ write rate of the run's
// fastest probes (no bytes out when the sleep reused the offload kept
// since the last wake), the swaps made
// while the swapped-out application had requests in flight, and the
// requests lost or cut. With -docs it writes the table between the
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
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/seatgroup/seatgrouptest"
	"github.com/model-orchestra/operator/internal/tierprobe"
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
	// cold is true when the wake started an engine that had not loaded
	// yet (it started stopped: the device had no room for it): it
	// generated and hashed its weights, it read no tier.
	cold bool
	// turn is the round-robin turn the swap served; read, write and
	// mapRegion are its bounds' probes: the run's fastest read, write and
	// mapping of a device region (taking a region of a device of the same
	// kind, as the wake's alloc does).
	turn        int
	read, write nodeapi.Bandwidth
	mapRegion   time.Duration
}

// bound is the swap's physical bound: mapping the wake's region of the
// device + the bytes the sleep wrote ÷ the write rate + the bytes the wake
// read ÷ the read rate, of the run's fastest probes.
func (s swap) bound(n int64) float64 {
	b := s.wakeBound(n).Seconds()
	if s.wrote {
		b += tierprobe.Bound(n, s.write).Seconds()
	}
	return b
}

// wakeBound is the engine wake's part of the bound: map a region, read
// the bytes into it.
func (s swap) wakeBound(n int64) time.Duration { return s.mapRegion + tierprobe.Bound(n, s.read) }

type row struct {
	size int64
	// capacity is the shared device's size: room for capacity ÷ size
	// engines' weights.
	capacity int64
	// write, read and mapRegion are the run's probes: the fastest of
	// those read between its turns (the hardware does not change from
	// one turn to the next, only the shared machine's load does).
	write, read nodeapi.Bandwidth
	mapRegion   time.Duration
	swaps       []swap
	// beaten lists the swaps or wakes that ran faster than their bound.
	beaten            []string
	burstySwaps       int
	burstyDrains      int
	inFlightSwaps     int
	requests, lost    int
	wakes, verified   int
	firstLost         string
	skipped, checkErr string
}

var (
	// deviceRoom is how many engines' weights the shared device holds.
	deviceRoom int
	deviceDir  string
	// deviceNote says what the device file's tmpfs is.
	deviceNote string
)

func main() {
	sizes := flag.String("sizes", "0.25GiB,1GiB", "comma-separated weight sizes per application")
	hotRoot := flag.String("hot-dir", "", "a directory on a tmpfs, the hot tier (empty: mount a huge-page tmpfs as the node agent does, or /dev/shm when that fails)")
	flag.StringVar(&deviceDir, "device-dir", "", "a directory on a tmpfs for the shared device file (empty: mount a huge-page tmpfs, as an accelerator maps its memory in large pages, or /dev/shm when that fails; /dev/shm is a plain tmpfs in 4 KiB pages, as a group pod's memory-backed emptyDir is today)")
	flag.IntVar(&deviceRoom, "device-room", 1, "engines' weights the shared device has room for (fewer than the 4 applications it serves)")
	rounds := flag.Int("rounds", 3, "round-robin rounds (each a turn per application)")
	docs := flag.String("docs", "", "markdown file to update between the bench-mux markers")
	flag.Parse()
	if deviceRoom < 1 || deviceRoom >= apps {
		fmt.Fprintf(os.Stderr, "bench-mux: --device-room %d: want 1 to %d (room for fewer engines than the %d applications)\n", deviceRoom, apps-1, apps)
		os.Exit(2)
	}
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
	hotNote := ""
	if hotRoot == "" {
		// The hot tier as the node agent mounts it (a group pod's
		// engines offload into the agent's hot tier): sized for every
		// engine's kept offload, the probe file and a write probe.
		mnt, err := os.MkdirTemp("", "mo-bench-mux-hotmnt-")
		if err != nil {
			return err
		}
		defer func() { _ = os.Remove(mnt) }()
		if _, err := nodeagent.MountHotTier(mnt, int64(apps+2)*slices.Max(sizes)+(64<<20)); err != nil {
			hotNote = fmt.Sprintf(" (a huge-page tmpfs could not be mounted: %v)", err)
			hotRoot = "/dev/shm"
		} else {
			defer func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) }()
			hotRoot = mnt
		}
	}
	hotNote = fmt.Sprintf("hot tier: tmpfs huge=%s%s", cmp.Or(nodeagent.HugePagesOf(hotRoot), "(not a tmpfs)"), hotNote)
	if deviceDir == "" {
		// The device and the probe's device of the largest size.
		mnt, err := os.MkdirTemp("", "mo-bench-mux-devmnt-")
		if err != nil {
			return err
		}
		defer func() { _ = os.Remove(mnt) }()
		if _, err := nodeagent.MountHotTier(mnt, int64(deviceRoom+1)*slices.Max(sizes)+(64<<20)); err != nil {
			deviceNote = fmt.Sprintf(" (a huge-page tmpfs could not be mounted: %v)", err)
			deviceDir = "/dev/shm"
		} else {
			defer func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) }()
			deviceDir = mnt
		}
	}
	deviceNote = fmt.Sprintf("device file: tmpfs huge=%s%s", cmp.Or(nodeagent.HugePagesOf(deviceDir), "never (plain tmpfs, 4 KiB pages)"), deviceNote)
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
	table := render(rows, rounds, loadBefore, loadavg(), time.Since(start), hotNote)
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

// probes are the probes read between two round-robin turns: the hot
// tier's read and write, and the mapping of a device region.
type probes struct {
	read, write nodeapi.Bandwidth
	mapRegion   time.Duration
}

func measure(n int64, hotRoot string, rounds int) (row, error) {
	r := row{size: n}
	// Every engine's kept offload, the shared device, the probe's region
	// and file, and a write probe.
	need := int64(apps+deviceRoom+3)*n + 2<<30
	if avail := memAvailable(); avail < need {
		r.skipped = fmt.Sprintf("skipped: %s available, %s needed", arena.Size(avail), arena.Size(need))
		return r, nil
	}
	hot, err := os.MkdirTemp(hotRoot, "mo-bench-mux-")
	if err != nil {
		return r, err
	}
	defer func() { _ = os.RemoveAll(hot) }()
	devDir, err := os.MkdirTemp(deviceDir, "mo-bench-mux-device-")
	if err != nil {
		return r, err
	}
	defer func() { _ = os.RemoveAll(devDir) }()
	// The group's device has room for deviceRoom engines' weights; the
	// probe reads into a region of a device of its own of the same kind
	// (a file on the same tmpfs, mapped shared and pre-faulted), kept for
	// the run as the group's device keeps its pages.
	probeDev, err := arena.OpenSharedDevice(filepath.Join(devDir, "probe"), n, "probe")
	if err != nil {
		return r, err
	}
	defer probeDev.Close()
	region, err := probeDev.Alloc(n)
	if err != nil {
		return r, err
	}
	defer func() { region.Free() }()
	arena.Synthesize(region.Bytes(), 3)
	probe, err := tierprobe.Write("tmpfs", hot, region, arena.FileOptions{})
	if err != nil {
		return r, err
	}
	defer probe.Close()
	readProbes := func() (probes, error) {
		var p probes
		var err error
		// Take a region of the probe's device as a wake takes one of the
		// group's: give the region back and map it again (mmap of the
		// device file and populating its pages, the bytes kept in the
		// file), the best of two.
		for k := range 2 {
			region.Free()
			t := time.Now()
			if region, err = probeDev.Alloc(n); err != nil {
				return p, err
			}
			if d := time.Since(t); k == 0 || d < p.mapRegion {
				p.mapRegion = d
			}
		}
		probe.Dst = region
		if p.read, err = probe.ReadBest(2); err != nil {
			return p, err
		}
		probe.Hash = true
		h, err := probe.ReadBest(2)
		probe.Hash = false
		if err != nil {
			return p, err
		}
		p.read = tierprobe.Peak(p.read, h)
		for range 2 {
			w, err := tierprobe.WriteRate("tmpfs", hot, region)
			if err != nil {
				return p, err
			}
			p.write = tierprobe.Peak(p.write, w)
		}
		return p, nil
	}
	o := seatgrouptest.Options{HotDir: hot, KeepOffload: true, TTFT: simTTFT, ITL: simITL, MaxConcurrency: 4}
	o.DeviceFile = filepath.Join(devDir, "pool")
	o.DeviceCapacity = int64(deviceRoom) * n
	r.capacity = o.DeviceCapacity
	for _, name := range names() {
		o.Apps = append(o.Apps, seatgrouptest.AppOptions{Name: name, WeightsBytes: n})
	}
	runtime.GC()

	// Round-robin: every turn swaps; minResidency 0, so a swap waits only
	// for the turn before it to finish. The probes are read before the
	// first turn and after each.
	o.Group = seatgroup.Default("bench")
	o.Group.MinResidency, o.Group.MaxSwapWait, o.Group.Tick = 0, time.Minute, 10*time.Millisecond
	var turn atomic.Int64
	var all []probes
	swaps, rs, h, err := runHarness(o, &turn, func(h *seatgrouptest.Harness) ([]seatgrouptest.Result, error) {
		var out []seatgrouptest.Result
		p, err := readProbes()
		if err != nil {
			return nil, err
		}
		all = append(all, p)
		for range rounds {
			for _, app := range names() {
				var chans []<-chan seatgrouptest.Result
				for range 2 {
					chans = append(chans, h.Dispatcher.Submit(app, tokens))
				}
				out = append(out, seatgrouptest.Collect(chans)...)
				if p, err = readProbes(); err != nil {
					return out, err
				}
				all = append(all, p)
				turn.Add(1)
			}
		}
		return out, nil
	})
	if err != nil {
		if h != nil {
			h.Close()
		}
		return r, err
	}
	r.mapRegion = all[0].mapRegion
	for _, p := range all {
		r.read, r.write = tierprobe.Peak(r.read, p.read), tierprobe.Peak(r.write, p.write)
		r.mapRegion = min(r.mapRegion, p.mapRegion)
	}
	for i := range swaps {
		s := &swaps[i]
		s.read, s.write, s.mapRegion = r.read, r.write, r.mapRegion
		if s.cold {
			continue
		}
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		what := fmt.Sprintf("turn %d's swap", s.turn)
		if err := tierprobe.Check(what, sec(s.seconds), sec(s.bound(n)), 0.05); err != nil {
			r.beaten = append(r.beaten, err.Error())
		}
		if err := tierprobe.Check(what+"'s engine wake", sec(s.engineWake), s.wakeBound(n), 0.05); err != nil {
			r.beaten = append(r.beaten, err.Error())
		}
	}
	r.swaps = swaps
	r.note(h, rs)
	h.Close()
	runtime.GC()

	// Bursty: bursts to random applications overlap, so holders are busy
	// when others wait: swaps happen by draining.
	o.Group.MinResidency, o.Group.MaxSwapWait = 300*time.Millisecond, time.Second
	_, rs, h, err = runHarness(o, &turn, func(h *seatgrouptest.Harness) ([]seatgrouptest.Result, error) {
		return h.Bursty(names(), 7, 40, 4, tokens, 100*time.Millisecond), nil
	})
	if err != nil {
		if h != nil {
			h.Close()
		}
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

// runHarness starts a group of four applications as o says, runs load,
// and returns the swaps it timed, each with the round-robin turn it
// served (turn, as the load sets it).
func runHarness(o seatgrouptest.Options, turn *atomic.Int64, load func(*seatgrouptest.Harness) ([]seatgrouptest.Result, error)) ([]swap, []seatgrouptest.Result, *seatgrouptest.Harness, error) {
	var mu sync.Mutex
	var swaps []swap
	var cur swap
	var h *seatgrouptest.Harness
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
			cur.turn = int(turn.Load())
			swaps = append(swaps, cur)
			cur = swap{}
		case ev.Kind == seatgroup.ActionWake && ev.SwapSeconds > 0 && st.Load != nil:
			// An engine stopped for want of room started on this wake.
			cur.seconds, cur.cold = ev.SwapSeconds, true
			cur.engineWake, cur.wakeAlloc = st.Load.TotalSeconds, st.Load.AllocSeconds
			cur.turn = int(turn.Load())
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
	rs, err := load(hh)
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(swaps), rs, hh, err
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

func render(rows []row, rounds int, loadBefore, loadAfter string, took time.Duration, hotNote string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`go run ./hack/bench-mux`: %d CPUs, load average %s before and %s after, %s in all; %s; %s. ", runtime.NumCPU(), loadBefore, loadAfter, took.Round(time.Second), hotNote, deviceNote)
	fmt.Fprintf(&b, "Four in-process simulator applications per size (real synthetic weights of that size each, TTFT %v, %d tokens per request at %v each), each behind a real sidecar, share one seat (activeSeats 1) under the seatgroup executor, with the flags the chart renders for a seat group: the engines share one device, a file on a tmpfs (`--device-file`, as the group pod's memory-backed emptyDir; here in huge pages, as an accelerator maps its memory in large pages and as bench-tiers' device is, unless the header says otherwise) with room for %d engine's weights (`--device-capacity`, the group's `deviceMemory`), so the engines that do not fit start stopped and load their weights at their first wake, and every later wake needs the room a sleep gave back; sleep level 1 writes the weights to the hot tier and gives their region back to the device, or, when the offload its last wake kept is still that same file, writes nothing (`--keep-offload`); every wake maps a region of the device and reads the weights back into it, verifying every byte. ", simTTFT, tokens, simITL, deviceRoom)
	fmt.Fprintf(&b, "Round-robin: %d rounds of a turn per application, 2 requests a turn, minResidency 0. Bursty: 40 bursts of 1–4 requests to random applications, 0–100 ms apart, minResidency 300 ms, maxSwapWait 1 s. ", rounds)
	b.WriteString("A swap is timed by the executor from the start of the sleep to the end of the wake, and split into the simulators' own sleep (write to tmpfs unless reused, release the region) and wake (map a region, read, hash) and the rest (sidecars, drain check, memory reading). Its bound is the mapping of a device region at the map probe's time, plus the bytes the wake read at the tier probe's read rate, plus, for a sleep that wrote, the bytes written at the probe's write rate: the probes (`internal/tierprobe`, shared with bench-tiers) are read before the first turn and after each (each the best of two), and every swap's bound uses the fastest of the run: a limit is the most the hardware delivers, the hardware does not change from one turn to the next, and another process on the shared machine only slows a probe down (a bound from the probes around one turn alone samples that turn's load). The map probe gives a region of a device of the same kind (a file on the same tmpfs as the group's device) back and takes it again, as a sleep and a wake do (mmap of the device file, populating its pages). The read probe reads a file as large as the weights, written on the hot tier as an offload is, into a region of a device of the same kind (a file on the same tmpfs, mapped shared, pre-faulted and kept), with the wake's read options, with a plain copy and with the wake's own copy-and-hash pass (the faster is the limit); the write probe writes that region into a new file on the hot tier as a sleep does. A cold start (an engine stopped for want of room loading its weights, generated from a seed, at its first wake) reads no tier and has no bound. The probe columns are the run's fastest. Bandwidths in GB/s (10^9 bytes/s).\n\n")
	b.WriteString("| Weights per application | device room (applications) | tmpfs write (probe) | tmpfs read (probe) | map a device region (probe) | bound per hot swap (sleep reused; wrote) | round-robin swaps: hot (sleeps reused), cold starts | hot swap p50 | hot swap max | hot swap ÷ bound p50 (≤ 1.3) | hot swap ÷ bound max | hot swap ÷ bound p50, sleeps that reused | engine sleep p50 | engine wake p50 (of which alloc) | rest p50 | cold start p50 | bursty swaps (drains) | swaps with requests in flight | requests lost or cut | wakes verified |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.skipped != "" {
			fmt.Fprintf(&b, "| %s | %s |%s\n", arena.Size(r.size), r.skipped, strings.Repeat("  |", 18))
			continue
		}
		var secs, ratios, reusedRatios, sl, wk, alloc, rest, cold []float64
		hot := 0
		for _, s := range r.swaps {
			if s.cold {
				cold = append(cold, s.seconds)
				continue
			}
			hot++
			secs = append(secs, s.seconds)
			ratio := s.seconds / s.bound(r.size)
			ratios = append(ratios, ratio)
			if !s.wrote {
				reusedRatios = append(reusedRatios, ratio)
			}
			sl = append(sl, s.engineSleep)
			wk = append(wk, s.engineWake)
			alloc = append(alloc, s.wakeAlloc)
			rest = append(rest, s.seconds-s.engineSleep-s.engineWake)
		}
		readBound := (r.mapRegion + tierprobe.Bound(r.size, r.read)).Seconds()
		fmt.Fprintf(&b, "| %s | %s (%d of %d) | %.2f | %.2f | %.1f ms | %.3f s; %.3f s | %d (%d), %d | %.3f s | %.3f s | %.2f | %.2f | %.2f | %.3f s | %.3f s (%.3f s) | %.3f s | %.3f s | %d (%d) | %d | %d of %d | %d/%d |\n",
			arena.Size(r.size), arena.Size(r.capacity), r.capacity/r.size, apps, r.write.BytesPerSecond/1e9, r.read.BytesPerSecond/1e9, float64(r.mapRegion)/float64(time.Millisecond),
			readBound, readBound+tierprobe.Bound(r.size, r.write).Seconds(), hot, len(reusedRatios), len(cold),
			quantile(secs, 0.5), quantile(secs, 1), quantile(ratios, 0.5), quantile(ratios, 1), quantile(reusedRatios, 0.5),
			quantile(sl, 0.5), quantile(wk, 0.5), quantile(alloc, 0.5), quantile(rest, 0.5), quantile(cold, 0.5),
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
		for _, x := range r.beaten {
			notes = append(notes, fmt.Sprintf("%s: beat its bound by more than 5 %% (the probe is then not the limit): %s", arena.Size(r.size), strings.TrimPrefix(x, tierprobe.ErrBeaten.Error()+": ")))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n\n") + "\n")
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
