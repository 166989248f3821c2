package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
)

// vLLM's sleep tags.
const (
	tagWeights = "weights"
	tagKVCache = "kv_cache"
)

// ErrWeightsNotLoaded is returned by a wake path that needs the weights'
// digest before LoadWeights ran.
var ErrWeightsNotLoaded = errors.New("weights not loaded")

// StageReport times the stages of one sleep or wake.
type StageReport struct {
	// Tier the bytes moved to (sleep) or from (wake): the API's tiers
	// (v1alpha1.Tier), in metrics and in /orchestra/weights too.
	Tier v1alpha1.Tier `json:"tier,omitempty"`
	// Source is the file the bytes came from or went to ("seed" for
	// regenerated synthetic weights).
	Source string `json:"source,omitempty"`
	Bytes  int64  `json:"bytes"`
	// AllocSeconds takes a region of the device pool (already faulted
	// in), or, with device memory returned to the kernel, maps the memory
	// and pre-faults it unless FaultedInCopy.
	AllocSeconds float64 `json:"allocSeconds"`
	// CopySeconds moves the bytes; a restore hashes each chunk right
	// after it is copied, inside this time.
	CopySeconds float64 `json:"copySeconds"`
	// FaultedInCopy is true when the readers faulted the memory in block
	// by block, inside CopySeconds.
	FaultedInCopy bool `json:"faultedInCopy,omitempty"`
	// VerifySeconds is hashing that did not overlap the copy.
	VerifySeconds float64 `json:"verifySeconds"`
	// FreeSeconds gives the weights' memory back (sleep). A wake from the
	// level-1 offload unlinks it once verified; the kernel frees its pages
	// in the background.
	FreeSeconds  float64 `json:"freeSeconds"`
	TotalSeconds float64 `json:"totalSeconds"`
	// Direct is true when the file was read with O_DIRECT.
	Direct bool `json:"direct,omitempty"`
	// ReusedOffload is true when a level-1 sleep wrote nothing: the
	// offload kept since the last wake (Sleep.KeepOffload) was still the
	// file that wake verified.
	ReusedOffload bool `json:"reusedOffload,omitempty"`
	// Verified is true when the bytes hashed to the digest recorded at load.
	Verified bool   `json:"verified,omitempty"`
	Error    string `json:"error,omitempty"`
}

// WeightsStatus is the body of GET /orchestra/weights.
type WeightsStatus struct {
	Bytes    int64  `json:"bytes"`
	Digest   string `json:"digest,omitempty"`
	Name     string `json:"name"`
	Sleeping bool   `json:"sleeping"`
	Level    int    `json:"level"`
	// ResidentBytes is the device memory the engine holds for its
	// weights, as nvidia-smi shows per process: the weights while awake,
	// 0 while asleep unless the memory was not freed (the SleepLeak
	// fault).
	ResidentBytes int64 `json:"residentBytes"`
	// DeviceMemory is "pool" or "kernel" (Config.DeviceMemory).
	DeviceMemory string `json:"deviceMemory,omitempty"`
	// Loaded is false between a level-2 wake_up?tags=weights and the
	// collective_rpc reload_weights that fills them.
	Loaded    bool         `json:"loaded"`
	InFlight  int          `json:"inFlight"`
	Load      *StageReport `json:"load,omitempty"`
	LastSleep *StageReport `json:"lastSleep,omitempty"`
	LastWake  *StageReport `json:"lastWake,omitempty"`
	Wakes     int          `json:"wakes"`
	Verified  int          `json:"verifiedWakes"`
}

// engineState is the sleep state machine. mu guards it; op serialises the
// sleep and wake operations, which do IO without holding mu.
type engineState struct {
	op sync.Mutex
	mu sync.Mutex

	digest arena.Digest
	size   int64
	loaded bool // the arena holds the verified weights

	live   *arena.Arena   // the weights in use
	leaked []*arena.Arena // kept by the SleepLeak fault

	level        int  // 0 awake; 1 or 2 while asleep
	weightsAwake bool // tag weights
	kvAwake      bool // tag kv_cache
	busy         bool // a sleep is in progress: refuse new requests
	inFlight     int

	load, lastSleep, lastWake *StageReport
	wakes, verified           int

	// kept identifies the level-1 offload a wake verified and kept
	// (Sleep.KeepOffload); zero when there is none.
	kept fileID
}

func (e *engineState) awakeLocked() bool {
	return e.weightsAwake && e.kvAwake && e.loaded && !e.busy
}

func (e *engineState) residentLocked() int64 {
	n := e.live.Len()
	for _, a := range e.leaked {
		n += a.Len()
	}
	return n
}

