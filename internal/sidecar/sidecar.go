package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/agenthttp"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// ErrSleepAbandoned is returned by a sleep that a wake overtook while it
// drained: the engine stays awake.
var ErrSleepAbandoned = errors.New("sleep abandoned: a wake arrived while draining")

// ErrWrongState refuses an operation the sidecar's state does not allow (a
// sleep while Waking, a wake before the engine ever answered).
var ErrWrongState = errors.New("not allowed in the sidecar's state")

// ErrDrainTimeout is returned when the engine did not drain in time; the
// engine stays awake.
var ErrDrainTimeout = errors.New("the engine did not drain in time")

// TransferReporter is implemented by adapters whose engine reports what a
// sleep or wake moved; the sidecar records it in the transition.
type TransferReporter interface {
	// LastTransfer is what the last successful Sleep or Wake moved, or nil.
	LastTransfer() *sidecarapi.Transfer
}

// EngineWeights is what an engine reports about its weights.
type EngineWeights struct {
	Bytes         int64  `json:"bytes"`
	Digest        string `json:"digest,omitempty"`
	ResidentBytes int64  `json:"residentBytes"`
}

// WeightsReporter is implemented by adapters whose engine reports its
// weights; ok is false when this engine does not.
type WeightsReporter interface {
	Weights(ctx context.Context) (w EngineWeights, ok bool, err error)
}

// weightsTimeout bounds the engine call GET /state makes for the weights,
// and the device memory reading.
const weightsTimeout = time.Second

// state is the sidecar's status with what the engine reports about its
// weights now, when it reports them, and its device memory, when the sidecar
// reads it: then residentBytes is the device memory, else the engine's
// report, and memorySource says which.
func (s *Sidecar) state(ctx context.Context) sidecarapi.Status {
	st := s.Status()
	ctx, cancel := context.WithTimeout(ctx, weightsTimeout)
	defer cancel()
	if s.device != nil {
		b, err := s.deviceBytes(ctx)
		if err != nil {
			s.log.Debug("reading the engine's device memory", "err", err)
			st.DeviceMemoryError = err.Error()
		} else {
			st.ResidentBytes, st.MemorySource = &b, MemorySourceNvidiaSMI
		}
	}
	if r, ok := s.engine.(ModelCopyReporter); ok {
		st.Model = r.ModelCopy(st.State == sidecarapi.Awake)
	}
	return s.withWeights(ctx, st)
}

// withWeights adds what the engine reports about its weights, when it
// reports them, to st: their digest and bytes, and, unless the device
// memory was read, the memory holding them.
func (s *Sidecar) withWeights(ctx context.Context, st sidecarapi.Status) sidecarapi.Status {
	wr, ok := s.engine.(WeightsReporter)
	if !ok {
		return st
	}
	w, ok, err := wr.Weights(ctx)
	if err != nil {
		s.log.Debug("reading the engine's weights", "err", err)
		if st.MemorySource == "" {
			st.WeightsError = err.Error()
		}
		return st
	}
	if ok {
		st.Digest, st.WeightsBytes = w.Digest, &w.Bytes
		if st.MemorySource == "" {
			st.ResidentBytes, st.MemorySource = &w.ResidentBytes, MemorySourceEngine
		}
	}
	return st
}

// deviceBytes is the device memory of the engine container's processes.
func (s *Sidecar) deviceBytes(ctx context.Context) (int64, error) {
	pids, err := s.proc.PIDs()
	if err != nil {
		return 0, fmt.Errorf("finding the engine's processes: %w", err)
	}
	return s.device.Bytes(ctx, pids)
}

// Sidecar drives one engine's sleep and wake for the lifecycle decision-maker.
type Sidecar struct {
	cfg    Config
	engine Engine
	log    *slog.Logger
	m      *sidecarMetrics
	now    func() time.Time
	// proc finds and stops the engine's processes in the pod's shared
	// process namespace (nil: the sidecar cannot see them).
	proc *EngineProcess
	// device reads the engine's device memory (nil: not read).
	device *NvidiaSMI

	op sync.Mutex // one engine operation at a time

	mu          sync.Mutex
	st          sidecarapi.Status
	cancelDrain context.CancelFunc
}

