// Command bench-tiers measures how close the simulator's wakes run to the
// hardware, per tier, in one run on one machine: memcpy bandwidth, tmpfs
// read bandwidth, the disk's raw sequential read bandwidth (O_DIRECT), the
// S3 fake's bandwidth over loopback, and an in-process orchestra-sim's wake
// from the hot (tmpfs), warm (disk) and cold (model file on disk) tiers,
// every wake hash-verified. It prints the ratios the checkpoint agent is
// held to, with the load average, and with -docs writes the table between
// the <!-- bench-tiers:start --> and <!-- bench-tiers:end --> markers.
//
//	go run ./hack/bench-tiers --sizes 0.25GiB,1GiB,4GiB
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/checkpoint/arena"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/s3test"
	"github.com/model-orchestra/operator/internal/sim"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

var (
	asleep time.Duration
	// hotWakesPerRun is how many times a run sleeps and wakes the engine
	// from the hot tier.
	hotWakesPerRun int
	// servesFor is how long the engine is up, serving, between its load and
	// its first sleep.
	servesFor time.Duration
)

// memcpyBytes is the most memcpy copies in one measurement.
const memcpyBytes = 1 << 30

const (
	startMarker = "<!-- bench-tiers:start -->"
	endMarker   = "<!-- bench-tiers:end -->"
	simTTFT     = 10 * time.Millisecond
)

type row struct {
	size int64
	// memcpy is the peak of memcpy1 (one thread) and memcpy2 (the
	// restore's workers), those of the hot wake whose ratio is the median
	// (hotWake): this VM's memory bandwidth moves by half from one minute
	// to the next, so the hot ratios compare a wake with copies that
	// bracket it. disk is the peak of its two O_DIRECT reads likewise.
	memcpy, memcpy1, memcpy2 checkpoint.Bandwidth
	// hashedCopy is the hot restore's verified copy between two
	// pre-faulted arenas (arena.VerifiedCopy: each 1 MiB chunk copied and
	// hashed with XXH3 in one pass): the most a verified restore can do
	// from a source as fast as memory.
	hashedCopy checkpoint.Bandwidth
	fresh, s3  checkpoint.Bandwidth
	// tmpfs is the tier probe of the hot wake whose ratio is the median
	// (hotWake.probe): the offload itself read, without a hash, into a
	// region of the engine's device kept for the run, right before that
	// wake and right before the next (tierprobe).
	tmpfs              checkpoint.Bandwidth
	disk, disk1, disk2 checkpoint.Bandwidth
	// warmRaw is the O_DIRECT read of the warm copy itself, right before
	// and right after the warm wake (both reads as one): the shared
	// disk's bandwidth moves by 3× from one minute to the next, so the
	// ratio compares the wake with reads that bracket it. warmRaw1 is
	// one reader, warmRaw2 the restore's readers; warmRaw the faster.
	warmRaw, warmRaw1, warmRaw2 checkpoint.Bandwidth
	hot, warm, cold             *sim.StageReport
	// hotKernel is the hot wake of a simulator whose sleep returns the
	// memory to the kernel (--device-memory=kernel), the model before the
	// device pool.
	hotKernel *sim.StageReport
	// ttftHot is the time to first token after the hot wake, ttftBound
	// what the bytes at the tier probe's rate and the simulator's TTFT
	// alone would take.
	ttftHot, ttftBound time.Duration
	// warmBeaten and hotBeaten count the wakes that ran faster than
	// their probe (tierprobe.Check): the probe is then not the limit.
	hotBeaten, warmBeaten []string
	// hotWakes are the run's hot sleeps and wakes, in order; hot,
	// memcpy and the hot ratio are those of the wake whose ratio is the
	// median, the time to first token and its bound likewise.
	hotWakes []hotWake
	// idleWake is one more hot wake, straight after the pause, outside
	// the ratios.
	idleWake hotWake
	// snap is the process snapshot round trip, where criu works.
	snap *snapshot
	// each is every run, in order, as measured (median keeps them).
	each []row
	// ratio holds this run's ratios, each of a restore and the
	// bandwidth measured around it; the table gives their medians.
	ratio           ratios
	wakes, verified int
	skipped         string
	runs            int
}

// hotNote lists the run's hot wakes: each one's hot and time to first
// token ratios, the least share of an offload in huge pages, the most
// steal.
func (r row) hotNote() string {
	var hot, ttft []string
	huge, steal := 1.0, 0.0
	for _, h := range r.hotWakes {
		hot = append(hot, fmt.Sprintf("%.2f/%.2f", h.ratio(), h.probeRatio()))
		ttft = append(ttft, fmt.Sprintf("%.2f", h.ttftRatio()))
		huge, steal = min(huge, h.huge), max(steal, h.steal)
	}
	out := fmt.Sprintf("hot ÷ memcpy/÷ probe %s, TTFT %s (%.0f %% huge, %.0f %% stolen)", strings.Join(hot, " "), strings.Join(ttft, " "), 100*huge, 100*steal)
	if i := r.idleWake; i.rep != nil {
		out += fmt.Sprintf(", straight after the pause hot %.2f, TTFT %.2f", i.ratio(), i.ttftRatio())
	}
	return out
}

// hotWake is one level-1 sleep and hot wake, with the memcpy measured
// around the wake (measureHot).
type hotWake struct {
	rep                      *sim.StageReport
	memcpy, memcpy1, memcpy2 checkpoint.Bandwidth
	// probe is the tier probe around the wake: the fastest of two reads
	// of the offload right before the wake and two right after.
	probe           checkpoint.Bandwidth
	ttft, ttftBound time.Duration
	// huge is the share of the tier file (the level-1 offload) in huge
	// pages, from ShmemHugePages around the sleep that wrote it.
	huge float64
	// steal is the share of the CPU time the hypervisor took while the
	// wake ran.
	steal float64
}