// LoadWeights loads the configured weights into memory and records their
// digest, against which every wake is verified. Run calls it before serving;
// in-process users call it after New. Without weights it does nothing.
func (s *Simulator) LoadWeights() error {
	e := &s.engine
	e.op.Lock()
	defer e.op.Unlock()
	w := s.cfg.Weights
	size := w.Bytes
	if w.File != "" {
		fi, err := os.Stat(w.File)
		if err != nil {
			return fmt.Errorf("weights file: %w", err)
		}
		size = fi.Size()
	}
	start := time.Now()
	a, err := s.alloc(size, true)
	if err != nil {
		return err
	}
	rep := &StageReport{Tier: v1alpha1.TierCold, Bytes: size, AllocSeconds: time.Since(start).Seconds()}
	var d arena.Digest
	if w.File != "" {
		var st arena.FillStats
		d, st, err = arena.FillFile(a, w.File, arena.FileOptions{Direct: true})
		if err != nil {
			a.Free()
			return fmt.Errorf("loading weights: %w", err)
		}
		rep.Source, rep.Direct, rep.FaultedInCopy = w.File, st.Direct, st.Faulted
		rep.CopySeconds, rep.VerifySeconds = st.Copy.Seconds(), st.Verify.Seconds()
	} else {
		t := time.Now()
		arena.Synthesize(a.Bytes(), w.Seed)
		rep.Source, rep.CopySeconds = "seed", time.Since(t).Seconds()
		t = time.Now()
		d = arena.Sum(a.Bytes())
		rep.VerifySeconds = time.Since(t).Seconds()
	}
	rep.TotalSeconds = time.Since(start).Seconds()
	s.m.stage(opLoad, rep)
	e.mu.Lock()
	old := e.live
	e.live, e.digest, e.size, e.loaded, e.load = a, d, size, true, rep
	s.m.residentBytes.Set(float64(e.residentLocked()))
	e.mu.Unlock()
	old.Free()
	s.m.weightsBytes.Set(float64(size))
	s.log.Info("weights loaded", "bytes", size, "digest", d.String(), "source", rep.Source, "seconds", rep.TotalSeconds)
	return nil
}

// Close frees the weights' memory. The simulator answers inference with 503
// afterwards; Run calls it when it stops.
func (s *Simulator) Close() {
	e := &s.engine
	e.op.Lock()
	defer e.op.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.live.Free()
	for _, a := range e.leaked {
		a.Free()
	}
	e.live, e.leaked, e.loaded = nil, nil, false
	s.m.residentBytes.Set(0)
}

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

// IsSleeping is vLLM's is_sleeping: true until every tag is awake.
func (s *Simulator) IsSleeping() bool {
	e := &s.engine
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.weightsAwake || !e.kvAwake
}

