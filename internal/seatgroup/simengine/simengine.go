// Package simengine runs the simulator as an engine that can be restarted
// in place, for seat groups (orchestra-sim --restartable): the restart a
// seat group needs when an engine sleeps without freeing its memory
// (vllm-project/vllm#47654, the simulator's --fault-sleep-leak).
//
// Restart stops the simulated engine, which unmaps all its memory, leaked
// or not; the process and its HTTP server keep running, so the pod's other
// engines and its readiness are not touched. While stopped, the engine
// answers vLLM's sleep API as an engine asleep at level 2 with nothing
// resident, and its next wake starts a new simulated engine, which loads
// its weights from their source (the cold tier) and verifies them as at
// any start. The sidecar asks for a restart over localhost
// (POST /orchestra/restart, sidecar.Restarter); no signal, shared
// process namespace or privilege is involved.
package simengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/sim"
)

// RestartPath is the engine's restart endpoint.
const RestartPath = "/orchestra/restart"

// Engine is one restartable simulated engine.
type Engine struct {
	cfg  sim.Config
	log  *slog.Logger
	opts []sim.Option

	mu       sync.Mutex
	s        *sim.Simulator
	h        http.Handler
	restarts int
	starts   int
	// bytes is the size of the weights, reported while stopped.
	bytes int64
}

// New starts an engine: it loads the weights and serves awake. opts are
// given to every simulated engine it starts.
func New(cfg sim.Config, log *slog.Logger, opts ...sim.Option) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid simulator config: %w", err)
	}
	e := &Engine{cfg: cfg, log: log, opts: opts}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.startLocked(); err != nil {
		if !errors.Is(err, arena.ErrDeviceFull) {
			return nil, err
		}
		// The pod's shared device (--device-file) is held by the group's
		// other engines: start stopped, as asleep with nothing resident;
		// the wake that gives this engine the seat loads its weights.
		e.log.Info("device full at start: the engine starts asleep and loads its weights on its first wake", "err", err)
		if e.bytes = cfg.Weights.Bytes; cfg.Weights.File != "" {
			if fi, err := os.Stat(cfg.Weights.File); err == nil {
				e.bytes = fi.Size()
			}
		}
	}
	return e, nil
}

func (e *Engine) startLocked() error {
	s := sim.New(e.cfg, append([]sim.Option{sim.WithLogger(e.log)}, e.opts...)...)
	if err := s.LoadWeights(); err != nil {
		s.Close()
		return fmt.Errorf("engine %s: loading weights: %w", e.cfg.Model, err)
	}
	e.s, e.h = s, s.Handler()
	e.bytes = s.WeightsStatus().Bytes
	e.starts++
	return nil
}

// Restart stops the simulated engine and returns its memory; its next wake
// starts a new one.
func (e *Engine) Restart(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
	e.restarts++
	e.log.Info("engine restarted: stopped until its next wake", "restarts", e.restarts)
	return nil
}

func (e *Engine) stopLocked() {
	if e.s != nil {
		e.s.Stop()
		e.s.Close()
		e.s, e.h = nil, nil
	}
}

// Close stops the engine for good.
func (e *Engine) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
}

// Simulator returns the running simulated engine, nil while stopped.
func (e *Engine) Simulator() *sim.Simulator {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.s
}

// Counts returns how often the engine was restarted and started.
func (e *Engine) Counts() (restarts, starts int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.restarts, e.starts
}

// ResidentBytes reads the weight bytes the engine holds (0 while stopped).
func (e *Engine) ResidentBytes(context.Context) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s == nil {
		return 0, nil
	}
	return e.s.WeightsStatus().ResidentBytes, nil
}

// Restarted is the answer of POST /orchestra/restart.
type Restarted struct {
	Restarts int `json:"restarts"`
}

// ServeHTTP serves the simulator's API while it runs, and the stopped
// engine's otherwise; POST /orchestra/restart restarts it.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == RestartPath {
		if err := e.Restart(r.Context()); err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": err.Error(), "code": 500}})
			return
		}
		restarts, _ := e.Counts()
		writeJSON(w, http.StatusOK, Restarted{Restarts: restarts})
		return
	}
	wake := r.Method == http.MethodPost && r.URL.Path == "/wake_up"
	e.mu.Lock()
	if e.s == nil && wake {
		// A stopped engine starts on its wake.
		err := e.startLocked()
		e.mu.Unlock()
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": err.Error(), "code": 500}})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{})
		return
	}
	h := e.h
	e.mu.Unlock()
	if h != nil {
		h.ServeHTTP(w, r)
		return
	}
	e.serveStopped(w, r)
}

// serveStopped answers as an engine asleep at level 2 with nothing
// resident and nothing in flight.
func (e *Engine) serveStopped(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/health":
		w.WriteHeader(http.StatusOK)
	case r.URL.Path == "/is_sleeping":
		writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": true})
	case r.URL.Path == "/orchestra/weights":
		e.mu.Lock()
		bytes := e.bytes
		e.mu.Unlock()
		writeJSON(w, http.StatusOK, sim.WeightsStatus{Bytes: bytes, Name: e.cfg.WeightsName(), Sleeping: true, Level: 2})
	case r.URL.Path == "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"))
	case r.Method == http.MethodPost && (r.URL.Path == "/sleep" || strings.HasPrefix(r.URL.Path, "/collective_rpc") || r.URL.Path == "/reset_prefix_cache"):
		writeJSON(w, http.StatusOK, map[string]any{})
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]any{
			"message": fmt.Sprintf("engine %s is stopped (restarted); wake it first", e.cfg.Model), "code": 503}})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Run serves a restartable engine on cfg.Addr until ctx ends. Injected
// crashes abort only the request's connection here: the process stays up.
func Run(ctx context.Context, cfg sim.Config, log *slog.Logger) error {
	e, err := New(cfg, log)
	if err != nil {
		return err
	}
	defer e.Close()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("restartable simulator serving", "addr", ln.Addr().String(), "model", cfg.Model)
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	if s := e.Simulator(); s != nil {
		s.Stop()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = srv.Close()
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}