func (h hotWake) ratio() float64 { return restoreBW(h.rep) / h.memcpy.BytesPerSecond }

func (h hotWake) ttftRatio() float64 { return float64(h.ttft) / float64(h.ttftBound) }

// probeRatio is the wake's restore over the tier probe around it: at most
// 1 where the probe is the limit.
func (h hotWake) probeRatio() float64 { return restoreBW(h.rep) / h.probe.BytesPerSecond }

// ttftMemcpyRatio is the time to first token over bytes ÷ memcpy + the
// simulator's TTFT, the bound of earlier runs (memcpy is no slower than
// the tier probe: a stricter bound, not a physical one).
func (h hotWake) ttftMemcpyRatio() float64 {
	return float64(h.ttft) / float64(time.Duration(float64(h.rep.Bytes)/h.memcpy.BytesPerSecond*float64(time.Second))+simTTFT)
}

// medianBy is the element of xs whose key is the median (the upper one
// of an even count).
func medianBy[T any](xs []T, key func(T) float64) T {
	sorted := slices.Clone(xs)
	slices.SortStableFunc(sorted, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return sorted[len(sorted)/2]
}

// ratios are one run's figures against the targets.
type ratios struct {
	hot, kernel, warm, ttft float64
	// probe is the hot restore over its tier probe; ttftMemcpy the time
	// to first token over the memcpy-based bound of earlier runs.
	probe, ttftMemcpy float64
	// snapshot is the process snapshot's restore over the hot restore
	// with memory returned to the kernel, both into fresh memory (0
	// without one).
	snapshot float64
}

// withRatios sets the run's ratios from its measurements: the hot ratio
// and the time to first token's are the medians of its hot wakes' own.
func (r row) withRatios() row {
	h := medianBy(r.hotWakes, hotWake.ratio)
	r.hot, r.memcpy, r.memcpy1, r.memcpy2 = h.rep, h.memcpy, h.memcpy1, h.memcpy2
	r.tmpfs = medianBy(r.hotWakes, hotWake.probeRatio).probe
	f := medianBy(r.hotWakes, hotWake.ttftRatio)
	r.ttftHot, r.ttftBound = f.ttft, f.ttftBound
	r.ratio = ratios{
		hot:        h.ratio(),
		probe:      medianBy(r.hotWakes, hotWake.probeRatio).probeRatio(),
		kernel:     restoreBW(r.hotKernel) / r.memcpy.BytesPerSecond,
		warm:       restoreBW(r.warm) / r.warmRaw.BytesPerSecond,
		ttft:       f.ttftRatio(),
		ttftMemcpy: medianBy(r.hotWakes, hotWake.ttftMemcpyRatio).ttftMemcpyRatio(),
	}
	if r.snap != nil {
		r.ratio.snapshot = r.snap.bytesPerSecond(r.size) / restoreBW(r.hotKernel)
	}
	return r
}

func main() {
	// Descriptors inherited from the caller (make's flock holds one on
	// the lock file) stay out of every process the benchmark starts: criu
	// refuses to dump a process holding a file lock it was not told about.
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if spec := os.Getenv(snapshotHelperEnv); spec != "" {
		// The helper runs until it is killed; it returns only on error.
		fmt.Fprintln(os.Stderr, "bench-tiers snapshot helper:", runSnapshotHelper(spec))
		os.Exit(1)
	}
	sizes := flag.String("sizes", "0.25GiB,1GiB,4GiB", "comma-separated weight sizes")
	hotRoot := flag.String("hot-dir", "", "a directory on a tmpfs (empty: mount a huge-page tmpfs as the node agent does, or /dev/shm when that fails)")
	diskRoot := flag.String("disk-dir", "/var/tmp", "a directory on the node's disk (not a tmpfs)")
	docs := flag.String("docs", "", "markdown file to update between the bench-tiers markers")
	repeat := flag.Int("repeat", 3, "runs per size; each column reports its median run")
	flag.IntVar(&hotWakesPerRun, "hot-wakes", 9, "hot sleeps and wakes per run; the run's hot and time to first token ratios are their medians")
	flag.DurationVar(&servesFor, "serves-for", 30*time.Second, "how long the engine is up, serving, after it loads and before its first sleep (a real engine sleeps after lifecycle.sleepAfter without requests, never straight after its load; on a VM, memory faulted in seconds ago can copy slower while the host settles it)")
	flag.DurationVar(&asleep, "asleep", 3*time.Second, "how long the engine sleeps before each wake (a real sleep lasts minutes; a VM's free page reporting hands freed memory back to the host after about 2 s)")
	flag.Parse()
	if err := run(*sizes, *hotRoot, *diskRoot, *docs, *repeat); err != nil {
		fmt.Fprintln(os.Stderr, "bench-tiers:", err)
		os.Exit(1)
	}
}

func run(sizeList, hotRoot, diskRoot, docs string, repeat int) error {
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
		mnt, err := os.MkdirTemp("", "mo-bench-tiers-hotmnt-")
		if err != nil {
			return err
		}
		defer func() { _ = os.Remove(mnt) }()
		// Sized for the largest size's offload plus the tmpfs probe.
		biggest := slices.Max(sizes)
		if _, err := checkpoint.MountHotTier(mnt, 2*biggest+(64<<20)); err != nil {
			hotNote = fmt.Sprintf(" (a huge-page tmpfs could not be mounted: %v)", err)
			hotRoot = "/dev/shm"
		} else {
			defer func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) }()
			hotRoot = mnt
		}
	}
	hot, err := os.MkdirTemp(hotRoot, "mo-bench-tiers-hot-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(hot) }()
	hotNote = fmt.Sprintf("hot tier: tmpfs huge=%s%s", cmp.Or(checkpoint.HugePagesOf(hot), "(not a tmpfs)"), hotNote)
	criu := checkpoint.CRIU{Bin: "criu", Report: checkpoint.ProbeCRIU(context.Background(), "criu")}
	disk, err := os.MkdirTemp(diskRoot, "mo-bench-tiers-disk-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(disk) }()

	loadBefore := loadavg()
	start := time.Now()
	var rows []row
	for _, n := range sizes {
		var runs []row
		for i := range max(repeat, 1) {
			fmt.Fprintf(os.Stderr, "measuring %s, run %d …\n", arena.Size(n), i+1)
			r, err := measure(n, hot, disk, criu)
			if err != nil {
				return fmt.Errorf("%s: %w", arena.Size(n), err)
			}
			runs = append(runs, r)
			if r.skipped != "" {
				break
			}
			fmt.Fprintf(os.Stderr, "  hot ÷ memcpy %.2f, each wake %s; warm ÷ raw read %.2f (%s ÷ %s GB/s; alloc+copy+verify %.3f+%.3f+%.3f s); TTFT ÷ bound %.2f\n",
				r.ratio.hot, r.hotNote(), r.ratio.warm, gbps(restoreBW(r.warm)), gbps(r.warmRaw.BytesPerSecond), r.warm.AllocSeconds, r.warm.CopySeconds, r.warm.VerifySeconds, r.ratio.ttft)
		}
		rows = append(rows, median(runs))
	}
	table := render(rows, loadBefore, loadavg(), time.Since(start), hotNote, criu.Report)
	fmt.Print(table)
	if docs != "" {
		return updateDocs(docs, table)
	}
	return nil
}

func memAvailable() int64 { return meminfo("MemAvailable") }

// cpuTimes are the steal and total ticks of all CPUs (/proc/stat).
type cpuTimes struct{ steal, total int64 }

func cpuSteal() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var t cpuTimes
	for i, x := range f[1:] {
		n, _ := strconv.ParseInt(x, 10, 64)
		t.total += n
		if i == 7 { // user nice system idle iowait irq softirq steal
			t.steal = n
		}
	}
	return t
}

