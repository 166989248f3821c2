package seatgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// Sidecar drives one application's engine through its per-engine sidecar. sidecarapi.Client
// implements it over the agent's HTTP API.
type Sidecar interface {
	State(ctx context.Context) (sidecarapi.Status, error)
	// Sleep drains the engine (the agent waits until it reports nothing in
	// flight) and puts it to sleep at level.
	Sleep(ctx context.Context, level int) error
	Wake(ctx context.Context) error
}

// MemoryReading is one reading of an engine's memory.
type MemoryReading struct {
	// ResidentBytes is what the engine holds in accelerator memory (the
	// simulator: the weight bytes it still holds; a GPU engine: its device
	// memory).
	ResidentBytes int64
	// WeightsBytes is the size of its weights when the engine reports it;
	// 0 means the member's WeightsBytes.
	WeightsBytes int64
}

// MemoryReader reads an engine's memory.
type MemoryReader interface {
	ReadMemory(ctx context.Context) (MemoryReading, error)
}

// ErrMemoryNotReported is a MemoryReader's answer for an engine that does
// not report its memory (vLLM, Ollama, llama.cpp: their seats report no
// residentBytes); the executor then trusts the sidecar's word that the engine
// sleeps.
var ErrMemoryNotReported = errors.New("the engine does not report its memory")

// Restarter stops an engine so that all its memory is returned; its sidecar
// then reports it asleep, and its next wake starts it again and loads the
// weights from the warm or cold tier.
type Restarter interface {
	Restart(ctx context.Context) error
}

// Demand is what the dispatcher knows about one application's requests.
type Demand struct {
	// InFlight counts requests taken from the queue and not finished,
	// including those on their way to the engine.
	InFlight int
	Queued   int
	// OldestWait is the age of the oldest queued request.
	OldestWait time.Duration
	// LastUse is when a request was last dispatched or finished.
	LastUse time.Time
	// ServiceTime is the mean seat time of one request (0: unknown).
	ServiceTime time.Duration
}

// Dispatcher is the side that holds the requests: it reports demand and
// is the gate that keeps requests away from an engine that is not awake.
type Dispatcher interface {
	Demand(app string) Demand
	// Hold stops dispatching to app; requests wait in the queue. Requests
	// already counted in flight are not affected.
	Hold(app string)
	// Release dispatches to app again.
	Release(app string)
}

// Member is one application of the group.
type Member struct {
	Name       string
	Priority   int32
	SleepLevel int
	// MinResidency overrides the group's for this member (0: the group's).
	MinResidency time.Duration
	// SleepAfter puts it to sleep once it held its seat idle this long
	// (0: never for idleness alone).
	SleepAfter time.Duration
	// WeightsBytes is the size of the weights, against which the memory
	// check is made.
	WeightsBytes int64
	// SwapCost estimates the time to swap it in (EstimateSwapCost).
	SwapCost time.Duration
	Sidecar  Sidecar
	// Memory reads its engine's memory; nil trusts the sidecar's word that
	// the engine sleeps.
	Memory MemoryReader
	// Restarter restarts its engine; nil makes a restart fail (the group
	// then stays as it is and says why).
	Restarter Restarter
}

// Event records one applied action, for logs, tests and benchmarks.
type Event struct {
	Kind ActionKind
	App  string
	For  string
	// Start and End bound the action.
	Start, End time.Time
	// InFlight is set on a Sleep that found requests in flight once the
	// gate was closed (it then drains them first): the dispatcher's count.
	InFlight int
	// ResidentBytes is the memory reading after a Sleep, CheckMemory or
	// Restart.
	ResidentBytes int64
	// SwapSeconds is set on the Wake that ends a swap.
	SwapSeconds float64
	// OverBudget is true for a Sleep or Drain that brings the group back
	// within activeSeats (no waiting application asked for it).
	OverBudget bool
	// Idle is true for a Sleep of a holder idle for its sleepAfter.
	Idle   bool
	Reason string
	Err    string
}

// memberState is what the executor remembers of a member between
// decisions; only the executor's goroutine touches it.
type memberState struct {
	memory     MemoryCheck
	restarted  time.Time // the last successful restart
	draining   bool
	drainStart time.Time
	// holding is the holder gauge's value as last set (holdingSet: set).
	holding, holdingSet bool
}

