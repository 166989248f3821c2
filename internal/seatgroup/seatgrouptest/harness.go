package seatgrouptest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// AppOptions describes one application of the group.
type AppOptions struct {
	Name     string
	Priority int32
	// WeightsBytes of synthetic weights (real bytes, hashed on every wake).
	WeightsBytes int64
	// SleepLeak makes every sleep keep the memory (vllm#47654).
	SleepLeak bool
}

// Options configures a harness.
type Options struct {
	Apps  []AppOptions
	Group seatgroup.Config
	// HotDir is the hot tier (a tmpfs in production); one subdirectory per
	// engine.
	HotDir string
	// KeepOffload keeps each engine's level-1 offload across wakes, as the
	// chart renders for a seat group's simulators (sim.Sleep.KeepOffload).
	KeepOffload bool
	// TTFT and ITL pace the simulators.
	TTFT, ITL time.Duration
	// MaxConcurrency per application (default 4).
	MaxConcurrency int
	// HotBandwidth (bytes/s) estimates the swap cost; 0 counts only the
	// TTFT.
	HotBandwidth float64
	// DeviceFile, when set, is the device pool the engines share, as the
	// engine containers of a group pod share one (orchestra-sim
	// --device-file): each engine opens it (arena.OpenSharedDevice). With
	// DeviceCapacity (bytes, 0: no limit) smaller than the engines'
	// weights together, the engines that do not fit start stopped (asleep,
	// nothing resident) and load their weights at their first wake.
	DeviceFile     string
	DeviceCapacity int64
	Log            *slog.Logger
	// OnEvent, if set, is called after each applied action (from the
	// executor's goroutine; it must not block).
	OnEvent func(seatgroup.Event)
}

// Harness is a running seat group.
type Harness struct {
	Exec       *seatgroup.Executor
	Dispatcher *Dispatcher
	Engines    map[string]*Engine
	Registry   *prometheus.Registry
	opts       Options
	budget     *budget

	cancel  context.CancelFunc
	servers []*httptest.Server
	done    chan struct{}

	mu     sync.Mutex
	events []seatgroup.Event
	// devices are the engines' handles on a shared device (DeviceFile).
	devices []*arena.Device
}

