// Package seatgrouptest runs a seat group in one process for tests and
// benchmarks: simulator engines with real weights, each behind a real
// sidecar (sidecar.Sidecar over HTTP), a dispatcher that queues requests and
// gates them as the lifecycle decision-maker does, the seatgroup executor,
// and request generators.
package seatgrouptest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/model-orchestra/operator/internal/seatgroup/simengine"
	"github.com/model-orchestra/operator/internal/sim"
)

// Engine is one simulated engine process, restartable in place as
// orchestra-sim --restartable runs it in a seat group's pod
// (simengine.Engine): a restart stops the simulated engine (its memory,
// leaked or not, is returned); while stopped it answers the sleep API as an
// engine asleep at level 2 with nothing resident, and its next wake starts
// a new one that loads and verifies its weights. Engine adds the test's
// checks: the accelerator budget at each wake, and sleeps that reach it
// with requests in flight.
type Engine struct {
	name   string
	budget *budget
	e      *simengine.Engine

	mu sync.Mutex
	// sleepsInFlight counts sleeps that reached the engine while it ran
	// requests, or while the dispatcher had requests for it on their way
	// (the simulator refuses the first; a real vLLM dies of both).
	sleepsInFlight int
	// dispatched is the dispatcher's in-flight count for this engine.
	dispatched func() int
	bytes      int64
}

func newEngine(name string, cfg sim.Config, b *budget, log *slog.Logger, opts ...sim.Option) (*Engine, error) {
	e, err := simengine.New(cfg, log, opts...)
	if err != nil {
		return nil, err
	}
	return &Engine{name: name, budget: b, e: e, bytes: cfg.Weights.Bytes}, nil
}

// ResidentBytes reads the weight bytes the process holds in memory (the
// simulator's accelerator memory).
func (e *Engine) ResidentBytes(ctx context.Context) (int64, error) { return e.e.ResidentBytes(ctx) }

// Status reports the engine's weights; ok is false while it is stopped.
func (e *Engine) Status() (st sim.WeightsStatus, ok bool) {
	s := e.e.Simulator()
	if s == nil {
		return st, false
	}
	return s.WeightsStatus(), true
}

// Counts returns how often the engine was restarted and started, and how
// many sleeps reached it with requests in flight.
func (e *Engine) Counts() (restarts, starts, sleepsInFlight int) {
	restarts, starts = e.e.Counts()
	e.mu.Lock()
	defer e.mu.Unlock()
	return restarts, starts, e.sleepsInFlight
}

func (e *Engine) close() { e.e.Close() }

func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := e.e.Simulator()
	if r.Method == http.MethodPost && r.URL.Path == "/wake_up" && (s == nil || s.IsSleeping()) {
		// The accelerator must have room before the weights come back.
		e.budget.admit(e.name, e.bytes)
	}
	if s != nil && r.Method == http.MethodPost && r.URL.Path == "/sleep" && !s.IsSleeping() &&
		(s.WeightsStatus().InFlight > 0 || (e.dispatched != nil && e.dispatched() > 0)) {
		e.mu.Lock()
		e.sleepsInFlight++
		e.mu.Unlock()
	}
	e.e.ServeHTTP(w, r)
}

// budget is the shared accelerator: it records every wake that starts
// while the other engines hold more than the seats leave room for.
type budget struct {
	limit   int64
	engines []*Engine

	mu         sync.Mutex
	violations []string
}

// admit checks, as engine name starts to wake, that the others' resident
// memory leaves room for its bytes. Callers hold no engine's lock.
func (b *budget) admit(name string, bytes int64) {
	var others int64
	for _, e := range b.engines {
		if e.name == name {
			continue
		}
		n, _ := e.ResidentBytes(context.Background())
		others += n
	}
	if others+bytes > b.limit {
		b.mu.Lock()
		b.violations = append(b.violations, fmt.Sprintf("%s woke while the others held %d bytes: %d > the accelerator's %d", name, others, others+bytes, b.limit))
		b.mu.Unlock()
	}
}

func (b *budget) Violations() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.violations...)
}