// since is the share of the ticks since t0 that were stolen.
func (t cpuTimes) since(t0 cpuTimes) float64 {
	if t.total <= t0.total {
		return 0
	}
	return float64(t.steal-t0.steal) / float64(t.total-t0.total)
}

// meminfo is the field key of /proc/meminfo in bytes; 0 if missing.
func meminfo(key string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), key+": %d kB", &kb); n == 1 {
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
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func measure(n int64, hot, disk string, criu checkpoint.CRIU) (row, error) {
	r := row{size: n}
	// The baselines copy and read into memory of the kind a restore lands
	// in, a device region: pre-faulted, in huge pages. memcpy copies
	// between one pair of at most memcpyBytes, kept for the run, so every
	// copy uses the same pages (far larger than any cache, it copies at
	// the speed of larger ones); reads land in an arena as large as the
	// file, made for the reads around a stage and freed before the next,
	// so the hot tier's offload finds the free huge pages the node would
	// give it.
	m := min(n, memcpyBytes)
	// At most memcpy's source and three copies of the weights are held
	// at once: the engine's region, its offload and the probe's region.
	if need := m + 3*n + (2 << 30); memAvailable() < need {
		r.skipped = fmt.Sprintf("skipped: %s available, %s needed", arena.Size(memAvailable()), arena.Size(need))
		return r, nil
	}
	// The engine's own device: its memory is mapped and faulted in when
	// first used, kept while the engine sleeps, and unmapped when it is
	// done. Its first region, kept for the run, is the tier probe's
	// destination (a restore lands in a region of the same device) and
	// memcpy's.
	dev := arena.NewDevice(0)
	defer dev.Trim()
	dst, err := dev.Alloc(n)
	if err != nil {
		return r, err
	}
	defer dst.Free()
	src, err := arena.New(m, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return r, err
	}
	defer src.Free()
	arena.Synthesize(src.Bytes(), 2)
	r.hashedCopy = measureHashedCopy(dst, src)
	// Fresh memory as a wake finds it: freed, then left alone as long as
	// the engine sleeps.
	if err := freeAndWait(n); err != nil {
		return r, err
	}
	if r.fresh, err = checkpoint.MeasureFault(n); err != nil {
		return r, err
	}
	if err := measureReads(&r, n, disk); err != nil {
		return r, err
	}
	runtime.GC()
	if err := measureSim(&r, n, hot, disk, dev, src, dst); err != nil {
		return r, err
	}
	if criu.Report.CheckPassed {
		s, err := measureSnapshot(criu, n, hot)
		if err != nil {
			return r, fmt.Errorf("process snapshot: %w", err)
		}
		r.snap = &s
	}
	return r.withRatios(), nil
}

// measureReads measures the disk's read and the S3 fake's, each into one
// arena of n bytes in huge pages (reference columns, not bounds: the
// bounds are the tier probes around each wake).
func measureReads(r *row, n int64, disk string) error {
	dst, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return err
	}
	defer dst.Free()
	if r.disk1, r.disk2, err = measureDisk(disk, dst); err != nil {
		return err
	}
	r.disk = checkpoint.Peak(r.disk1, r.disk2)
	r.s3, err = measureS3(dst)
	return err
}

