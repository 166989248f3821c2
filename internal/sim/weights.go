package sim

// The engine's weights and state: loading them, the reports of a
// sleep or wake (StageReport) and GET /orchestra/weights (WeightsStatus).

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
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
