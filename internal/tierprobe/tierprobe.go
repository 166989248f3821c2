// Package tierprobe measures the physical limit a restore from a tier is
// held to, the same way for every benchmark (hack/bench-tiers,
// hack/bench-mux, hack/bench-tiers-ollama): a read of a file as large as
// the restore's, on the same tier (the same directory, so the same
// filesystem and page size), into the same kind of memory the restore
// lands in (a pre-faulted region kept across reads, not memory faulted in
// for the probe), with the restore's own read method (arena.FileOptions:
// the same workers, chunks, mapping or O_DIRECT), without any engine work,
// and either without a hash (a plain copy) or with the restore's own
// copy-and-hash pass (Hash): on amd64 that pass stores with non-temporal
// stores, which skip reading the destination's lines, and can copy faster
// than a plain copy; a bound is the faster of the two. A benchmark reads it right before and right
// after each measured wake, so the bound and the wake see the same
// machine, and takes the fastest read (Peak): a limit is the most the tier
// delivers, and on a shared machine another process taking the core only
// ever slows a read down.
//
// A restore that beats its probe means the probe is not the limit: it
// reads differently from the restore (another method, another page size,
// memory faulted in for the read). Fix the probe; do not print the ratio.
package tierprobe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// Probe reads one file of one tier into one destination.
type Probe struct {
	// Tier names what is read, for tables ("tmpfs", "disk", ...).
	Tier string
	// Path is the file read: a probe file Write wrote, or a tier copy
	// itself (Of).
	Path string
	// Dst receives the bytes: exactly the file's size, pre-faulted, kept
	// by the caller for as long as the probe is used.
	Dst *arena.Arena
	// Opts are the restore's read options; Consume, Remove and Expect
	// are ignored (a probe never changes its file).
	Opts arena.FileOptions
	// Hash reads with the restore's copy-and-hash pass (arena.FillFile,
	// no digest to compare) instead of a plain copy (arena.ReadFile).
	Hash bool
	// DropCache drops the file's pages from the page cache before each
	// read: a tier on a disk read without O_DIRECT (an engine that mmaps
	// or reads its model file) reads from the disk only after a drop.
	DropCache bool

	owned bool
}

// Write writes a probe file of dst.Len() synthetic bytes in dir, the way
// a tier copy is written there (arena.WriteFile: a huge-page tmpfs gets
// huge pages), and returns a probe that reads it into dst with opts. Close
// removes the file.
func Write(tier, dir string, dst *arena.Arena, opts arena.FileOptions) (*Probe, error) {
	path, err := nodeagent.WriteProbe(dir, dst.Len())
	if err != nil {
		return nil, fmt.Errorf("writing a %s probe file in %s: %w", arena.Size(dst.Len()), dir, err)
	}
	p := Of(tier, path, dst, opts)
	p.owned = true
	return p, nil
}

// Of is a probe of an existing file, for example the tier copy a wake
// reads: the same bytes from the same pages.
func Of(tier, path string, dst *arena.Arena, opts arena.FileOptions) *Probe {
	opts.Consume, opts.Remove, opts.Expect = false, false, nil
	return &Probe{Tier: tier, Path: path, Dst: dst, Opts: opts}
}

// Read reads the file once into Dst and returns the bandwidth. The time
// covers what the restore's read covers (opening and mapping the file, the
// copy), not the page-cache drop.
func (p *Probe) Read() (nodeapi.Bandwidth, error) {
	if p.DropCache {
		if err := nodeagent.DropCache(p.Path); err != nil {
			return nodeapi.Bandwidth{}, fmt.Errorf("dropping %s from the page cache: %w", p.Path, err)
		}
	}
	var st arena.FillStats
	var err error
	if p.Hash {
		_, st, err = arena.FillFile(p.Dst, p.Path, p.Opts)
	} else {
		st, err = arena.ReadFile(p.Dst, p.Path, p.Opts)
	}
	if err != nil {
		return nodeapi.Bandwidth{}, fmt.Errorf("probe read of %s: %w", p.Path, err)
	}
	return bandwidth(p.Tier, method(st, p), st.Bytes, st.Total()), nil
}