// measureHashedCopy copies src into dst with arena.VerifiedCopy, the hot
// restore's copy and hash of each chunk.
func measureHashedCopy(dst, src *arena.Arena) checkpoint.Bandwidth {
	n := src.Len()
	start := time.Now()
	_ = arena.VerifiedCopy(dst.Bytes(), src.Bytes())
	t := time.Since(start)
	return checkpoint.Bandwidth{What: "memcpy + XXH3", Bytes: n, Seconds: t.Seconds(), BytesPerSecond: float64(n) / t.Seconds(),
		Method: fmt.Sprintf("copy and hash each 1 MiB chunk (arena.VerifiedCopy), %d threads", arena.DefaultWorkers())}
}

// measureDisk writes a probe as large as a on the disk and reads it as
// rawReads does.
func measureDisk(dir string, a *arena.Arena) (one, restore checkpoint.Bandwidth, err error) {
	path, err := checkpoint.WriteProbe(dir, a.Len())
	if err != nil {
		return one, restore, fmt.Errorf("writing a %d-byte probe in %s: %w", a.Len(), dir, err)
	}
	defer func() { _ = os.Remove(path) }()
	return rawReads(a, "disk", path, false)
}

// freeAndWait touches n bytes, frees them and waits as long as an engine
// sleeps, so the fresh-memory probe gets the pages a wake would get.
func freeAndWait(n int64) error {
	a, err := arena.New(n, arena.Options{})
	if err != nil {
		return err
	}
	a.Free()
	time.Sleep(asleep)
	return nil
}

// measureS3 GETs an object as large as dst from the in-repo S3 fake over
// loopback into dst.
func measureS3(dst *arena.Arena) (checkpoint.Bandwidth, error) {
	n := dst.Len()
	src, err := arena.New(n, arena.Options{})
	if err != nil {
		return checkpoint.Bandwidth{}, err
	}
	defer src.Free()
	arena.Synthesize(src.Bytes(), 5)
	s := s3test.New("")
	defer s.Close()
	s.Put("models", "w.bin", fetchtest.Bytes(src.Bytes()))
	clear(dst.Bytes()[:4096]) // an earlier read left other bytes there
	t := time.Now()
	resp, err := http.Get(s.URL() + "/models/w.bin")
	if err != nil {
		return checkpoint.Bandwidth{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return checkpoint.Bandwidth{}, fmt.Errorf("s3 fake answered %d", resp.StatusCode)
	}
	if _, err := io.ReadFull(resp.Body, dst.Bytes()); err != nil {
		return checkpoint.Bandwidth{}, err
	}
	d := time.Since(t)
	if !bytes.Equal(dst.Bytes()[:4096], src.Bytes()[:4096]) {
		return checkpoint.Bandwidth{}, errors.New("s3 fake returned other bytes")
	}
	return checkpoint.Bandwidth{What: "s3 fake", Bytes: n, Seconds: d.Seconds(), BytesPerSecond: float64(n) / d.Seconds(), Method: "HTTP GET over loopback"}, nil
}

// measureSim wakes an in-process simulator holding n bytes from each tier.
// The cold tier is the weights file the simulator loaded at start (on disk,
// as the model cache is); the warm tier is a copy in the disk directory; the
// hot tier is the level-1 offload on the tmpfs.
func measureSim(r *row, n int64, hot, disk string, dev *arena.Device, src, dst *arena.Arena) error {
	model := filepath.Join(disk, "model.bin")
	w, err := arena.New(n, arena.Options{})
	if err != nil {
		return err
	}
	arena.Synthesize(w.Bytes(), 11)
	err = arena.WriteFile(model, w.Bytes(), true)
	w.Free()
	if err != nil {
		return err
	}
	_ = checkpoint.DropCache(model) // read past the page cache, like the tiers
	defer func() { _ = os.Remove(model) }()
	warmDir := filepath.Join(disk, "warm")
	if err := os.MkdirAll(warmDir, 0o700); err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(warmDir) }()

	cfg := sim.Default()
	cfg.TimeToFirstToken, cfg.InterTokenLatency, cfg.OutputTokens = simTTFT, 0, 4
	cfg.Weights = sim.Weights{File: model}
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: hot, WarmDir: warmDir}
	s := sim.New(cfg, sim.WithLogger(slog.New(slog.DiscardHandler)), sim.WithDevice(dev))
	if err := s.LoadWeights(); err != nil {
		return err
	}
	defer s.Close()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	// The engine serves first: it answers, then idles until its first sleep.
	if _, err := firstToken(srv.URL); err != nil {
		return err
	}
	time.Sleep(servesFor)

	// Hot: hotWakesPerRun times, level 1 offloads to the tmpfs, the
	// engine sleeps, and the wake and the first token are timed between
	// tier probe reads of the same offload. Then once more with the wake
	// straight after the pause.
	for range hotWakesPerRun {
		h, err := measureHot(s, srv.URL, n, dev, src, dst, false)
		if err != nil {
			return err
		}
		took := time.Duration(restoreSeconds(h.rep) * float64(time.Second))
		if err := tierprobe.Check("hot wake", took, tierprobe.Bound(n, h.probe), 0.05); err != nil {
			r.hotBeaten = append(r.hotBeaten, err.Error())
		}
		r.hotWakes = append(r.hotWakes, h)
	}
	if r.idleWake, err = measureHot(s, srv.URL, n, dev, src, dst, true); err != nil {
		return err
	}

	// Warm: level 2, a copy on disk, its page cache dropped. Its raw
	// reads (the warm tier's probe) land in the probe's region of the
	// engine's device, as the restore lands in the engine's.
	if _, err := s.Sleep(2); err != nil {
		return err
	}
	rd := dst
	warm := filepath.Join(warmDir, cfg.WeightsName())
	if err := copyFile(model, warm); err != nil {
		return err
	}
	before1, before2, err := rawReads(rd, "warm raw", warm, false)
	if err != nil {
		return err
	}
	_ = checkpoint.DropCache(warm)
	time.Sleep(asleep)
	if r.warm, err = wake(srv.URL); err != nil {
		return err
	}
	if r.warm.Tier != sim.TierWarm {
		return fmt.Errorf("the warm wake came from %s", r.warm.Tier)
	}
	after1, after2, err := rawReads(rd, "warm raw", warm, true)
	if err != nil {
		return err
	}
	r.warmRaw1, r.warmRaw2 = tierprobe.Peak(before1, after1), tierprobe.Peak(before2, after2)
	r.warmRaw = checkpoint.Peak(r.warmRaw1, r.warmRaw2)
	if err := tierprobe.Check("warm wake", time.Duration(restoreSeconds(r.warm)*float64(time.Second)), tierprobe.Bound(n, r.warmRaw), 0.05); err != nil {
		r.warmBeaten = append(r.warmBeaten, err.Error())
	}

	// Cold: level 2, no copy in hot or warm: the model file.
	if err := os.Remove(warm); err != nil {
		return err
	}
	if _, err := s.Sleep(2); err != nil {
		return err
	}
	_ = checkpoint.DropCache(model)
	time.Sleep(asleep)
	if r.cold, err = wake(srv.URL); err != nil {
		return err
	}
	st := s.WeightsStatus()
	r.wakes, r.verified = st.Wakes, st.Verified
	srv.Close()
	s.Close()
	return measureHotKernel(r, n, hot)
}

