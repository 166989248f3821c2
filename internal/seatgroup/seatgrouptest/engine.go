// Package seatgrouptest runs a seat group in one process for tests and
// benchmarks: simulator engines with real weights, each behind a real seat
// agent (checkpoint.Seat over HTTP), a dispatcher that queues requests and
// gates them as the lifecycle decision-maker does, the seatgroup executor,
// and request generators.
package seatgrouptest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/model-orchestra/operator/internal/sim"
)

// Engine is one simulated engine process. Restart stops the process (its
// memory, leaked or not, is returned); while stopped it answers the sleep
// API as an engine asleep at level 2 with nothing resident, and its next
// wake starts a new process that loads and verifies its weights. This is
// the restart the executor relies on: stop now, start on the next wake.
type Engine struct {
	name   string
	cfg    sim.Config
	log    *slog.Logger
	budget *budget

	mu       sync.Mutex
	s        *sim.Simulator
	h        http.Handler
	restarts int
	starts   int
	// sleepsInFlight counts sleeps that reached the engine while it ran
	// requests, or while the dispatcher had requests for it on their way
	// (the simulator refuses the first; a real vLLM dies of both).
	sleepsInFlight int
	// dispatched is the dispatcher's in-flight count for this engine.
	dispatched func() int
}

func newEngine(name string, cfg sim.Config, b *budget, log *slog.Logger) (*Engine, error) {
	e := &Engine{name: name, cfg: cfg, log: log, budget: b}
	if err := e.start(); err != nil {
		return nil, err
	}
	return e, nil
}

// start runs a new process: it loads the weights (from the seed, hashed)
// and serves awake.
func (e *Engine) start() error {
	s := sim.New(e.cfg, sim.WithLogger(e.log))
	if err := s.LoadWeights(); err != nil {
		return fmt.Errorf("engine %s: loading weights: %w", e.name, err)
	}
	e.s, e.h = s, s.Handler()
	e.starts++
	return nil
}

// Restart stops the engine's process.
func (e *Engine) Restart(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s != nil {
		e.s.Stop()
		e.s.Close()
		e.s, e.h = nil, nil
	}
	e.restarts++
	return nil
}

// ResidentBytes reads the weight bytes the process holds in memory (the
// simulator's accelerator memory).
func (e *Engine) ResidentBytes(context.Context) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s == nil {
		return 0, nil
	}
	return e.s.WeightsStatus().ResidentBytes, nil
}

// Status reports the engine's weights; ok is false while it is stopped.
func (e *Engine) Status() (st sim.WeightsStatus, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s == nil {
		return st, false
	}
	return e.s.WeightsStatus(), true
}

// Counts returns how often the engine was restarted and started, and how
// many sleeps reached it with requests in flight.
func (e *Engine) Counts() (restarts, starts, sleepsInFlight int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restarts, e.starts, e.sleepsInFlight
}

func (e *Engine) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s != nil {
		e.s.Stop()
		e.s.Close()
		e.s, e.h = nil, nil
	}
}

func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	wake := r.Method == http.MethodPost && r.URL.Path == "/wake_up"
	if wake {
		// The accelerator must have room before the weights come back.
		e.mu.Lock()
		asleep := e.s == nil || e.s.IsSleeping()
		e.mu.Unlock()
		if asleep {
			e.budget.admit(e.name, e.cfg.Weights.Bytes)
		}
	}
	e.mu.Lock()
	if e.s == nil && wake {
		// A stopped engine starts on its wake.
		err := e.start()
		e.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
		return
	}
	s, h := e.s, e.h
	if s != nil && r.Method == http.MethodPost && r.URL.Path == "/sleep" && !s.IsSleeping() &&
		(s.WeightsStatus().InFlight > 0 || (e.dispatched != nil && e.dispatched() > 0)) {
		e.sleepsInFlight++
	}
	e.mu.Unlock()
	if h != nil {
		h.ServeHTTP(w, r)
		return
	}
	// Stopped: asleep at level 2, nothing in flight, nothing resident.
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/is_sleeping":
		_, _ = w.Write([]byte(`{"is_sleeping":true}`))
	case r.URL.Path == "/metrics":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"))
	case r.Method == http.MethodPost && (r.URL.Path == "/sleep" || strings.HasPrefix(r.URL.Path, "/collective_rpc") || r.URL.Path == "/reset_prefix_cache"):
		_, _ = w.Write([]byte(`{}`))
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, `{"error":{"message":"engine %s is stopped; wake it first","code":503}}`, e.name)
	}
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
