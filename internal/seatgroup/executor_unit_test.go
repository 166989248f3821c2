package seatgroup

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// fakeSeat is a seat whose answers the test sets.
type fakeSeat struct {
	name  string
	log   *[]string
	state sidecarapi.State
	since time.Time

	sleepErr, wakeErr error
	// resident is what the memory reading returns.
	resident int64
	// restartable: Restart works.
	restartable bool
}

func (s *fakeSeat) State(context.Context) (sidecarapi.Status, error) {
	return sidecarapi.Status{State: s.state, Since: s.since}, nil
}

func (s *fakeSeat) Sleep(_ context.Context, level int) error {
	*s.log = append(*s.log, "sleep "+s.name)
	if s.sleepErr != nil {
		return s.sleepErr
	}
	s.state = sidecarapi.Asleep
	return nil
}

func (s *fakeSeat) Wake(context.Context) error {
	*s.log = append(*s.log, "wake "+s.name)
	if s.wakeErr != nil {
		return s.wakeErr
	}
	s.state, s.since = sidecarapi.Awake, time.Now()
	return nil
}

func (s *fakeSeat) ReadMemory(context.Context) (MemoryReading, error) {
	return MemoryReading{ResidentBytes: s.resident}, nil
}

func (s *fakeSeat) Restart(context.Context) error {
	*s.log = append(*s.log, "restart "+s.name)
	if !s.restartable {
		return errors.New("cannot")
	}
	s.resident = 0
	return nil
}

// fakeDispatcher reports the demand the test sets and records the gate.
type fakeDispatcher struct {
	mu     sync.Mutex
	demand map[string]Demand
	open   map[string]bool
	// releases counts the gate openings per application.
	releases map[string]int
	// onHold runs when a gate closes (a request slipping in).
	onHold func(app string)
}

func (d *fakeDispatcher) Demand(app string) Demand {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.demand[app]
}

func (d *fakeDispatcher) Hold(app string) {
	d.mu.Lock()
	was := d.open[app]
	d.open[app] = false
	hook := d.onHold
	d.mu.Unlock()
	if was && hook != nil {
		hook(app)
	}
}

func (d *fakeDispatcher) Release(app string) {
	d.mu.Lock()
	if !d.open[app] {
		d.releases[app]++
	}
	d.open[app] = true
	d.mu.Unlock()
}

type unitEnv struct {
	log   []string
	seats map[string]*fakeSeat
	d     *fakeDispatcher
	e     *Executor
	reg   *prometheus.Registry
}

