package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
)

// vLLM's sleep tags.
const (
	tagWeights = "weights"
	tagKVCache = "kv_cache"
)

// enter admits one inference request if the engine is awake. The caller
// must call leave once done.
func (s *Simulator) enter() error {
	e := &s.engine
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.awakeLocked() {
		s.m.refusedAsleep.Inc()
		switch {
		case e.busy:
			return errors.New("the engine is going to sleep; it accepts no requests until it is woken (POST /wake_up)")
		case e.weightsAwake && !e.loaded:
			return errors.New("the engine's weights are not loaded: finish the level-2 wake with POST /collective_rpc {\"method\":\"reload_weights\"}")
		default:
			return fmt.Errorf("the engine is asleep (level %d); wake it with POST /wake_up before sending requests", e.level)
		}
	}
	e.inFlight++
	return nil
}

func (s *Simulator) leave() {
	e := &s.engine
	e.mu.Lock()
	e.inFlight--
	e.mu.Unlock()
}

func (s *Simulator) sleepHandlers(mux *http.ServeMux) {
	mux.HandleFunc("POST /sleep", s.handleSleep)
	mux.HandleFunc("POST /wake_up", s.handleWakeUp)
	mux.HandleFunc("GET /is_sleeping", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": s.IsSleeping()})
	})
	mux.HandleFunc("POST /collective_rpc", s.handleCollectiveRPC)
	// The simulator has no prefix cache; vLLM's level-2 wake sequence ends
	// with this call, so it answers it.
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		s.prefix.reset()
		w.WriteHeader(http.StatusOK)
	})
}

func (s *Simulator) handleSleep(w http.ResponseWriter, r *http.Request) {
	level := 1
	if v := r.URL.Query().Get("level"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 1 && n != 2) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("level must be 1 or 2, got %q", v))
			return
		}
		level = n
	}
	rep, err := s.Sleep(level)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, ErrRequestsInFlight) {
			status = http.StatusConflict
		}
		writeError(w, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// ErrRequestsInFlight refuses a sleep while requests run. A real vLLM
// answers 200 and then dies (vllm-project/vllm#45520); the simulator refuses
// loudly so tests prove that the engine was drained first.
var ErrRequestsInFlight = errors.New("requests in flight")

// Sleep puts the engine to sleep. Level 1 writes the weights to the hot
// directory and frees them; level 2 frees them. Freeing gives the memory
// back to the device pool (or, with DeviceMemoryKernel, to the kernel).
// Sleeping while asleep does nothing.
func (s *Simulator) Sleep(level int) (*StageReport, error) {
	e := &s.engine
	e.op.Lock()
	defer e.op.Unlock()
	e.mu.Lock()
	if !e.weightsAwake && !e.kvAwake {
		e.mu.Unlock()
		return &StageReport{}, nil
	}
	if e.inFlight > 0 {
		n := e.inFlight
		e.mu.Unlock()
		s.m.sleeps.WithLabelValues(strconv.Itoa(level), "refused").Inc()
		return nil, fmt.Errorf("%w: %d requests are running; drain the engine before putting it to sleep", ErrRequestsInFlight, n)
	}
	e.busy = true
	a, loaded := e.live, e.loaded && e.weightsAwake
	e.mu.Unlock()

	start := time.Now()
	rep := &StageReport{Bytes: a.Len()}
	var err error
	e.mu.Lock()
	kept := e.kept
	e.kept = fileID{}
	e.mu.Unlock()
	switch {
	case level == 1 && loaded && a.Len() > 0:
		rep.Tier = v1alpha1.TierHot
		rep.Source = s.offloadPath()
		if kept.valid() && kept == statFileID(rep.Source) {
			rep.ReusedOffload = true
			break
		}
		err = arena.WriteFile(rep.Source, a.Bytes(), false)
		if err == nil {
			// The node agent reads the offload back to demote it, as a
			// member of the hot directory's group (which the directory
			// gives the file), not as its owner.
			err = os.Chmod(rep.Source, offloadMode)
		}
		rep.CopySeconds = time.Since(start).Seconds()
	case s.cfg.Sleep.KeepOffload:
		// Level 2 holds nothing in RAM: drop the kept offload.
		if rerr := os.Remove(s.offloadPath()); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			s.log.Error("removing the kept level-1 offload", "path", s.offloadPath(), "err", rerr)
		}
	}
	if err != nil {
		rep.Error = err.Error()
		e.mu.Lock()
		e.busy, e.lastSleep = false, rep
		e.mu.Unlock()
		s.m.sleeps.WithLabelValues(strconv.Itoa(level), "failed").Inc()
		s.log.Error("sleep failed; the engine stays awake", "level", level, "err", err)
		return nil, fmt.Errorf("offloading the weights to the hot tier: %w", err)
	}
	t := time.Now()
	e.mu.Lock()
	if s.cfg.Faults.SleepLeak {
		if a != nil {
			e.leaked = append(e.leaked, a)
		}
		s.m.faults.WithLabelValues("sleep_leak").Inc()
	} else {
		a.Free()
	}
	e.live, e.loaded = nil, false
	e.level, e.weightsAwake, e.kvAwake, e.busy = level, false, false, false
	s.prefix.reset() // a sleep discards the KV cache, and the prefixes in it
	rep.FreeSeconds = time.Since(t).Seconds()
	rep.TotalSeconds = time.Since(start).Seconds()
	e.lastSleep = rep
	s.m.residentBytes.Set(float64(e.residentLocked()))
	e.mu.Unlock()
	s.m.level.Set(float64(level))
	s.m.sleeps.WithLabelValues(strconv.Itoa(level), "ok").Inc()
	s.m.stage(opSleep, rep)
	s.log.Info("engine asleep", "level", level, "bytes", rep.Bytes, "tier", rep.Tier, "seconds", rep.TotalSeconds)
	return rep, nil
}