// measureHot runs one level-1 sleep and hot wake of s, and times the wake
// and its first token. After the sleep's pause: memcpy, then the tier
// probe, two reads of the offload the wake will read (the same file, the
// same pages) into dst, a region of the engine's device; then the wake and
// its first token; then the probe again (the offload, which the wake
// unlinks, is read through a second link the probe holds meanwhile) and
// memcpy again. The probe's bound is its fastest read. memcpy comes first:
// on a VM the first tens of milliseconds after an idle pause run slower
// (the host's cores ramp up), and the copy before the wake takes that ramp
// (it counts with the copy after the wake). With idle, the wake comes
// straight after the pause, with the cores as the pause left them, and
// memcpy and the probe are only measured after it.
func measureHot(s *sim.Simulator, url string, n int64, dev *arena.Device, src, dst *arena.Arena, idle bool) (hotWake, error) {
	var h hotWake
	huge := meminfo("ShmemHugePages")
	sl, err := s.Sleep(1)
	if err != nil {
		return h, err
	}
	h.huge = float64(meminfo("ShmemHugePages")-huge) / float64(n)
	time.Sleep(asleep)
	link := sl.Source + ".probe"
	if err := os.Link(sl.Source, link); err != nil {
		return h, fmt.Errorf("a second link to the offload for the tier probe: %w", err)
	}
	defer func() { _ = os.Remove(link) }()
	// Both ways to copy out of the tier: a plain copy and the restore's
	// own copy-and-hash pass (non-temporal stores); the faster is the
	// limit. Before the wake the probe reads into the engine's own
	// region (the device's only free region while the engine sleeps, the
	// very pages the wake fills), after it into the probe's region: on
	// this VM a region's pages can copy slower for seconds while the host
	// settles them, and the wake is bounded by the pages it lands in.
	read := func(into *arena.Arena) (checkpoint.Bandwidth, error) {
		var best checkpoint.Bandwidth
		for _, hash := range []bool{false, true} {
			p := tierprobe.Of("tmpfs", link, into, arena.FileOptions{})
			p.Hash = hash
			b, err := p.ReadBest(3)
			if err != nil {
				return best, err
			}
			best = tierprobe.Peak(best, b)
		}
		return best, nil
	}
	var before1, before2, before checkpoint.Bandwidth
	if !idle {
		before1, before2 = checkpoint.MeasureMemcpyBetween(dst, src)
		region, err := dev.Alloc(n)
		if err != nil {
			return h, err
		}
		before, err = read(region)
		region.Free()
		if err != nil {
			return h, err
		}
	}
	steal0 := cpuSteal()
	t0 := time.Now()
	if h.rep, err = wake(url); err != nil {
		return h, err
	}
	h.steal = cpuSteal().since(steal0)
	first, err := firstToken(url)
	if err != nil {
		return h, err
	}
	h.ttft = first.Sub(t0)
	after, err := read(dst)
	if err != nil {
		return h, err
	}
	h.probe = tierprobe.Peak(before, after)
	h.ttftBound = tierprobe.Bound(n, h.probe) + simTTFT
	h.memcpy1, h.memcpy2 = checkpoint.MeasureMemcpyBetween(dst, src)
	if !idle {
		h.memcpy1, h.memcpy2 = tierprobe.Around(before1, h.memcpy1), tierprobe.Around(before2, h.memcpy2)
	}
	h.memcpy = checkpoint.Peak(h.memcpy1, h.memcpy2)
	return h, nil
}