// Executor applies the policy to one seat group: it observes the seats and
// the dispatcher, asks Decide for a plan and applies it. Run it in the
// single lifecycle decision-maker (one writer per group).
type Executor struct {
	cfg     Config
	members []Member
	d       Dispatcher
	log     *slog.Logger
	m       *metrics
	now     func() time.Time
	onEvent func(Event)
	kick    chan struct{}

	st map[string]*memberState

	mu       sync.Mutex
	lastPlan []Action
}

// Option customises an Executor.
type Option func(*Executor)

// WithEvents calls f after every applied action (from the executor's
// goroutine; f must not block).
func WithEvents(f func(Event)) Option { return func(e *Executor) { e.onEvent = f } }

// NewExecutor returns the executor of one group; cfg must pass Validate.
func NewExecutor(cfg Config, members []Member, d Dispatcher, reg prometheus.Registerer, log *slog.Logger, opts ...Option) (*Executor, error) {
	if err := cfg.Validate(members); err != nil {
		return nil, err
	}
	e := &Executor{
		cfg: cfg, members: slices.Clone(members), d: d, log: log.With("seatGroup", cfg.Name),
		m: newMetrics(reg), now: time.Now, kick: make(chan struct{}, 1), st: map[string]*memberState{},
	}
	slices.SortFunc(e.members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	for _, m := range e.members {
		e.st[m.Name] = &memberState{}
	}
	for _, o := range opts {
		o(e)
	}
	return e, nil
}

// Kick makes the executor decide at once (a request arrived or finished).
func (e *Executor) Kick() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// LastPlan returns the plan of the last decision.
func (e *Executor) LastPlan() []Action {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.lastPlan)
}

// Run decides and applies plans until ctx ends.
func (e *Executor) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Tick)
	defer t.Stop()
	for {
		if err := e.Step(ctx); err != nil && ctx.Err() == nil {
			e.log.Warn("seat group step failed; deciding again", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
		case <-t.C:
		}
	}
}

// Step observes the group once, decides, and applies the plan up to its
// end, a failure, or a fact that contradicts it (then the next Step
// decides again).
func (e *Executor) Step(ctx context.Context) error {
	plan := Decide(e.observe(ctx), e.now())
	e.mu.Lock()
	changed := !slices.Equal(plan, e.lastPlan)
	e.lastPlan = plan
	e.mu.Unlock()
	if changed && len(plan) > 0 {
		lines := make([]string, len(plan))
		for i, a := range plan {
			lines[i] = a.String()
		}
		e.log.Info("seat group plan", "plan", lines)
	}
	var swapStart time.Time // the first sleep or restart of this plan
	for _, a := range plan {
		m := e.member(a.App)
		var err error
		switch a.Kind {
		case ActionWait:
			continue
		case ActionWake:
			err = e.wake(ctx, m, swapStart)
		case ActionDrain:
			e.drain(m, a)
		case ActionResume:
			e.resume(m, a)
		case ActionSleep:
			if swapStart.IsZero() {
				swapStart = e.now()
			}
			err = e.sleep(ctx, m, a)
		case ActionCheckMemory:
			err = e.checkMemory(ctx, m, a)
		case ActionRestart:
			if swapStart.IsZero() {
				swapStart = e.now()
			}
			err = e.restart(ctx, m, a)
		}
		if err != nil {
			if errors.Is(err, errReplan) {
				return nil
			}
			return fmt.Errorf("%s: %w", a, err)
		}
	}
	return nil
}

// errReplan stops a plan whose premise no longer holds.
var errReplan = errors.New("the plan's premise changed")

func (e *Executor) member(name string) Member {
	i := slices.IndexFunc(e.members, func(m Member) bool { return m.Name == name })
	return e.members[i]
}