// New returns a sidecar in state Unknown; Sync or Run learn the engine's
// state.
func New(cfg Config, engine Engine, reg prometheus.Registerer, log *slog.Logger) *Sidecar {
	s := &Sidecar{cfg: cfg, engine: engine, log: log, m: newSidecarMetrics(reg), now: time.Now}
	if cfg.RestartProcess || cfg.NvidiaSMI != "" {
		p, err := NewEngineProcess(cfg.Engine.Kind, enginePort(cfg.Engine.URL), cfg.RestartGrace)
		if err != nil {
			log.Warn("the engine's processes cannot be found", "err", err)
		} else {
			p.Proc = cfg.Proc
			s.proc = p
			if cfg.NvidiaSMI != "" {
				s.device = &NvidiaSMI{Path: cfg.NvidiaSMI, Proc: cfg.Proc}
			}
		}
	}
	s.st = sidecarapi.Status{State: sidecarapi.Unknown, Engine: engine.Name(), Since: s.now()}
	s.m.setState(sidecarapi.Unknown)
	return s
}

// Status returns the sidecar's status.
func (s *Sidecar) Status() sidecarapi.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *Sidecar) setLocked(st sidecarapi.State) {
	if s.st.State != st {
		s.log.Info("sidecar state", "from", s.st.State, "to", st)
		s.st.State, s.st.Since = st, s.now()
		s.m.setState(st)
	}
}

// Sync asks the engine whether it sleeps and adopts its answer when no
// operation runs. An engine that sleeps on its own (llama.cpp
// --sleep-idle-seconds) becomes Asleep; an unreachable one Unknown.
func (s *Sidecar) Sync(ctx context.Context) {
	if !s.op.TryLock() {
		return
	}
	defer s.op.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PollInterval+time.Second)
	defer cancel()
	asleep, err := s.engine.Sleeping(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		if s.st.State != sidecarapi.Failed {
			s.setLocked(sidecarapi.Unknown)
		}
		s.st.LastError = err.Error()
	case asleep && s.st.State != sidecarapi.Asleep:
		s.setLocked(sidecarapi.Asleep)
	case !asleep && s.st.State != sidecarapi.Awake:
		s.setLocked(sidecarapi.Awake)
		s.st.Level = 0
	}
}

// Sleep drains the engine (waits until it reports no request in flight),
// then puts it to sleep at level (0: the configured level). A wake that
// arrives while draining abandons the sleep. Sleeping an Asleep sidecar does
// nothing.
func (s *Sidecar) Sleep(ctx context.Context, level int) (err error) {
	if level == 0 {
		level = s.cfg.SleepLevel
	}
	if level != 1 && level != 2 {
		return fmt.Errorf("sleep level must be 1 or 2, got %d", level)
	}
	drainCtx, cancel := context.WithTimeout(ctx, s.cfg.DrainTimeout)
	defer cancel()
	s.mu.Lock()
	switch s.st.State {
	case sidecarapi.Asleep:
		s.mu.Unlock()
		return nil
	case sidecarapi.Awake:
	default:
		st := s.st.State
		s.mu.Unlock()
		return fmt.Errorf("%w: cannot sleep a sidecar in state %s", ErrWrongState, st)
	}
	s.mu.Unlock()

	s.op.Lock()
	defer s.op.Unlock()
	start := s.now()
	defer func() { s.record(true, level, start, err) }()

	s.mu.Lock()
	if s.st.State != sidecarapi.Awake {
		// A concurrent operation won (another sleep, or a failure).
		st := s.st.State
		s.mu.Unlock()
		if st == sidecarapi.Asleep {
			return nil
		}
		return fmt.Errorf("%w: cannot sleep a sidecar in state %s", ErrWrongState, st)
	}
	s.setLocked(sidecarapi.Draining)
	s.cancelDrain = cancel
	s.mu.Unlock()

	if err := s.drain(drainCtx); err != nil {
		s.mu.Lock()
		s.cancelDrain = nil
		s.setLocked(sidecarapi.Awake)
		s.mu.Unlock()
		if errors.Is(err, context.Canceled) && ctx.Err() == nil {
			return ErrSleepAbandoned
		}
		return err
	}
	s.mu.Lock()
	s.cancelDrain = nil
	s.setLocked(sidecarapi.FallingAsleep)
	s.mu.Unlock()

	// Past the drain the engine call must finish: a caller that leaves
	// does not cancel it, its own timeout bounds it.
	opCtx, opCancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.SleepTimeout)
	defer opCancel()
	if err := s.engine.Sleep(opCtx, level); err != nil {
		s.settle(opCtx, err)
		return fmt.Errorf("%s sleep: %w", s.engine.Name(), err)
	}
	s.mu.Lock()
	s.st.Level = level
	s.setLocked(sidecarapi.Asleep)
	s.mu.Unlock()
	return nil
}