// newUnit builds a group of a (awake) and b (asleep, freed), one seat,
// no minimum residency; b has one queued request.
func newUnit(t *testing.T, noRestarter bool) *unitEnv {
	t.Helper()
	u := &unitEnv{seats: map[string]*fakeSeat{}, reg: prometheus.NewRegistry(),
		d: &fakeDispatcher{demand: map[string]Demand{"b": {Queued: 1, OldestWait: time.Second}}, open: map[string]bool{}, releases: map[string]int{}}}
	old := time.Now().Add(-time.Hour)
	var members []Member
	for _, n := range []string{"a", "b"} {
		s := &fakeSeat{name: n, log: &u.log, state: sidecarapi.Asleep, since: old, restartable: true}
		u.seats[n] = s
		m := Member{Name: n, Sidecar: s, Memory: s, Restarter: s, WeightsBytes: 100}
		if noRestarter {
			m.Restarter = nil
		}
		members = append(members, m)
	}
	u.seats["a"].state = sidecarapi.Awake
	cfg := Default("g")
	cfg.MinResidency = 0
	e, err := NewExecutor(cfg, members, u.d, u.reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// b's memory was read when it went to sleep.
	e.st["b"].memory = MemoryFreed
	u.e = e
	return u
}

func (u *unitEnv) step(t *testing.T) {
	t.Helper()
	if err := u.e.Step(context.Background()); err != nil {
		t.Logf("step: %v", err)
	}
}

func TestExecutorSwapsAndMovesTheGate(t *testing.T) {
	u := newUnit(t, false)
	u.step(t)
	if diff := cmp.Diff([]string{"sleep a", "wake b"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]bool{"a": false, "b": true}, u.d.open); diff != "" {
		t.Errorf("gates (-want +got):\n%s", diff)
	}
}

func TestExecutorDrainsWhenARequestSlipsInBeforeTheGateCloses(t *testing.T) {
	u := newUnit(t, false)
	u.d.Release("a")
	u.d.onHold = func(app string) {
		u.d.demand[app] = Demand{InFlight: 1}
	}
	u.step(t)
	if len(u.log) != 0 {
		t.Errorf("calls %v, want none: a has a request in flight", u.log)
	}
	if u.d.open["a"] {
		t.Error("a's gate is open while it drains")
	}
	// The next decision sees a draining with its request in flight, and
	// waits; once the request finished, it sleeps a and wakes b.
	u.step(t)
	if len(u.log) != 0 {
		t.Errorf("calls %v while a's request runs", u.log)
	}
	u.d.demand["a"] = Demand{}
	u.step(t)
	if diff := cmp.Diff([]string{"sleep a", "wake b"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestExecutorKeepsTheGateClosedAfterARefusedSleep(t *testing.T) {
	u := newUnit(t, false)
	u.seats["a"].sleepErr = &sidecarapi.Error{Op: "sleep", Status: 409, Message: "sleep abandoned"}
	u.step(t)
	opened := u.d.releases["a"]
	// b still waits: the next decision sleeps a again, and a's gate stays
	// closed in between.
	u.seats["a"].sleepErr = nil
	u.step(t)
	if diff := cmp.Diff([]string{"sleep a", "sleep a", "wake b"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if u.d.releases["a"] != opened {
		t.Error("a's gate reopened between its refused sleep and the next one")
	}
}

func TestExecutorResumesARefusedSleepNobodyWaitsFor(t *testing.T) {
	u := newUnit(t, false)
	u.seats["a"].sleepErr = &sidecarapi.Error{Op: "sleep", Status: 409, Message: "sleep abandoned"}
	u.step(t)
	if u.d.open["a"] {
		t.Error("a's gate is open after a refused sleep")
	}
	// Nobody waits any more: a is resumed.
	u.d.demand["b"] = Demand{}
	u.step(t)
	if !u.d.open["a"] {
		t.Error("a was not resumed once nobody waited")
	}
}

func TestExecutorRestartsAnEngineThatKeptItsMemoryBeforeWaking(t *testing.T) {
	u := newUnit(t, false)
	u.seats["a"].resident = 100 // the leak keeps all of it
	u.step(t)                   // sleep a: the reading shows the leak; the plan stops
	u.step(t)                   // restart a, then wake b
	if diff := cmp.Diff([]string{"sleep a", "restart a", "wake b"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestExecutorWithoutARestarterSaysSoAndWakesNobody(t *testing.T) {
	u := newUnit(t, true)
	u.seats["a"].resident = 100
	u.step(t)
	err := u.e.Step(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no way to restart this engine is configured") {
		t.Errorf("step: %v, want the missing restarter named", err)
	}
	if diff := cmp.Diff([]string{"sleep a"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestExecutorRestartsAFailedSeatOnce(t *testing.T) {
	u := newUnit(t, false)
	u.seats["a"].state = sidecarapi.Failed
	u.d.demand["b"] = Demand{}
	u.step(t)
	u.step(t) // the seat still says Failed (its watch has not caught up)
	if diff := cmp.Diff([]string{"restart a"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	// The sidecar reports a newer state later: Failed again means a new failure.
	u.seats["a"].since = time.Now().Add(time.Second)
	u.step(t)
	if diff := cmp.Diff([]string{"restart a", "restart a"}, u.log); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestExecutorLeavesTheGateClosedWhenAWakeFails(t *testing.T) {
	u := newUnit(t, false)
	u.seats["b"].wakeErr = errors.New("engine wake failed")
	err := u.e.Step(context.Background())
	if err == nil || !strings.Contains(err.Error(), "engine wake failed") {
		t.Errorf("step: %v, want the wake's error", err)
	}
	if u.d.open["b"] {
		t.Error("b's gate opened although its wake failed")
	}
}