// observe reads every seat and the dispatcher's demand, and keeps the gate
// in step: open exactly for Awake members that are not draining.
func (e *Executor) observe(ctx context.Context) Group {
	g := Group{ActiveSeats: e.cfg.ActiveSeats, MinResidency: e.cfg.MinResidency, MaxSwapWait: e.cfg.MaxSwapWait}
	var errs []error
	for _, m := range e.members {
		ms := e.st[m.Name]
		sctx, cancel := context.WithTimeout(ctx, e.cfg.StateTimeout)
		st, err := m.Sidecar.State(sctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
			st = sidecarapi.Status{State: sidecarapi.Unknown}
		}
		s := st.State
		if s == sidecarapi.Failed && !ms.restarted.IsZero() && !st.Since.After(ms.restarted) {
			// Restarted since the seat last changed its mind: the engine
			// is stopped, its memory freed; the sidecar's watch catches up.
			s = sidecarapi.Asleep
		}
		if s == sidecarapi.Awake {
			ms.memory = MemoryUnchecked
		} else {
			ms.draining = false
		}
		if s == sidecarapi.Awake && !ms.draining {
			e.d.Release(m.Name)
		} else {
			e.d.Hold(m.Name)
		}
		e.setHolding(m.Name, ms, s == sidecarapi.Awake)
		d := e.d.Demand(m.Name)
		g.Apps = append(g.Apps, App{
			Name: m.Name, State: s, Draining: ms.draining, Priority: m.Priority, LastUse: d.LastUse,
			InFlight: d.InFlight, Queued: d.Queued, OldestWait: d.OldestWait,
			ResidentSince: st.Since, SwapCost: m.SwapCost, ServiceTime: d.ServiceTime,
			Memory: ms.memory, SleepLevel: m.SleepLevel, MinResidency: m.MinResidency, SleepAfter: m.SleepAfter,
		})
	}
	// A sidecar that does not answer counts as Unknown (holding its seat),
	// which is safe; the decision goes on for the others.
	if err := errors.Join(errs...); err != nil {
		e.log.Warn("reading seats", "err", err)
	}
	return g
}

// setHolding sets the holder gauge of a member whose engine is awake
// (serving or drained) or not.
func (e *Executor) setHolding(name string, ms *memberState, holding bool) {
	if ms.holding == holding && ms.holdingSet {
		return
	}
	ms.holding, ms.holdingSet = holding, true
	v := 0.0
	if holding {
		v = 1
	}
	e.m.holder.WithLabelValues(e.cfg.Name, name).Set(v)
}

func (e *Executor) record(ev Event, result string) {
	e.m.actions.WithLabelValues(e.cfg.Name, string(ev.Kind), result).Inc()
	attrs := []any{"action", ev.Kind, "app", ev.App, "seconds", ev.End.Sub(ev.Start).Seconds(), "reason", ev.Reason}
	if ev.For != "" {
		attrs = append(attrs, "for", ev.For)
	}
	if ev.Err != "" {
		e.log.Warn("seat group action failed", append(attrs, "err", ev.Err)...)
	} else {
		e.log.Info("seat group action", attrs...)
	}
	if e.onEvent != nil {
		e.onEvent(ev)
	}
}

func (e *Executor) wake(ctx context.Context, m Member, swapStart time.Time) error {
	ev := Event{Kind: ActionWake, App: m.Name, Start: e.now()}
	wctx, cancel := context.WithTimeout(ctx, e.cfg.WakeTimeout)
	err := m.Sidecar.Wake(wctx)
	cancel()
	ev.End = e.now()
	if err != nil {
		ev.Err = err.Error()
		e.record(ev, resultFailed)
		return err
	}
	ms := e.st[m.Name]
	ms.memory, ms.draining = MemoryUnchecked, false
	e.setHolding(m.Name, ms, true)
	e.m.seatWait.WithLabelValues(e.cfg.Name, m.Name).Observe(e.d.Demand(m.Name).OldestWait.Seconds())
	if !swapStart.IsZero() {
		ev.SwapSeconds = ev.End.Sub(swapStart).Seconds()
		e.m.swaps.WithLabelValues(e.cfg.Name, m.Name).Inc()
		e.m.swapSeconds.WithLabelValues(e.cfg.Name).Observe(ev.SwapSeconds)
	}
	e.d.Release(m.Name)
	e.record(ev, resultOK)
	return nil
}

func (e *Executor) drain(m Member, a Action) {
	ms := e.st[m.Name]
	e.d.Hold(m.Name)
	if !ms.draining {
		ms.draining, ms.drainStart = true, e.now()
	}
	e.setHolding(m.Name, ms, true)
	e.record(Event{Kind: ActionDrain, App: m.Name, For: a.For, Start: e.now(), End: e.now(), OverBudget: a.For == "", Reason: a.Reason}, resultOK)
}

func (e *Executor) resume(m Member, a Action) {
	ms := e.st[m.Name]
	ms.draining = false
	e.setHolding(m.Name, ms, true)
	e.d.Release(m.Name)
	e.record(Event{Kind: ActionResume, App: m.Name, Start: e.now(), End: e.now(), Reason: a.Reason}, resultOK)
}

