package seatgroup_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/seatgroup/seatgrouptest"
)

const weights = 32 << 20

var apps = []string{"a", "b", "c", "d"}

// start runs four simulator applications with 32 MiB of real weights each,
// behind real sidecars, in one seat group.
func start(t *testing.T, mut func(*seatgrouptest.Options)) *seatgrouptest.Harness {
	t.Helper()
	g := seatgroup.Default("g")
	g.MinResidency, g.MaxSwapWait, g.Tick = 100*time.Millisecond, 5*time.Second, 10*time.Millisecond
	o := seatgrouptest.Options{Group: g, HotDir: t.TempDir(), TTFT: 2 * time.Millisecond, ITL: time.Millisecond}
	for _, n := range apps {
		o.Apps = append(o.Apps, seatgrouptest.AppOptions{Name: n, WeightsBytes: weights})
	}
	if mut != nil {
		mut(&o)
	}
	h, err := seatgrouptest.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// check fails the test for every lost or cut request and every broken
// swap rule, and returns the number of swaps.
func check(t *testing.T, h *seatgrouptest.Harness, rs []seatgrouptest.Result) int {
	t.Helper()
	for _, r := range seatgrouptest.Failed(rs) {
		t.Errorf("request for %s lost or cut: %v", r.App, r.Err)
	}
	if err := h.CheckSwaps(); err != nil {
		t.Error(err)
	}
	swaps := 0
	for _, ev := range h.Events() {
		if ev.Kind == seatgroup.ActionWake && ev.SwapSeconds > 0 {
			swaps++
		}
	}
	if got := metric(t, h, "orchestra_seatgroup_swaps_total", nil); int(got) != swaps {
		t.Errorf("orchestra_seatgroup_swaps_total = %v, want the %d swaps recorded", got, swaps)
	}
	return swaps
}

// wakes lists the applications woken, in order.
func wakes(h *seatgrouptest.Harness) []string {
	var out []string
	for _, ev := range h.Events() {
		if ev.Kind == seatgroup.ActionWake && ev.Err == "" {
			out = append(out, ev.App)
		}
	}
	return out
}

func TestRoundRobinSwapsEveryTurnAndLosesNothing(t *testing.T) {
	h := start(t, nil)
	rs := h.RoundRobin(apps, 2, 3, 8)
	if len(rs) != 24 {
		t.Fatalf("%d results, want 24", len(rs))
	}
	// The holder after settling serves its first turn without a swap.
	if swaps := check(t, h, rs); swaps < 7 {
		t.Errorf("%d swaps for 8 turns, want at least 7; wakes: %v", swaps, wakes(h))
	}
}

// TestADeviceWithRoomForOneEngineSwapsTheWeightsThrough: the four engines
// share a device file with room for one engine's weights, as a group pod's
// engines share --device-file with --device-capacity: three start stopped
// (nothing resident), every wake needs the room the holder's sleep gave
// back, and round-robin traffic still loses nothing and breaks no rule.
func TestADeviceWithRoomForOneEngineSwapsTheWeightsThrough(t *testing.T) {
	h := start(t, func(o *seatgrouptest.Options) {
		o.DeviceFile = filepath.Join(t.TempDir(), "pool")
		o.DeviceCapacity = weights
	})
	stopped := 0
	for _, e := range h.Engines {
		if _, ok := e.Status(); !ok {
			stopped++
		}
	}
	if stopped != 3 {
		t.Fatalf("%d engines started stopped on a device with room for one, want 3", stopped)
	}
	rs := h.RoundRobin(apps, 2, 2, 8)
	if swaps := check(t, h, rs); swaps < 7 {
		t.Errorf("%d swaps for 8 turns, want at least 7; wakes: %v", swaps, wakes(h))
	}
	for name, e := range h.Engines {
		if st, ok := e.Status(); ok && st.Wakes > 0 && st.Verified != st.Wakes {
			t.Errorf("%s: %d of %d wakes verified", name, st.Verified, st.Wakes)
		}
	}
}

func TestBurstyTrafficLosesNothing(t *testing.T) {
	h := start(t, nil)
	rs := h.Bursty(apps, 1, 24, 4, 8, 40*time.Millisecond)
	if swaps := check(t, h, rs); swaps == 0 {
		t.Error("no swap under bursty traffic to four applications")
	}
}

func TestBurstyTrafficWithTwoActiveSeats(t *testing.T) {
	h := start(t, func(o *seatgrouptest.Options) { o.Group.ActiveSeats = 2 })
	rs := h.Bursty(apps, 2, 24, 4, 8, 40*time.Millisecond)
	if swaps := check(t, h, rs); swaps == 0 {
		t.Error("no swap under bursty traffic to four applications")
	}
}

// busy submits a long request for app and waits until it is in flight.
func busy(t *testing.T, h *seatgrouptest.Harness, app string, tokens int) <-chan seatgrouptest.Result {
	t.Helper()
	c := h.Dispatcher.Submit(app, tokens)
	eventually(t, 10*time.Second, func() error {
		if h.Dispatcher.Demand(app).InFlight == 0 {
			return fmt.Errorf("%s's request is not in flight", app)
		}
		return nil
	})
	return c
}

func TestPriorityOrderDecidesWhoWakesNext(t *testing.T) {
	h := start(t, func(o *seatgrouptest.Options) {
		for i, p := range []int32{1, 2, 3, 0} { // a, b, c, d
			o.Apps[i].Priority = p
		}
	})
	first := busy(t, h, "d", 150)
	// Queued lowest priority first: a queue would serve them a, b, c.
	var chans []<-chan seatgrouptest.Result
	for _, app := range []string{"a", "b", "c"} {
		chans = append(chans, h.Dispatcher.Submit(app, 4))
	}
	rs := append([]seatgrouptest.Result{<-first}, seatgrouptest.Collect(chans)...)
	check(t, h, rs)
	// d (priority 0) was busy and is preempted by c (priority 3) once it
	// drained; then b, then a.
	got := wakes(h)
	if strings.Join(got, ",") != "d,c,b,a" && strings.Join(got, ",") != "c,b,a" {
		t.Errorf("woken in the order %v, want c, b, a after d", got)
	}
}

func TestInFlightRequestsFinishBeforeTheirHolderSleeps(t *testing.T) {
	h := start(t, func(o *seatgrouptest.Options) { o.Apps[0].Priority = 10 }) // a
	long := busy(t, h, "d", 300)
	// a outranks d: d is drained, not cut.
	urgent := h.Dispatcher.Submit("a", 4)
	// d's next request arrives while it drains: it waits in the queue.
	eventually(t, 10*time.Second, func() error {
		if !drained(h, "d") {
			return errors.New("d is not drained for a")
		}
		return nil
	})
	later := h.Dispatcher.Submit("d", 4)
	rs := seatgrouptest.Collect([]<-chan seatgrouptest.Result{long, urgent, later})
	check(t, h, rs)
	var slept time.Time
	for _, ev := range h.Events() {
		if ev.Kind == seatgroup.ActionSleep && ev.App == "d" && ev.Err == "" && slept.IsZero() {
			slept = ev.Start
		}
	}
	if slept.IsZero() {
		t.Fatalf("d never slept; events: %+v", h.Events())
	}
	if slept.Before(rs[0].Finished) {
		t.Errorf("d was put to sleep at %v, before its request finished at %v", slept, rs[0].Finished)
	}
	if rs[1].Started.Before(rs[0].Finished) {
		t.Errorf("a's request started before d's finished: the seat held two applications")
	}
}

func drained(h *seatgrouptest.Harness, app string) bool {
	for _, ev := range h.Events() {
		if ev.Kind == seatgroup.ActionDrain && ev.App == app {
			return true
		}
	}
	return false
}

func TestAntiThrashKeepsAHolderForMinResidency(t *testing.T) {
	const minRes = 400 * time.Millisecond
	h := start(t, func(o *seatgrouptest.Options) { o.Group.MinResidency = minRes })
	// Take a holder other than the one left awake at start, then ask for
	// another application at once.
	holder := "a"
	if h.Dispatcher.Open("a") {
		holder = "b"
	}
	other := "c"
	rs := seatgrouptest.Collect([]<-chan seatgrouptest.Result{h.Dispatcher.Submit(holder, 2)})
	rs = append(rs, seatgrouptest.Collect([]<-chan seatgrouptest.Result{h.Dispatcher.Submit(other, 2)})...)
	check(t, h, rs)
	var wokeHolder, wokeOther time.Time
	for _, ev := range h.Events() {
		if ev.Kind == seatgroup.ActionWake && ev.App == holder {
			wokeHolder = ev.Start
		}
		if ev.Kind == seatgroup.ActionWake && ev.App == other {
			wokeOther = ev.Start
		}
	}
	if wokeHolder.IsZero() || wokeOther.IsZero() {
		t.Fatalf("missing wakes: %v", wakes(h))
	}
	if d := wokeOther.Sub(wokeHolder); d < minRes {
		t.Errorf("%s woke %v after %s, under minResidency %v", other, d, holder, minRes)
	}
}

func TestMemoryNotFreedRestartsTheEngineBeforeTheNextWake(t *testing.T) {
	h := start(t, func(o *seatgrouptest.Options) { o.Apps[2].SleepLeak = true }) // c
	rs := h.RoundRobin([]string{"c", "d", "c", "a"}, 1, 2, 4)
	check(t, h, rs)
	restarts, starts, _ := h.Engines["c"].Counts()
	if restarts < 2 || starts < 2 {
		t.Errorf("c was restarted %d times and started %d times, want at least 2 each (it leaks on every sleep)", restarts, starts)
	}
	// Every wake after c's leaking sleep comes after c's restart.
	leaking := false
	for _, ev := range h.Events() {
		switch {
		case ev.Kind == seatgroup.ActionSleep && ev.App == "c":
			leaking = ev.ResidentBytes > 0
			if !leaking {
				t.Errorf("c's sleep read %d resident bytes; the leak fault keeps them all", ev.ResidentBytes)
			}
		case ev.Kind == seatgroup.ActionRestart && ev.App == "c":
			if ev.Err != "" || ev.ResidentBytes != 0 {
				t.Errorf("restart of c: %s, %d bytes resident after", ev.Err, ev.ResidentBytes)
			}
			leaking = false
		case ev.Kind == seatgroup.ActionWake && leaking:
			t.Errorf("%s woke while c still held its memory", ev.App)
		}
	}
	if got := metric(t, h, "orchestra_seatgroup_restarts_total", map[string]string{"app": "c", "reason": "memory_not_freed"}); got < 2 {
		t.Errorf("orchestra_seatgroup_restarts_total{app=c,reason=memory_not_freed} = %v, want at least 2", got)
	}
}

// metric sums the counter samples of name whose labels include labels.
func metric(t *testing.T, h *seatgrouptest.Harness, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