// measureHotKernel runs one level-1 cycle of a simulator whose sleep
// returns its memory to the kernel, as every sleep did before the device
// pool: its wake faults fresh memory in as it reads.
func measureHotKernel(r *row, n int64, hot string) error {
	cfg := sim.Default()
	cfg.Model = "sim-kernel"
	cfg.Weights = sim.Weights{Bytes: n, Seed: 11}
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: hot}
	cfg.DeviceMemory = sim.DeviceMemoryKernel
	s := sim.New(cfg, sim.WithLogger(slog.New(slog.DiscardHandler)))
	if err := s.LoadWeights(); err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Sleep(1); err != nil {
		return err
	}
	time.Sleep(asleep)
	rep, err := s.WakeUp(context.Background())
	if err != nil {
		return err
	}
	if !rep.Verified {
		return errors.New("the returned-to-the-kernel hot wake was not verified")
	}
	r.hotKernel = rep
	st := s.WeightsStatus()
	r.wakes += st.Wakes
	r.verified += st.Verified
	return nil
}

func wake(base string) (*sim.StageReport, error) {
	resp, err := http.Post(base+"/wake_up", "", nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("wake_up: %d %s", resp.StatusCode, b)
	}
	var rep sim.StageReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, err
	}
	if !rep.Verified {
		return nil, fmt.Errorf("wake from %s not verified", rep.Tier)
	}
	return &rep, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// median takes, for every column on its own, the median of the runs; the
// verification counts are summed.
func median(runs []row) row {
	// A run skipped for want of memory ends the size's runs; the runs
	// before it are the size's figures.
	if i := slices.IndexFunc(runs, func(r row) bool { return r.skipped != "" }); i > 0 {
		runs = runs[:i]
	}
	runs[0].each = slices.Clone(runs)
	if len(runs) == 1 || runs[0].skipped != "" {
		runs[0].runs = 1
		return runs[0]
	}
	pick := func(key func(row) float64) row { return medianBy(runs, key) }
	out := runs[0]
	// memcpy and the hot restore are those of the run whose hot ratio is
	// the median, as within a run.
	h := pick(func(r row) float64 { return r.ratio.hot })
	out.memcpy, out.memcpy1, out.memcpy2, out.hot = h.memcpy, h.memcpy1, h.memcpy2, h.hot
	out.hashedCopy = pick(func(r row) float64 { return r.hashedCopy.BytesPerSecond }).hashedCopy
	out.fresh = pick(func(r row) float64 { return r.fresh.BytesPerSecond }).fresh
	// The tier probe is that of the run whose hot ÷ probe is the median.
	p := pick(func(r row) float64 { return r.ratio.probe })
	out.tmpfs = p.tmpfs
	d := pick(func(r row) float64 { return r.disk.BytesPerSecond })
	out.disk, out.disk1, out.disk2 = d.disk, d.disk1, d.disk2
	out.s3 = pick(func(r row) float64 { return r.s3.BytesPerSecond }).s3
	out.hotKernel = pick(func(r row) float64 { return restoreBW(r.hotKernel) }).hotKernel
	// The warm restore and the raw reads around it stay paired.
	w := pick(func(r row) float64 { return r.ratio.warm })
	out.warm, out.warmRaw, out.warmRaw1, out.warmRaw2 = w.warm, w.warmRaw, w.warmRaw1, w.warmRaw2
	out.cold = pick(func(r row) float64 { return restoreBW(r.cold) }).cold
	// So do the time to first token and its bound.
	f := pick(func(r row) float64 { return r.ratio.ttft })
	out.ttftHot, out.ttftBound = f.ttftHot, f.ttftBound
	// The snapshot and its ratio to the hot restore of its run likewise.
	sn := pick(func(r row) float64 { return r.ratio.snapshot })
	out.snap = sn.snap
	// Each ratio is the median of the runs' own ratios.
	out.ratio = ratios{
		hot:        h.ratio.hot,
		kernel:     pick(func(r row) float64 { return r.ratio.kernel }).ratio.kernel,
		warm:       w.ratio.warm,
		ttft:       f.ratio.ttft,
		probe:      p.ratio.probe,
		ttftMemcpy: pick(func(r row) float64 { return r.ratio.ttftMemcpy }).ratio.ttftMemcpy,
		snapshot:   sn.ratio.snapshot,
	}
	out.hotBeaten, out.warmBeaten = nil, nil
	for _, r := range runs {
		out.hotBeaten = append(out.hotBeaten, r.hotBeaten...)
		out.warmBeaten = append(out.warmBeaten, r.warmBeaten...)
	}
	out.wakes, out.verified = 0, 0
	for _, r := range runs {
		out.wakes += r.wakes
		out.verified += r.verified
	}
	out.runs = len(runs)
	return out
}

func gbps(b float64) string { return fmt.Sprintf("%.2f", b/1e9) }

func restoreBW(r *sim.StageReport) float64 { return float64(r.Bytes) / restoreSeconds(r) }

func restoreSeconds(r *sim.StageReport) float64 {
	return r.AllocSeconds + r.CopySeconds + r.VerifySeconds
}

