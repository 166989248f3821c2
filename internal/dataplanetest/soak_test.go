package dataplanetest_test

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
)

// TestSoak runs mixed load (16 at a time, half streamed) for
// ORCHESTRA_SOAK (a duration, e.g. 1h), with a fault every
// ORCHESTRA_SOAK_FAULT_EVERY (default 3m) cycling through a dispatcher
// killed (and replaced), NATS restarted and engine connections dropped. It
// reports the chaos figures summed over the run, and the process's RSS,
// heap and goroutines at the start and the end. `make soak` runs it; it is
// skipped otherwise.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("ORCHESTRA_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set ORCHESTRA_SOAK to a duration to run the soak")
	}
	every := 3 * time.Minute
	if e, err := time.ParseDuration(os.Getenv("ORCHESTRA_SOAK_FAULT_EVERY")); err == nil && e > 0 {
		every = e
	}
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 40
	simCfg.InterTokenLatency = 15 * time.Millisecond
	s := startStack(t, simCfg, func(sc *dataplanetest.StackConfig) {
		sc.Dispatcher = func(c *dispatch.Config) { c.AckWait = dispatch.Default().AckWait }
	})
	dispatchers := []*dataplanetest.Dispatcher{dispatcher(t, s), dispatcher(t, s)}
	faults := []struct {
		name string
		do   func()
	}{
		{"dispatcher killed", func() {
			dispatchers[0].Kill()
			dispatchers = append(dispatchers[1:], dispatcher(t, s))
		}},
		{"NATS restarted", func() {
			if err := s.RestartNATS(); err != nil {
				t.Fatal(err)
			}
		}},
		{"engine connections dropped", func() { s.Engine.CloseClientConnections() }},
	}

	// A warm-up round first, so that the start figures are of a running stack.
	chaosLoad(t, s, 48, 16, 42, func() {})
	startRSS, startHeap, startG := footprint()
	profiles := os.Getenv("ORCHESTRA_SOAK_PROFILES")
	writeProfiles(t, profiles, "start")
	t.Logf("start: goroutines by creator: %v", goroutinesByCreator())
	var sum chaosReport
	sum.cutBy = map[string]int{}
	var worstRecovery time.Duration
	end := time.Now().Add(d)
	nextFault, n := time.Now(), 0
	nextSample := time.Now().Add(10 * time.Minute)
	for time.Now().Before(end) {
		if !time.Now().Before(nextSample) {
			rss, heap, g := footprint()
			t.Logf("sample: RSS %d MiB, heap in use %d MiB, goroutines %d %v", rss>>20, heap>>20, g, goroutinesByCreator())
			nextSample = time.Now().Add(10 * time.Minute)
		}
		fault := func() {}
		name := "none"
		if !time.Now().Before(nextFault) {
			f := faults[n%len(faults)]
			fault, name = f.do, f.name
			n++
			nextFault = time.Now().Add(every)
		}
		rep := chaosLoad(t, s, 48, 16, 42, fault)
		if name != "none" {
			t.Logf("fault %d (%s): %v", n, name, rep)
			worstRecovery = max(worstRecovery, rep.recovery)
		}
		sum.accepted += rep.accepted
		sum.completed += rep.completed
		sum.cut += rep.cut
		sum.lost += rep.lost
		sum.duplicated += rep.duplicated
		sum.wrong += rep.wrong
		sum.serverErrors += rep.serverErrors
		for k, v := range rep.cutBy {
			sum.cutBy[k] += v
		}
	}
	sum.recovery = worstRecovery
	endRSS, endHeap, endG := footprint()
	writeProfiles(t, profiles, "end")
	t.Logf("end: goroutines by creator: %v", goroutinesByCreator())
	t.Logf("soak of %v, %d faults: %v (recovery: the worst)", d, n, sum)
	t.Logf("process: RSS %d → %d MiB, heap in use %d → %d MiB, goroutines %d → %d",
		startRSS>>20, endRSS>>20, startHeap>>20, endHeap>>20, startG, endG)
	if sum.lost != 0 || sum.duplicated != 0 || sum.wrong != 0 || sum.serverErrors != 0 {
		t.Errorf("lost %d, duplicated %d, wrong %d, 5xx %d; want 0 each", sum.lost, sum.duplicated, sum.wrong, sum.serverErrors)
	}
	if worstRecovery > 5*time.Second {
		t.Errorf("worst recovery %v, want at most 5s", worstRecovery)
	}
	if endG > startG+50 {
		t.Errorf("goroutines grew from %d to %d", startG, endG)
	}
}

// footprint returns the process's resident memory, heap in use and
// goroutines, after a collection.
func footprint() (rss, heap uint64, goroutines int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			rss = pages * uint64(os.Getpagesize())
		}
	}
	return rss, ms.HeapInuse, runtime.NumGoroutine()
}

// goroutinesByCreator counts the process's goroutines by the package of the
// function that started them, so that a growth can be told apart: the
// gateway (and its queue client), the dispatchers, NATS (server and client
// library), the engine simulator, or the test itself.
func goroutinesByCreator() map[string]int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	counts := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		creator := "runtime"
		if i := strings.Index(g, "\ncreated by "); i >= 0 {
			creator = strings.Fields(g[i+len("\ncreated by "):])[0]
		}
		counts[component(creator)]++
	}
	return counts
}

// component names the part of the data plane a function belongs to.
func component(fn string) string {
	for _, c := range []struct{ prefix, name string }{
		{"github.com/model-orchestra/operator/internal/gateway", "gateway"},
		{"github.com/model-orchestra/operator/internal/natsqueue", "gateway queue client"},
		{"github.com/model-orchestra/operator/internal/dispatch", "dispatcher"},
		{"github.com/model-orchestra/operator/internal/sim", "engine"},
		{"github.com/nats-io/nats-server", "nats-server"},
		{"github.com/nats-io/nats.go", "nats client"},
		{"github.com/model-orchestra/operator/internal/dataplanetest", "test"},
		{"net/http", "net/http"},
	} {
		if strings.HasPrefix(fn, c.prefix) {
			return c.name
		}
	}
	return "other"
}

// writeProfiles writes the goroutine (full stacks) and heap profiles into
// dir as <when>-goroutines.txt and <when>-heap.pprof, for comparing the
// start and the end of a soak (go tool pprof -base start-heap.pprof
// end-heap.pprof). An empty dir writes nothing.
func writeProfiles(t *testing.T, dir, when string) {
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, debug := range map[string]int{"goroutine": 2, "heap": 0} {
		file := filepath.Join(dir, when+"-"+name+".pprof")
		if debug != 0 {
			file = filepath.Join(dir, when+"-"+name+"s.txt")
		}
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.Lookup(name).WriteTo(f, debug); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s profiles written to %s", when, dir)
}