func (s *Simulator) handleWakeUp(w http.ResponseWriter, r *http.Request) {
	var tags []string
	for _, v := range r.URL.Query()["tags"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				tags = append(tags, t)
			}
		}
	}
	for _, t := range tags {
		if t != tagWeights && t != tagKVCache {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown wake_up tag %q: want weights or kv_cache", t))
			return
		}
	}
	rep, err := s.WakeUp(r.Context(), tags...)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// WakeUp wakes the given tags (all when none). Waking the weights after a
// level-1 sleep restores them from the hot directory. After a level-2 sleep,
// waking all tags reloads them too; waking only the weights allocates them,
// and collective_rpc reload_weights (ReloadWeights) fills them, as in vLLM's
// documented sequence. Every restore is verified against the load digest.
func (s *Simulator) WakeUp(ctx context.Context, tags ...string) (*StageReport, error) {
	e := &s.engine
	e.op.Lock()
	defer e.op.Unlock()
	wantWeights := len(tags) == 0 || slices.Contains(tags, tagWeights)
	wantKV := len(tags) == 0 || slices.Contains(tags, tagKVCache)

	e.mu.Lock()
	level, weightsAwake := e.level, e.weightsAwake
	e.mu.Unlock()
	rep := &StageReport{}
	if wantWeights && !weightsAwake {
		if err := s.wakeFaults(ctx); err != nil {
			return nil, err
		}
		// Level 1 always restores; level 2 restores only when no tag
		// sequence is used (tags=weights only allocates, like vLLM).
		restore := level == 1 || len(tags) == 0
		var err error
		rep, err = s.restore(ctx, restore)
		if err != nil {
			return nil, err
		}
	}
	e.mu.Lock()
	if wantKV {
		e.kvAwake = true
	}
	awake := e.weightsAwake && e.kvAwake
	if awake {
		e.level = 0
	}
	e.mu.Unlock()
	if awake {
		s.m.level.Set(0)
		s.log.Info("engine awake", "tier", rep.Tier, "bytes", rep.Bytes, "seconds", rep.TotalSeconds)
	}
	return rep, nil
}

func (s *Simulator) wakeFaults(ctx context.Context) error {
	f := s.cfg.Faults
	if f.WakeDelay > 0 {
		s.m.faults.WithLabelValues("slow_wake").Inc()
		if err := sleep(ctx, f.WakeDelay); err != nil {
			return fmt.Errorf("wake abandoned: %w", err)
		}
	}
	if f.WakeFail {
		s.m.faults.WithLabelValues("wake_fail").Inc()
		s.m.wakes.WithLabelValues("none", "failed").Inc()
		return errors.New("injected wake failure: the engine stays asleep")
	}
	return nil
}

// ReloadWeights is collective_rpc reload_weights: it fills allocated
// weights from the best tier and verifies them.
func (s *Simulator) ReloadWeights(ctx context.Context) (*StageReport, error) {
	e := &s.engine
	e.op.Lock()
	defer e.op.Unlock()
	e.mu.Lock()
	awake, loaded := e.weightsAwake, e.loaded
	e.mu.Unlock()
	if !awake {
		return nil, errors.New("reload_weights needs the weights awake: call POST /wake_up?tags=weights first")
	}
	if loaded {
		return &StageReport{Verified: true}, nil
	}
	// wake_up?tags=weights allocated the weights unfilled: give that arena
	// back before filling a new one, so the engine never holds them twice
	// (nor keeps the first). Should the reload fail, the engine is asleep
	// with nothing allocated, as after any failed wake.
	e.mu.Lock()
	if e.live != nil {
		e.live.Free()
	}
	e.live, e.weightsAwake = nil, false
	e.mu.Unlock()
	return s.restore(ctx, true)
}

func (s *Simulator) handleCollectiveRPC(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Method string `json:"method"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return
	}
	switch req.Method {
	case "reload_weights":
		rep, err := s.ReloadWeights(r.Context())
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"results": []any{rep}})
	case "reset_prefix_cache":
		s.prefix.reset()
		writeJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("collective_rpc method %q is not simulated (reload_weights, reset_prefix_cache)", req.Method))
	}
}
