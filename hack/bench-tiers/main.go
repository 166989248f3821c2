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
//
// Files: main.go (flags, the runs, machine readings), probes.go (one run:
// the bandwidth probes and references around the wakes), wakes.go (the
// simulator's hot, warm, cold and kernel-memory wakes), row.go (a run's
// figures, ratios and the medians of the runs), table.go (the Markdown
// table), snapshot.go (the process snapshot round trip), ttft.go (time to
// first token); ollama_test.go is make bench-tiers-ollama (the real
// Ollama engine's loads from each tier).
package main

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/sim"
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
		if _, err := nodeagent.MountHotTier(mnt, 2*biggest+(64<<20)); err != nil {
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
	hotNote = fmt.Sprintf("hot tier: tmpfs huge=%s%s", cmp.Or(nodeagent.HugePagesOf(hot), "(not a tmpfs)"), hotNote)
	criu := nodeagent.CRIU{Bin: "criu", Report: nodeagent.ProbeCRIU(context.Background(), "criu")}
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

func gbps(b float64) string { return fmt.Sprintf("%.2f", b/1e9) }

func restoreBW(r *sim.StageReport) float64 { return float64(r.Bytes) / restoreSeconds(r) }

func restoreSeconds(r *sim.StageReport) float64 {
	return r.AllocSeconds + r.CopySeconds + r.VerifySeconds
}
