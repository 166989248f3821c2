package dataplanetest_test

import (
	"os"
	"runtime"
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
	var sum chaosReport
	sum.cutBy = map[string]int{}
	var worstRecovery time.Duration
	end := time.Now().Add(d)
	nextFault, n := time.Now(), 0
	for time.Now().Before(end) {
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
		sum.serverErrors += rep.serverErrors
		for k, v := range rep.cutBy {
			sum.cutBy[k] += v
		}
	}
	sum.recovery = worstRecovery
	endRSS, endHeap, endG := footprint()
	t.Logf("soak of %v, %d faults: %v (recovery: the worst)", d, n, sum)
	t.Logf("process: RSS %d → %d MiB, heap in use %d → %d MiB, goroutines %d → %d",
		startRSS>>20, endRSS>>20, startHeap>>20, endHeap>>20, startG, endG)
	if sum.lost != 0 || sum.duplicated != 0 || sum.serverErrors != 0 {
		t.Errorf("lost %d, duplicated %d, 5xx %d; want 0 each", sum.lost, sum.duplicated, sum.serverErrors)
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