// WeightsStatus reports the weights and the last sleep and wake.
func (s *Simulator) WeightsStatus() WeightsStatus {
	e := &s.engine
	e.mu.Lock()
	defer e.mu.Unlock()
	st := WeightsStatus{
		Bytes: e.size, Name: s.cfg.WeightsName(), Sleeping: !e.weightsAwake || !e.kvAwake, Level: e.level,
		ResidentBytes: e.residentLocked(), DeviceMemory: s.deviceMemory(), Loaded: e.loaded, InFlight: e.inFlight,
		Load: e.load, LastSleep: e.lastSleep, LastWake: e.lastWake, Wakes: e.wakes, Verified: e.verified,
	}
	if e.load != nil {
		st.Digest = e.digest.String()
	}
	return st
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

// restore allocates the weights and, with fill, copies them from the best
// tier and verifies them. On any failure the engine stays asleep with
// nothing allocated.
func (s *Simulator) restore(ctx context.Context, fill bool) (*StageReport, error) {
	e := &s.engine
	e.mu.Lock()
	size, digest, level, hasLoad := e.size, e.digest, e.level, e.load != nil
	e.mu.Unlock()
	start := time.Now()
	a, err := s.alloc(size, fill && hasLoad && size > 0)
	if err != nil {
		return nil, err
	}
	rep := &StageReport{Bytes: size, AllocSeconds: time.Since(start).Seconds()}
	if fill && hasLoad && size > 0 {
		err = s.fillFromTier(a, level, digest, rep)
	}
	if err == nil {
		err = ctx.Err()
	}
	rep.TotalSeconds = time.Since(start).Seconds()
	if err != nil {
		a.Free()
		rep.Error = err.Error()
		e.mu.Lock()
		e.lastWake = rep
		e.mu.Unlock()
		result := "failed"
		if errors.Is(err, arena.ErrMismatch) {
			result = "mismatch"
		}
		s.m.wakes.WithLabelValues(tierLabel(rep.Tier), result).Inc()
		s.log.Error("wake failed; the engine stays asleep", "tier", rep.Tier, "source", rep.Source, "err", err)
		return nil, fmt.Errorf("waking from the %s tier: %w", tierLabel(rep.Tier), err)
	}
	e.mu.Lock()
	e.live, e.weightsAwake = a, true
	e.loaded = fill || size == 0 || !hasLoad
	if fill {
		e.lastWake = rep
		e.wakes++
		if rep.Verified {
			e.verified++
		}
	}
	s.m.residentBytes.Set(float64(e.residentLocked()))
	e.mu.Unlock()
	if fill {
		s.m.wakes.WithLabelValues(tierLabel(rep.Tier), "ok").Inc()
		s.m.stage(opWake, rep)
	}
	return rep, nil
}

// alloc gets n bytes of device memory for the weights: a region of the
// device pool, already faulted in; or, with DeviceMemoryKernel, a new
// mapping, which a fill faults in block by block, each reader just before
// it reads into the block, so that getting the memory overlaps the copy
// (and is counted in it).
func (s *Simulator) alloc(n int64, fill bool) (*arena.Arena, error) {
	if s.device != nil {
		return s.device.Alloc(n)
	}
	return arena.New(n, arena.Options{NoPopulate: fill})
}

func (s *Simulator) deviceMemory() string {
	if s.device != nil {
		return DeviceMemoryPool
	}
	return DeviceMemoryKernel
}

func tierLabel(t v1alpha1.Tier) string {
	if t == "" {
		return "none"
	}
	return string(t)
}

// offloadMode is the mode of the level-1 offload: the simulator's to
// write and remove, its group's (the node agent's copy group) to read.
const offloadMode = 0o640

// offloadPath is the simulator's own level-1 offload file in the hot
// directory. It is a dot file, so it never collides with a copy the node
// agent placed under the weights' name, and the agent's index skips it.
func (s *Simulator) offloadPath() string {
	return filepath.Join(s.cfg.Sleep.HotDir, "."+s.cfg.WeightsName()+".level1")
}

// fillFromTier reads the weights from the fastest tier holding them: after
// level 1 only the level-1 offload (which it then removes); after level 2
// a hot copy placed by the node agent, a warm copy, or the cold source.
func (s *Simulator) fillFromTier(a *arena.Arena, level int, digest arena.Digest, rep *StageReport) error {
	name := s.cfg.WeightsName()
	hot := s.offloadPath()
	type source struct {
		tier v1alpha1.Tier
		path string
	}
	var sources []source
	if level == 1 {
		sources = []source{{v1alpha1.TierHot, hot}}
	} else {
		sources = append(sources, source{v1alpha1.TierHot, filepath.Join(s.cfg.Sleep.HotDir, name)})
		if s.cfg.Sleep.WarmDir != "" {
			sources = append(sources, source{v1alpha1.TierWarm, filepath.Join(s.cfg.Sleep.WarmDir, name)})
		}
		if s.cfg.Weights.File != "" {
			sources = append(sources, source{v1alpha1.TierCold, s.cfg.Weights.File})
		} else {
			sources = append(sources, source{v1alpha1.TierCold, ""})
		}
	}
	for _, src := range sources {
		if src.path != "" {
			if _, err := os.Stat(src.path); errors.Is(err, os.ErrNotExist) {
				continue
			}
		}
		rep.Tier, rep.Source = src.tier, src.path
		var got arena.Digest
		if src.path == "" {
			rep.Source = "seed"
			t := time.Now()
			arena.Synthesize(a.Bytes(), s.cfg.Weights.Seed)
			rep.CopySeconds = time.Since(t).Seconds()
			t = time.Now()
			got = arena.Sum(a.Bytes())
			rep.VerifySeconds = time.Since(t).Seconds()
		} else {
			// Hot is tmpfs (no O_DIRECT); warm and cold bypass the page
			// cache, so the restore measures the device, and weights do
			// not sit twice in RAM. The level-1 offload is removed once
			// verified. With memory returned to the kernel it is also
			// consumed: its pages are released block by block as the
			// arena faults new ones in (and written back if the wake
			// fails), so the wake never holds the weights twice.
			// A kept offload (Sleep.KeepOffload) stays whole for the
			// next sleep to reuse.
			offload, keep := level == 1, level == 1 && s.cfg.Sleep.KeepOffload
			_, st, err := arena.FillFile(a, src.path, arena.FileOptions{
				Direct: src.tier != v1alpha1.TierHot, Consume: offload && !keep && s.device == nil, Remove: offload && !keep, Expect: &digest,
			})
			rep.CopySeconds, rep.VerifySeconds, rep.Direct, rep.FaultedInCopy = st.Copy.Seconds(), st.Verify.Seconds(), st.Direct, st.Faulted
			if err != nil {
				return err
			}
			got = digest
			if keep {
				id := statFileID(src.path)
				s.engine.mu.Lock()
				s.engine.kept = id
				s.engine.mu.Unlock()
			}
		}
		if got != digest {
			return &arena.MismatchError{Source: rep.Source, Want: digest, Got: got, Bytes: a.Len()}
		}
		rep.Verified = true
		return nil
	}
	return fmt.Errorf("no copy of the weights %q in the tiers: %v", name, sources)
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

// fileID tells whether a file is still the one seen earlier: a write,
// truncation or replacement changes its inode, size or change time.
type fileID struct {
	dev, ino uint64
	size     int64
	ctime    int64 // nanoseconds
}

func (f fileID) valid() bool { return f.ino != 0 }

// statFileID identifies the file at path; the zero fileID if it is gone.
func statFileID(path string) fileID {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, ctime: st.Ctim.Nano()}
}
