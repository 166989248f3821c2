package sim

// Where a wake's weights come from: the device memory, the level-1
// offload and the node agent's copies in the tiers (fastest first), each
// verified against the digest recorded at load.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
)

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
