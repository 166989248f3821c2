package sidecar

// Restarting an engine in place: a seat-group pod restarts one engine that
// did not return its memory without touching the pod's other engines.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// Restarter is implemented by adapters whose engine can be restarted in
// place: the engine returns all its memory and stays stopped, answering as
// asleep at level 2, until its next wake starts it again (the simulator
// with --restartable, internal/seatgroup/simengine).
type Restarter interface {
	Restart(ctx context.Context) error
}

// ErrRestartUnsupported refuses a restart of an engine that cannot be
// restarted in place.
var ErrRestartUnsupported = errors.New("this engine cannot be restarted in place")

// Restart restarts an asleep (or Failed) engine in place, which returns
// all its memory, leaked or not (vllm-project/vllm#47654), and leaves it
// asleep at level 2. An awake engine is refused: a restart would cut its
// requests. The engine restarts itself when it can (the simulator with
// --restartable: it stays stopped until its next wake); otherwise, with
// --restart-process, the sidecar stops the engine container's processes, waits
// for the kubelet to start the container again and for the engine to
// answer, and puts it to sleep at level 2 if it started awake. The sidecar is
// Restarting meanwhile.
func (s *Sidecar) Restart(ctx context.Context) error {
	r, inPlace := s.engine.(Restarter)
	if !inPlace && (s.proc == nil || !s.cfg.RestartProcess) {
		return fmt.Errorf("%w: %s (start the sidecar with --restart-process in a pod that shares its process namespace)", ErrRestartUnsupported, s.engine.Name())
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	prev := s.st.State
	switch prev {
	case sidecarapi.Asleep, sidecarapi.Failed:
	default:
		s.mu.Unlock()
		return fmt.Errorf("%w: cannot restart the engine of a sidecar in state %s (only Asleep or Failed)", ErrWrongState, prev)
	}
	s.setLocked(sidecarapi.Restarting)
	s.mu.Unlock()

	start := s.now()
	rep := &sidecarapi.RestartReport{Via: sidecarapi.RestartViaEngine, At: start}
	var err error
	if inPlace {
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.SleepTimeout)
		err = r.Restart(opCtx)
		if err == nil {
			err = s.checkAsleep(opCtx)
		}
		cancel()
	}
	if (!inPlace || errors.Is(err, ErrRestartUnsupported)) && s.proc != nil && s.cfg.RestartProcess {
		rep.Via = sidecarapi.RestartViaProcess
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WakeTimeout)
		rep.Stopped, err = s.restartProcess(opCtx)
		cancel()
	}
	if errors.Is(err, ErrRestartUnsupported) {
		s.mu.Lock()
		s.setLocked(prev)
		s.mu.Unlock()
		return fmt.Errorf("%w (start the sidecar with --restart-process in a pod that shares its process namespace)", err)
	}
	rep.Seconds = s.now().Sub(start).Seconds()
	result := "ok"
	s.mu.Lock()
	s.st.LastRestart = rep
	if err != nil {
		result = "failed"
		rep.Error = err.Error()
		s.st.LastError = "restart: " + err.Error()
		s.setLocked(sidecarapi.Failed)
	} else {
		s.st.Restarts++
		s.st.Level, s.st.LastError = 2, ""
		s.setLocked(sidecarapi.Asleep)
	}
	s.mu.Unlock()
	s.m.transitions.WithLabelValues("restart", result).Inc()
	if err != nil {
		s.log.Warn("engine restart failed", "via", rep.Via, "err", err)
		return fmt.Errorf("%s restart: %w", s.engine.Name(), err)
	}
	s.m.seconds.WithLabelValues("restart").Observe(rep.Seconds)
	s.log.Info("engine restarted", "via", rep.Via, "seconds", rep.Seconds)
	return nil
}

// checkAsleep fails unless the engine says it sleeps.
func (s *Sidecar) checkAsleep(ctx context.Context) error {
	asleep, err := s.engine.Sleeping(ctx)
	if err == nil && !asleep {
		err = errors.New("the engine says it is awake after the restart")
	}
	return err
}

// restartProcess stops the engine container's processes, waits until the
// restarted engine answers and puts it to sleep at level 2 if it started
// awake (vLLM loads its weights at start, as does llama.cpp's router with
// load-on-startup; Ollama starts with no model loaded).
func (s *Sidecar) restartProcess(ctx context.Context) (*sidecarapi.StopReport, error) {
	rep, err := s.proc.Stop(ctx)
	if err != nil {
		return &rep, fmt.Errorf("stopping the engine's processes: %w", err)
	}
	if len(rep.PIDs) == 0 {
		s.log.Info("the engine is not running (nothing listens on its port); waiting for its container to start again")
	} else {
		s.log.Info("engine processes stopped; waiting for the container to start again", "pids", rep.PIDs, "cmdline", rep.Cmdline, "killed", rep.Killed)
	}
	var asleep bool
	if err := s.waitEngine(ctx, func() error {
		var err error
		asleep, err = s.engine.Sleeping(ctx)
		return err
	}); err != nil {
		return &rep, fmt.Errorf("waiting for the restarted engine to answer: %w", err)
	}
	if !asleep {
		if err := s.engine.Sleep(ctx, 2); err != nil {
			return &rep, fmt.Errorf("putting the restarted engine to sleep at level 2: %w", err)
		}
	}
	return &rep, nil
}

// waitEngine polls try every poll interval until it succeeds or ctx ends.
func (s *Sidecar) waitEngine(ctx context.Context, try func() error) error {
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		err := try()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}