// bandwidth is a Bandwidth of n bytes in d.
func bandwidth(what, method string, n int64, d time.Duration) nodeapi.Bandwidth {
	return nodeapi.Bandwidth{What: what, Bytes: n, Seconds: d.Seconds(), BytesPerSecond: float64(n) / max(d.Seconds(), 1e-9), Method: method}
}

func method(st arena.FillStats, p *Probe) string {
	how := "pread"
	switch {
	case st.Direct:
		how = "O_DIRECT pread"
	case st.Mapped:
		how = "copy out of a populated mapping"
	case p.DropCache:
		how = "pread after fadvise(DONTNEED)"
	}
	hash := "no hash"
	if p.Hash {
		hash = "the restore's copy and hash"
	}
	return fmt.Sprintf("%s, %d threads, %s", how, st.Workers, hash)
}

// Close removes the probe file if Write wrote it.
func (p *Probe) Close() {
	if p.owned {
		_ = os.Remove(p.Path)
	}
}

// ReadBest reads the file k times (at least once) and returns the
// fastest read.
func (p *Probe) ReadBest(k int) (nodeapi.Bandwidth, error) {
	var best nodeapi.Bandwidth
	for range max(k, 1) {
		b, err := p.Read()
		if err != nil {
			return best, err
		}
		best = Peak(best, b)
	}
	return best, nil
}

// Peak is the fastest of bs.
func Peak(bs ...nodeapi.Bandwidth) nodeapi.Bandwidth {
	var best nodeapi.Bandwidth
	for _, b := range bs {
		if b.BytesPerSecond > best.BytesPerSecond {
			best = b
		}
	}
	return best
}

// Around is two reads of one probe, one right before and one right after
// the measured wake, taken as one: their bytes over their seconds (for a
// reference figure; a bound is the Peak).
func Around(before, after nodeapi.Bandwidth) nodeapi.Bandwidth {
	out := before
	out.Bytes, out.Seconds = before.Bytes+after.Bytes, before.Seconds+after.Seconds
	if out.Seconds > 0 {
		out.BytesPerSecond = float64(out.Bytes) / out.Seconds
	}
	return out
}

// Bound is the time n bytes take at b: the least a restore of n bytes
// from the probed tier can take.
func Bound(n int64, b nodeapi.Bandwidth) time.Duration {
	if b.BytesPerSecond <= 0 {
		return 0
	}
	return time.Duration(float64(n) / b.BytesPerSecond * float64(time.Second))
}

// ErrBeaten says a measured transfer ran faster than its bound: the probe
// is not measuring the limit the transfer is held to.
var ErrBeaten = errors.New("a measured transfer beat its probe: the probe is not the limit")

// Check returns ErrBeaten (wrapped, with the figures) when took, a
// transfer of the probed bytes, is shorter than bound by more than slack
// (a share, e.g. 0.05 for the two measurements' noise).
func Check(what string, took, bound time.Duration, slack float64) error {
	if bound > 0 && float64(took) < float64(bound)*(1-slack) {
		return fmt.Errorf("%w: %s took %v, its bound %v (%.2f of it)", ErrBeaten, what, took.Round(time.Microsecond), bound.Round(time.Microsecond), float64(took)/float64(bound))
	}
	return nil
}

// WriteRate times a write of src into a new file in dir the way a level-1
// sleep writes its offload (arena.WriteFile, no sync), and removes the
// file afterwards (not timed).
func WriteRate(tier, dir string, src *arena.Arena) (nodeapi.Bandwidth, error) {
	path := filepath.Join(dir, ".tierprobe-write")
	t := time.Now()
	err := arena.WriteFile(path, src.Bytes(), false)
	d := time.Since(t)
	_ = os.Remove(path)
	if err != nil {
		return nodeapi.Bandwidth{}, fmt.Errorf("probe write in %s: %w", dir, err)
	}
	return bandwidth(tier+" write", "write as a level-1 sleep does (arena.WriteFile)", src.Len(), d), nil
}