// sleep closes the gate, makes sure nothing is in flight, puts the engine
// to sleep and reads its memory.
func (e *Executor) sleep(ctx context.Context, m Member, a Action) error {
	ms := e.st[m.Name]
	e.d.Hold(m.Name)
	ev := Event{Kind: ActionSleep, App: m.Name, For: a.For, Start: e.now(), OverBudget: a.For == "" && !a.Idle, Idle: a.Idle, Reason: a.Reason}
	if n := e.d.Demand(m.Name).InFlight; n > 0 {
		// A request was dispatched between the observation and the gate
		// closing: drain it first.
		if !ms.draining {
			ms.draining, ms.drainStart = true, e.now()
		}
		ev.End, ev.InFlight, ev.Err = e.now(), n, fmt.Sprintf("%d requests in flight when the gate closed; draining first", n)
		e.record(ev, resultRetry)
		return errReplan
	}
	if ms.draining {
		e.m.drain.WithLabelValues(e.cfg.Name).Observe(e.now().Sub(ms.drainStart).Seconds())
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.SleepTimeout)
	err := m.Sidecar.Sleep(sctx, a.Level)
	cancel()
	ev.End = e.now()
	if err != nil {
		// The engine stays awake (abandoned, not drained) or its state
		// settles; keep it draining so that no request reaches it, and
		// let the next decision see what the seat says.
		ms.draining = true
		ev.Err = err.Error()
		e.record(ev, resultFailed)
		return err
	}
	ms.draining = false
	e.setHolding(m.Name, ms, false)
	res, check, err := e.readMemory(ctx, m)
	ms.memory = check
	return e.recordMemory(ev, res, check, err)
}

func (e *Executor) checkMemory(ctx context.Context, m Member, a Action) error {
	ev := Event{Kind: ActionCheckMemory, App: m.Name, Start: e.now(), Reason: a.Reason}
	res, check, err := e.readMemory(ctx, m)
	ev.End = e.now()
	e.st[m.Name].memory = check
	return e.recordMemory(ev, res, check, err)
}

// recordMemory records ev with what reading an asleep engine's memory
// found: failed when it could not be read, a retry (errReplan) when the
// engine still holds its weights.
func (e *Executor) recordMemory(ev Event, res int64, check MemoryCheck, err error) error {
	ev.ResidentBytes = res
	if err != nil {
		ev.Err = err.Error()
		e.record(ev, resultFailed)
		return err
	}
	if check == MemoryNotFreed {
		ev.Err = fmt.Sprintf("asleep but still holds %d bytes", res)
		e.record(ev, resultRetry)
		return errReplan
	}
	e.record(ev, resultOK)
	return nil
}

func (e *Executor) restart(ctx context.Context, m Member, a Action) error {
	ev := Event{Kind: ActionRestart, App: m.Name, Start: e.now(), Reason: a.Reason}
	reason := reasonFailed
	if e.st[m.Name].memory == MemoryNotFreed {
		reason = reasonMemoryNotFreed
	}
	if m.Restarter == nil {
		ev.End, ev.Err = e.now(), "no way to restart this engine is configured"
		e.record(ev, resultFailed)
		return errors.New(ev.Err)
	}
	err := m.Restarter.Restart(ctx)
	if err == nil {
		var check MemoryCheck
		ev.ResidentBytes, check, err = e.readMemory(ctx, m)
		e.st[m.Name].memory = check
		if err == nil && check == MemoryNotFreed {
			err = fmt.Errorf("restarted, but it still holds %d bytes", ev.ResidentBytes)
		}
	}
	ev.End = e.now()
	if err != nil {
		ev.Err = err.Error()
		e.record(ev, resultFailed)
		return err
	}
	e.st[m.Name].restarted = ev.End
	e.m.restarts.WithLabelValues(e.cfg.Name, m.Name, reason).Inc()
	e.record(ev, resultOK)
	return nil
}

// readMemory reads m's memory and judges it against MaxResidentFraction of
// its weights.
func (e *Executor) readMemory(ctx context.Context, m Member) (int64, MemoryCheck, error) {
	if m.Memory == nil {
		return 0, MemoryFreed, nil
	}
	r, err := m.Memory.ReadMemory(ctx)
	if errors.Is(err, ErrMemoryNotReported) {
		return 0, MemoryFreed, nil
	}
	if err != nil {
		return 0, MemoryUnchecked, fmt.Errorf("reading %s's memory: %w", m.Name, err)
	}
	weights := r.WeightsBytes
	if weights == 0 {
		weights = m.WeightsBytes
	}
	if float64(r.ResidentBytes) > e.cfg.MaxResidentFraction*float64(weights) {
		return r.ResidentBytes, MemoryNotFreed, nil
	}
	return r.ResidentBytes, MemoryFreed, nil
}