// Start starts the engines, their seats, the dispatcher and the executor,
// and waits until the group is within its budget (every engine starts
// awake, as a real one does, and all but activeSeats are put to sleep).
func Start(opts Options) (*Harness, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConcurrency == 0 {
		opts.MaxConcurrency = 4
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Harness{opts: opts, Engines: map[string]*Engine{}, Registry: prometheus.NewRegistry(), cancel: cancel, done: make(chan struct{})}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	h.Dispatcher = newDispatcher(ctx, client)
	var largest int64
	for _, a := range opts.Apps {
		largest = max(largest, a.WeightsBytes)
	}
	h.budget = &budget{limit: int64(opts.Group.ActiveSeats) * largest}
	var members []seatgroup.Member
	for _, a := range opts.Apps {
		sc := sim.Default()
		sc.Model = a.Name
		sc.TimeToFirstToken, sc.InterTokenLatency = opts.TTFT, opts.ITL
		sc.Weights = sim.Weights{Bytes: a.WeightsBytes, Seed: uint64(len(members) + 1)}
		sc.Sleep = sim.Sleep{Enabled: true, HotDir: opts.HotDir, KeepOffload: opts.KeepOffload}
		sc.Faults.SleepLeak = a.SleepLeak
		if err := sc.Validate(); err != nil {
			h.Close()
			return nil, fmt.Errorf("simulator %s: %w", a.Name, err)
		}
		var simOpts []sim.Option
		if opts.DeviceFile != "" {
			dev, err := arena.OpenSharedDevice(opts.DeviceFile, opts.DeviceCapacity, a.Name)
			if err != nil {
				h.Close()
				return nil, fmt.Errorf("engine %s: %w", a.Name, err)
			}
			h.devices = append(h.devices, dev)
			simOpts = append(simOpts, sim.WithDevice(dev))
		}
		eng, err := newEngine(a.Name, sc, h.budget, opts.Log.With("engine", a.Name), simOpts...)
		if err != nil {
			h.Close()
			return nil, err
		}
		h.Engines[a.Name] = eng
		name := a.Name
		eng.dispatched = func() int { return h.Dispatcher.Demand(name).InFlight }
		h.budget.engines = append(h.budget.engines, eng)
		engSrv := httptest.NewServer(eng)
		h.servers = append(h.servers, engSrv)

		ac := agent.Default()
		ac.Sidecar.Engine = sidecar.EngineConfig{Kind: v1alpha1.EngineSimulator, URL: engSrv.URL, PollInterval: 2 * time.Millisecond}
		ac.Sidecar.PollInterval, ac.Sidecar.DrainTimeout = 2*time.Millisecond, 10*time.Second
		if err := ac.Validate(); err != nil {
			h.Close()
			return nil, err
		}
		sidecarHandler, err := agent.Start(ctx, ac, opts.Log.With("sidecar", a.Name))
		if err != nil {
			h.Close()
			return nil, err
		}
		sidecarSrv := httptest.NewServer(sidecarHandler)
		h.servers = append(h.servers, sidecarSrv)
		h.Dispatcher.add(a.Name, engSrv.URL, opts.MaxConcurrency)
		members = append(members, seatgroup.Member{
			Name: a.Name, Priority: a.Priority, SleepLevel: 1, WeightsBytes: a.WeightsBytes,
			SwapCost: seatgroup.EstimateSwapCost(a.WeightsBytes, opts.HotBandwidth, opts.TTFT),
			// The memory reading and the restart go through the
			// sidecar, as in a group pod.
			Sidecar: sidecarapi.Client{URL: sidecarSrv.URL, HTTP: client},
			Memory:  seatgroup.SidecarMemory{Client: sidecarapi.Client{URL: sidecarSrv.URL, HTTP: client}}, Restarter: sidecarapi.Client{URL: sidecarSrv.URL, HTTP: client},
		})
	}
	exec, err := seatgroup.NewExecutor(opts.Group, members, h.Dispatcher, h.Registry, opts.Log, seatgroup.WithEvents(h.record))
	if err != nil {
		h.Close()
		return nil, err
	}
	h.Exec = exec
	h.Dispatcher.kick = exec.Kick
	// The seats learn their engines' state on their first watch tick:
	// awake, or asleep for an engine that started stopped on a full
	// shared device.
	if err := h.waitFor(10*time.Second, "every sidecar to see its engine awake (or asleep, stopped on a full device)", func() bool {
		for _, m := range members {
			st, err := m.Sidecar.State(ctx)
			want := sidecarapi.Awake
			if e := h.Engines[m.Name]; e.e.Simulator() == nil {
				want = sidecarapi.Asleep
			}
			if err != nil || st.State != want {
				return false
			}
		}
		return true
	}); err != nil {
		h.Close()
		return nil, err
	}
	go func() {
		defer close(h.done)
		exec.Run(ctx)
	}()
	if err := h.waitFor(30*time.Second, "the group to come within its budget", func() bool {
		return h.Awake() <= opts.Group.ActiveSeats && len(h.Exec.LastPlan()) == 0
	}); err != nil {
		h.Close()
		return nil, err
	}
	h.ResetEvents()
	return h, nil
}

func (h *Harness) waitFor(limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Awake counts the engines that are awake.
func (h *Harness) Awake() int {
	n := 0
	for _, e := range h.Engines {
		if st, ok := e.Status(); ok && !st.Sleeping {
			n++
		}
	}
	return n
}

func (h *Harness) record(ev seatgroup.Event) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
	if h.opts.OnEvent != nil {
		h.opts.OnEvent(ev)
	}
}

// Events returns the actions applied since the group settled.
func (h *Harness) Events() []seatgroup.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// ResetEvents forgets the actions recorded so far.
func (h *Harness) ResetEvents() {
	h.mu.Lock()
	h.events = nil
	h.mu.Unlock()
}

// Violations lists the wakes that started while the other engines held
// more memory than the accelerator has room for.
func (h *Harness) Violations() []string { return h.budget.Violations() }

// Close stops everything.
func (h *Harness) Close() {
	h.cancel()
	if h.Exec != nil {
		<-h.done
	}
	h.Dispatcher.wait()
	for _, s := range h.servers {
		s.Close()
	}
	for _, e := range h.Engines {
		e.close()
	}
	for _, d := range h.devices {
		d.Close()
	}
}

// Collect waits for every result.
func Collect(chans []<-chan Result) []Result {
	out := make([]Result, 0, len(chans))
	for _, c := range chans {
		out = append(out, <-c)
	}
	return out
}

// Failed returns the results that were lost or cut.
func Failed(rs []Result) []Result {
	var bad []Result
	for _, r := range rs {
		if r.Err != nil {
			bad = append(bad, r)
		}
	}
	return bad
}

// RoundRobin sends perTurn requests of tokens tokens to each application
// in turn, rounds times, waiting for one application's requests to finish
// before the next one's are sent: every turn needs a swap.
func (h *Harness) RoundRobin(apps []string, rounds, perTurn, tokens int) []Result {
	var out []Result
	for range rounds {
		for _, app := range apps {
			var chans []<-chan Result
			for range perTurn {
				chans = append(chans, h.Dispatcher.Submit(app, tokens))
			}
			out = append(out, Collect(chans)...)
		}
	}
	return out
}

// Bursty sends bursts of 1..maxBurst requests to applications drawn at
// random (seeded), a random 0..gap apart, without waiting for earlier
// bursts, then waits for all of them.
func (h *Harness) Bursty(apps []string, seed uint64, bursts, maxBurst, tokens int, gap time.Duration) []Result {
	rnd := rand.New(rand.NewPCG(seed, seed))
	var chans []<-chan Result
	for range bursts {
		app := apps[rnd.IntN(len(apps))]
		for range 1 + rnd.IntN(maxBurst) {
			chans = append(chans, h.Dispatcher.Submit(app, tokens))
		}
		// Pacing the load generator, not waiting for an outcome.
		time.Sleep(time.Duration(rnd.Int64N(int64(gap) + 1)))
	}
	return Collect(chans)
}

// CheckSwaps verifies the run: no sleep reached an engine while it, or the
// dispatcher on its behalf, had requests in flight; no wake started while the others held the
// accelerator's memory, and no holder gave up its seat within minResidency
// of its wake unless the group was over budget.
func (h *Harness) CheckSwaps() error {
	var errs []error
	wokeAt := map[string]time.Time{}
	for _, ev := range h.Events() {
		switch ev.Kind {
		case seatgroup.ActionWake:
			if ev.Err == "" {
				// The engine turned awake during the wake: its start is
				// the earliest the residency can have begun.
				wokeAt[ev.App] = ev.Start
			}
		case seatgroup.ActionSleep:
			if w, ok := wokeAt[ev.App]; ok && !ev.OverBudget && ev.Start.Sub(w) < h.opts.Group.MinResidency {
				errs = append(errs, fmt.Errorf("anti-thrash: %s gave up its seat %v after its wake started, under minResidency %v", ev.App, ev.Start.Sub(w), h.opts.Group.MinResidency))
			}
		}
	}
	for name, e := range h.Engines {
		if _, _, n := e.Counts(); n > 0 {
			errs = append(errs, fmt.Errorf("%d sleeps reached engine %s with requests in flight", n, name))
		}
	}
	for _, v := range h.Violations() {
		errs = append(errs, errors.New(v))
	}
	return errors.Join(errs...)
}