func render(rows []row, loadBefore, loadAfter string, took time.Duration, hotNote string, criu checkpoint.CRIUReport) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fpr := "no free page reporting"
	if arena.FreePageReporting() {
		fpr = "free page reporting on (virtio balloon): freed memory returns to the host, so memory an engine returns at each sleep is faulted in again in 4 KiB pages; device regions and the baselines' memory, faulted in once and kept, are in huge pages"
	}
	fmt.Fprintf(&b, "`go run ./hack/bench-tiers` on %s, %d CPUs; load average %s before, %s after; %s; %s; the engine is up and serving for %v after it loads, before its first sleep, and sleeps %v before each wake; %s.\n\n",
		host, runtime.NumCPU(), loadBefore, loadAfter, took.Round(time.Second), hotNote, servesFor, asleep, fpr)
	fmt.Fprintf(&b, "Each bandwidth column is the median of %d runs, interleaved (every run measures every column, in order); each ratio column is the median of the runs' own ratios, each of a restore and the bandwidth measured around it in the same run; the warm restore and its raw read, and the time to first token and its bound, are those of the run whose ratio is the median; every wake of every run is counted in the last column. ", rows[0].runs)
	fmt.Fprintf(&b, "Bandwidths in GB/s (10^9 bytes/s), into pre-faulted memory in huge pages, the kind a restore lands in. The bounds are tier probes (`internal/tierprobe`, shared with bench-mux and bench-tiers-ollama), each the fastest of the reads right before and right after the wake it bounds (a limit is the most the tier delivers; on a shared machine another process only slows a read down): the tmpfs column reads the hot wake's own tier file (the level-1 offload) after the sleep's pause, into a region of the engine's own device kept for the run, with the restore's read options (a copy out of a populated read-only mapping, 1 MiB chunks, %d threads), both with a plain copy and with the restore's own copy-and-hash pass (its non-temporal stores skip reading the destination, and can copy faster than a plain copy), each three times right before the wake (after memcpy, which takes the cores' ramp after the pause), into the engine's own region (the device's only free region while the engine sleeps: the pages the wake fills), and three times right after its first token, into the probe's region (through a second link to the offload, which the wake unlinks). The warm file's raw read is the peak of 1 and of the warm restore's %d O_DIRECT readers (8 MiB blocks) of the warm copy itself into the same region, once right before and once right after the warm wake, one reader first before it and last after it, the fastest of the four reads. memcpy (a reference, not a bound) copies min(size, %s) from a buffer kept for the run into that region, the peak of 1 and 2 threads, once right before the hot wake and once right after its first token, the two copies taken together; the disk and S3 columns are references read once per run into a buffer as large as the file. ", arena.DefaultWorkers(), arena.DirectWorkers, arena.Size(memcpyBytes))
	fmt.Fprintf(&b, "A restore is the whole wake of the weights: take the engine's region of its device pool (mapped and faulted in when it loaded, kept while it slept, as GPU memory stays on the device), fill it, then combine the chunk digests and compare. The hot tier's file, in huge pages, is mapped read-only with MAP_POPULATE and 2 workers copy 1 MiB chunks out of the mapping into the region, each copying and hashing (XXH3) a chunk in one pass, every 64 bytes loaded once, stored and hashed; the warm and cold tiers are read with O_DIRECT by %d readers in 8 MiB blocks, each hashing the block it read. ", arena.DirectWorkers)
	b.WriteString("The kernel column is the same hot wake by an engine whose sleep returns its memory to the kernel (`--device-memory=kernel`, the model before the pool): map, fault each chunk in just before copying into it, copy, hash. Fresh memory: mmap + MADV_POPULATE_WRITE of memory freed one sleep earlier. Time to first token is to the first non-empty content delta of a streamed chat sent right after the wake; its bound is the bytes at the tier probe's rate plus the simulator's TTFT (the memcpy-based bound of earlier runs, a stricter one, in parentheses).\n\n")
	b.WriteString("| Weights | memcpy | fresh memory | tmpfs read (tier probe) | disk O_DIRECT | S3 fake | hot restore (alloc+copy+verify s) | hot restore, memory returned to the kernel | warm restore | cold restore | hot ÷ memcpy | hot ÷ tier probe (≥ 0.8; above 1 the probe is wrong) | hot, returned to the kernel, ÷ memcpy | warm ÷ raw read of the same file (≥ 0.8) | TTFT after hot wake ÷ (bytes÷tier probe + TTFT) (≤ 1.2) | wakes verified |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.skipped != "" {
			fmt.Fprintf(&b, "| %s | %s |%s\n", arena.Size(r.size), r.skipped, strings.Repeat("  |", 14))
			continue
		}
		hotBW, kernelBW, warmBW, coldBW := restoreBW(r.hot), restoreBW(r.hotKernel), restoreBW(r.warm), restoreBW(r.cold)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s (%.3f+%.3f+%.3f) | %s (%.3f+%.3f+%.3f) | %s | %s | %.2f | %.2f | %.2f | %.2f (%s) | %.2f (%v ÷ %v; %.2f) | %d/%d |\n",
			arena.Size(r.size), gbps(r.memcpy.BytesPerSecond), gbps(r.fresh.BytesPerSecond), gbps(r.tmpfs.BytesPerSecond), gbps(r.disk.BytesPerSecond), gbps(r.s3.BytesPerSecond),
			gbps(hotBW), r.hot.AllocSeconds, r.hot.CopySeconds, r.hot.VerifySeconds,
			gbps(kernelBW), r.hotKernel.AllocSeconds, r.hotKernel.CopySeconds, r.hotKernel.VerifySeconds, gbps(warmBW), gbps(coldBW),
			r.ratio.hot, r.ratio.probe, r.ratio.kernel, r.ratio.warm, gbps(r.warmRaw.BytesPerSecond),
			r.ratio.ttft, r.ttftHot.Round(time.Millisecond), r.ttftBound.Round(time.Millisecond), r.ratio.ttftMemcpy,
			r.verified, r.wakes)
	}
	var beaten []string
	for _, r := range rows {
		for _, x := range append(slices.Clone(r.hotBeaten), r.warmBeaten...) {
			beaten = append(beaten, fmt.Sprintf("%s: %s", arena.Size(r.size), strings.TrimPrefix(x, tierprobe.ErrBeaten.Error()+": ")))
		}
	}
	if len(beaten) > 0 {
		fmt.Fprintf(&b, "\n**Wakes that beat their tier probe by more than 5 %% (the probe is then not the limit):** %s.\n", strings.Join(beaten, "; "))
	}
	fmt.Fprintf(&b, "\nPeaks: memcpy 1 thread / 2 threads, disk and warm file 1 reader / %d readers: ", arena.DirectWorkers)
	var parts []string
	for _, r := range rows {
		if r.skipped == "" {
			parts = append(parts, fmt.Sprintf("%s memcpy %s / %s, disk %s / %s, warm file %s / %s", arena.Size(r.size),
				gbps(r.memcpy1.BytesPerSecond), gbps(r.memcpy2.BytesPerSecond),
				gbps(r.disk1.BytesPerSecond), gbps(r.disk2.BytesPerSecond),
				gbps(r.warmRaw1.BytesPerSecond), gbps(r.warmRaw2.BytesPerSecond)))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	b.WriteString("Verified copy, the hot restore's copy and hash between pre-faulted buffers (each 1 MiB chunk copied and hashed with XXH3 in one pass, 2 threads), the most a restore that hashes every byte it lands can do from a source as fast as memory, and the hot restore as a share of it: ")
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			parts = append(parts, fmt.Sprintf("%s %s GB/s (%.2f of memcpy), hot restore %.2f of it", arena.Size(r.size), gbps(r.hashedCopy.BytesPerSecond),
				r.hashedCopy.BytesPerSecond/r.memcpy.BytesPerSecond, restoreBW(r.hot)/r.hashedCopy.BytesPerSecond))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	fmt.Fprintf(&b, "Each run in order, its %d hot wakes in order: the wake's ratio to memcpy and to its tier probe, and its time to first token's to its bound, with the least share of a tier file (the level-1 offload) in huge pages, from ShmemHugePages around the sleep that wrote it, and the most CPU time the hypervisor took (steal, /proc/stat) while a wake ran; then one more wake straight after the pause, with the cores as the pause left them (memcpy only after it; not in the table): ", hotWakesPerRun)
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			var each []string
			for _, e := range r.each {
				each = append(each, e.hotNote())
			}
			parts = append(parts, fmt.Sprintf("%s %s", arena.Size(r.size), strings.Join(each, "; ")))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	b.WriteString("Bound of the hot restore with its memory returned to the kernel, as a share of memcpy: the slower of the tier probe and fresh memory (fault, then copy): ")
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			sink := 1 / (1/r.fresh.BytesPerSecond + 1/r.memcpy.BytesPerSecond) // fault, then copy
			parts = append(parts, fmt.Sprintf("%s %.2f (fault then copy %s GB/s; tmpfs %s GB/s)", arena.Size(r.size),
				min(sink, r.tmpfs.BytesPerSecond)/r.memcpy.BytesPerSecond, gbps(sink), gbps(r.tmpfs.BytesPerSecond)))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	if !criu.CheckPassed {
		fmt.Fprintf(&b, "Process snapshot (criu): unsupported on this node: %s.\n", strings.TrimSuffix(criu.Reason, "."))
		return b.String()
	}
	fmt.Fprintf(&b, "Process snapshot (criu %s), the optional tier that keeps the whole process rather than its weights: a simulator process (orchestra-sim's code, the weights in its device pool), up and serving for %v, is dumped by the agent's code (`criu dump --tcp-close --file-locks`, the process ends) into the hot tier's tmpfs and, after the same %v pause, restored (`criu restore --restore-detached`); the restored simulator then sleeps at level 1 and wakes, which hashes the weights it holds against the digest it took at its load. The restore's bandwidth is the weights over criu's restore, compared like for like with the hot wake of the same run whose memory was returned to the kernel: both read the weights from the hot tier's tmpfs into fresh memory (criu maps the restored process's memory anew); the verification (that sleep and wake) comes after it: ", criu.Version, servesFor, asleep)
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" && r.snap != nil {
			s := r.snap
			parts = append(parts, fmt.Sprintf("%s dump %.2f s, restore %.2f s (%s GB/s, %.2f × the hot wake into fresh memory), %.0f MiB of images, verified by a sleep and wake in %.2f s",
				arena.Size(r.size), s.dump.Seconds, s.restore.Seconds, gbps(s.bytesPerSecond(r.size)), r.ratio.snapshot, float64(s.dump.Bytes)/(1<<20), s.verify.Seconds()))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n")
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
		return fmt.Errorf("%s has no %s … %s section", path, startMarker, endMarker)
	}
	s = s[:i+len(startMarker)] + "\n" + table + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// rawReads reads the file at path with O_DIRECT, without hashing, with one
// reader and with the restore's readers, in that order or, after the
// wake, in reverse: each way then sits on average as close to the wake.
func rawReads(a *arena.Arena, what, path string, reverse bool) (one, restore checkpoint.Bandwidth, err error) {
	readOne := func() error {
		one, err = tierprobe.Of(what, path, a, arena.FileOptions{Direct: true, Workers: 1}).Read()
		return err
	}
	readRestore := func() error {
		restore, err = tierprobe.Of(what, path, a, arena.FileOptions{Direct: true}).Read()
		return err
	}
	order := []func() error{readOne, readRestore}
	if reverse {
		slices.Reverse(order)
	}
	for _, read := range order {
		if err := read(); err != nil {
			return one, restore, err
		}
	}
	return one, restore, nil
}