// drain waits until the engine reports no request in flight. An engine that
// cannot tell (-1) is trusted to the dispatcher's fence.
func (s *Sidecar) drain(ctx context.Context) error {
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		n, err := s.engine.InFlight(ctx)
		if err == nil && n <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				if err != nil {
					return fmt.Errorf("%w after %v: asking the engine: %w", ErrDrainTimeout, s.cfg.DrainTimeout, err)
				}
				return fmt.Errorf("%w: %d requests still in flight after %v", ErrDrainTimeout, n, s.cfg.DrainTimeout)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// settle decides the state after a failed engine call from what the engine
// says now.
func (s *Sidecar) settle(ctx context.Context, cause error) {
	asleep, err := s.engine.Sleeping(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.LastError = cause.Error()
	switch {
	case err != nil:
		s.setLocked(sidecarapi.Failed)
	case asleep:
		s.setLocked(sidecarapi.Asleep)
	default:
		s.setLocked(sidecarapi.Awake)
		s.st.Level = 0
	}
}

// Wake wakes the engine. A wake during a drain abandons that sleep; waking
// an Awake sidecar does nothing; concurrent wakes share one engine wake.
func (s *Sidecar) Wake(ctx context.Context) (err error) {
	s.mu.Lock()
	if s.st.State == sidecarapi.Draining && s.cancelDrain != nil {
		s.cancelDrain()
	}
	s.mu.Unlock()

	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	switch s.st.State {
	case sidecarapi.Awake:
		s.mu.Unlock()
		return nil
	case sidecarapi.Unknown:
		s.mu.Unlock()
		return fmt.Errorf("%w: the engine has not answered yet: %s", ErrWrongState, s.Status().LastError)
	}
	level := s.st.Level
	s.setLocked(sidecarapi.Waking)
	s.mu.Unlock()

	start := s.now()
	defer func() { s.record(false, level, start, err) }()
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WakeTimeout)
	defer cancel()
	if err := s.engine.Wake(opCtx); err != nil {
		s.settle(opCtx, err)
		return fmt.Errorf("%s wake: %w", s.engine.Name(), err)
	}
	s.mu.Lock()
	s.st.Level = 0
	s.st.LastError = ""
	s.setLocked(sidecarapi.Awake)
	s.mu.Unlock()
	return nil
}

func (s *Sidecar) record(sleep bool, level int, start time.Time, err error) {
	tr := &sidecarapi.Transition{Level: level, At: start, Seconds: s.now().Sub(start).Seconds()}
	if r, ok := s.engine.(TransferReporter); ok && err == nil {
		tr.Transfer = r.LastTransfer()
	}
	op, result := "wake", "ok"
	if sleep {
		op = "sleep"
	}
	if err != nil {
		tr.Error = err.Error()
		result = "failed"
		if errors.Is(err, ErrSleepAbandoned) {
			result = "abandoned"
		}
	}
	s.mu.Lock()
	if sleep {
		s.st.LastSleep = tr
		if err == nil {
			s.st.Sleeps++
		}
	} else {
		s.st.LastWake = tr
		if err == nil {
			s.st.Wakes++
		}
	}
	if err != nil {
		s.st.LastError = err.Error()
	}
	s.mu.Unlock()
	s.m.transitions.WithLabelValues(op, result).Inc()
	if err == nil {
		s.m.seconds.WithLabelValues(op).Observe(tr.Seconds)
	}
	if err != nil {
		s.log.Warn("sidecar transition failed", "op", op, "level", level, "err", err)
	} else {
		s.log.Info("sidecar transition", "op", op, "level", level, "seconds", tr.Seconds)
	}
}

// Handler serves the sidecar API:
//
//	GET  /state          the sidecarapi.Status (JSON), with the engine's weights digest and
//	                     resident bytes when the engine reports them (the simulator)
//	POST /sleep[?level=] drain, then sleep; 200 with the status; 409 when abandoned, not drained
//	                     in time, or in the wrong state; 500 when the engine call failed
//	POST /wake           wake; 200 with the status and the engine's weights; 409 before the engine answered; 500 on failure
//	POST /restart        restart an Asleep or Failed engine in place (its memory returned, asleep at
//	                     level 2 until the next wake): by the engine itself, or by stopping its
//	                     container's processes (--restart-process); 200 with the status once the
//	                     engine answers asleep; 409 in another state; 501 when the engine cannot be
//	                     restarted in place; 500 when the restart failed
//	GET  /readyz         200 only when Awake (the engine container's readiness)
//	GET  /healthz        200 while the agent runs
//
// With a caller token (--caller-token-file) every POST requires it, as
// the node agent's mutating endpoints do (internal/nodeapi): 401 without
// it or with another, 503 while the token file is missing or empty. The
// reads stay open to what the NetworkPolicy admits.
func (s *Sidecar) Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		agenthttp.WriteJSON(w, http.StatusOK, s.state(r.Context()))
	})
	mux.HandleFunc("POST /sleep", func(w http.ResponseWriter, r *http.Request) {
		level := 0
		if v := r.URL.Query().Get("level"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				agenthttp.WriteError(w, http.StatusBadRequest, fmt.Sprintf("level %q is not a number", v))
				return
			}
			level = n
		}
		if err := s.Sleep(r.Context(), level); err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, ErrSleepAbandoned) || errors.Is(err, ErrDrainTimeout) || errors.Is(err, ErrBusy) || errors.Is(err, ErrWrongState) {
				status = http.StatusConflict
			}
			agenthttp.WriteError(w, status, err.Error())
			return
		}
		agenthttp.WriteJSON(w, http.StatusOK, s.Status())
	})
	mux.HandleFunc("POST /wake", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Wake(r.Context()); err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, ErrWrongState) {
				status = http.StatusConflict
			}
			agenthttp.WriteError(w, status, err.Error())
			return
		}
		// The answer carries the engine's digest, which the leader sends
		// the node agent with the wake (its promotions verify against it).
		ctx, cancel := context.WithTimeout(r.Context(), weightsTimeout)
		defer cancel()
		agenthttp.WriteJSON(w, http.StatusOK, s.withWeights(ctx, s.Status()))
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Restart(r.Context()); err != nil {
			status := http.StatusInternalServerError
			switch {
			case errors.Is(err, ErrWrongState):
				status = http.StatusConflict
			case errors.Is(err, ErrRestartUnsupported):
				status = http.StatusNotImplemented
			}
			agenthttp.WriteError(w, status, err.Error())
			return
		}
		agenthttp.WriteJSON(w, http.StatusOK, s.Status())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := s.Status()
		if st.State != sidecarapi.Awake {
			agenthttp.WriteError(w, http.StatusServiceUnavailable, fmt.Sprintf("sidecar is %s, not Awake", st.State))
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return agenthttp.Finish(mux, reg, s.cfg.CallerTokenFile, s.log, "the sidecar's")
}

// Watch keeps the sidecar in step with the engine until ctx ends.
func (s *Sidecar) Watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.Sync(ctx)
		if e, ok := s.engine.(*copyEngine); ok && e.copies.Gone() {
			// The node agent evicted or dropped the copy the link points
			// at: a load the engine starts on its own (Ollama after its
			// idle keep_alive) must find a file.
			if c, err := e.copies.Point(); err != nil {
				s.log.Warn("re-pointing the model link", "err", err)
			} else {
				s.log.Info("the copy the model link pointed at went away; re-pointed", "tier", c.Tier, "path", c.Path, "passedOver", e.copies.PassedOver())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
