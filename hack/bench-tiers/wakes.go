package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sim"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

// measureSim wakes an in-process simulator holding n bytes from each tier.
// The cold tier is the weights file the simulator loaded at start (on disk,
// as the model cache is); the warm tier is a copy in the disk directory; the
// hot tier is the level-1 offload on the tmpfs.
func measureSim(r *row, n int64, hot, disk string, dev *arena.Device, src, dst *arena.Arena) error {
	model := filepath.Join(disk, "model.bin")
	w, err := arena.New(n, arena.Options{})
	if err != nil {
		return err
	}
	arena.Synthesize(w.Bytes(), 11)
	err = arena.WriteFile(model, w.Bytes(), true)
	w.Free()
	if err != nil {
		return err
	}
	_ = nodeagent.DropCache(model) // read past the page cache, like the tiers
	defer func() { _ = os.Remove(model) }()
	warmDir := filepath.Join(disk, "warm")
	if err := os.MkdirAll(warmDir, 0o700); err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(warmDir) }()

	cfg := sim.Default()
	cfg.TimeToFirstToken, cfg.InterTokenLatency, cfg.OutputTokens = simTTFT, 0, 4
	cfg.Weights = sim.Weights{File: model}
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: hot, WarmDir: warmDir}
	s := sim.New(cfg, sim.WithLogger(slog.New(slog.DiscardHandler)), sim.WithDevice(dev))
	if err := s.LoadWeights(); err != nil {
		return err
	}
	defer s.Close()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	// The engine serves first: it answers, then idles until its first sleep.
	if _, err := firstToken(srv.URL); err != nil {
		return err
	}
	time.Sleep(servesFor)

	// Hot: hotWakesPerRun times, level 1 offloads to the tmpfs, the
	// engine sleeps, and the wake and the first token are timed between
	// tier probe reads of the same offload. Then once more with the wake
	// straight after the pause.
	for range hotWakesPerRun {
		h, err := measureHot(s, srv.URL, n, dev, src, dst, false)
		if err != nil {
			return err
		}
		r.hotWakes = append(r.hotWakes, h)
	}
	if r.idleWake, err = measureHot(s, srv.URL, n, dev, src, dst, true); err != nil {
		return err
	}
	// Every wake is bounded by the run's tier probe.
	r.boundByRunPeak(n)
	for _, h := range append(slices.Clone(r.hotWakes), r.idleWake) {
		took := time.Duration(restoreSeconds(h.rep) * float64(time.Second))
		if err := tierprobe.Check("hot wake", took, tierprobe.Bound(n, h.probe), 0.05); err != nil {
			r.hotBeaten = append(r.hotBeaten, err.Error())
		}
	}

	// Warm: level 2, a copy on disk, its page cache dropped. Its raw
	// reads (the warm tier's probe) land in the probe's region of the
	// engine's device, as the restore lands in the engine's.
	if _, err := s.Sleep(2); err != nil {
		return err
	}
	rd := dst
	warm := filepath.Join(warmDir, cfg.WeightsName())
	if err := copyFile(model, warm); err != nil {
		return err
	}
	before1, before2, err := rawReads(rd, "warm raw", warm, false)
	if err != nil {
		return err
	}
	_ = nodeagent.DropCache(warm)
	time.Sleep(asleep)
	if r.warm, err = wake(srv.URL); err != nil {
		return err
	}
	if r.warm.Tier != v1alpha1.TierWarm {
		return fmt.Errorf("the warm wake came from %s", r.warm.Tier)
	}
	after1, after2, err := rawReads(rd, "warm raw", warm, true)
	if err != nil {
		return err
	}
	r.warmRaw1, r.warmRaw2 = tierprobe.Peak(before1, after1), tierprobe.Peak(before2, after2)
	r.warmRaw = nodeagent.Peak(r.warmRaw1, r.warmRaw2)
	if err := tierprobe.Check("warm wake", time.Duration(restoreSeconds(r.warm)*float64(time.Second)), tierprobe.Bound(n, r.warmRaw), 0.05); err != nil {
		r.warmBeaten = append(r.warmBeaten, err.Error())
	}

	// Cold: level 2, no copy in hot or warm: the model file.
	if err := os.Remove(warm); err != nil {
		return err
	}
	if _, err := s.Sleep(2); err != nil {
		return err
	}
	_ = nodeagent.DropCache(model)
	time.Sleep(asleep)
	if r.cold, err = wake(srv.URL); err != nil {
		return err
	}
	st := s.WeightsStatus()
	r.wakes, r.verified = st.Wakes, st.Verified
	srv.Close()
	s.Close()
	return measureHotKernel(r, n, hot)
}

// measureHot runs one level-1 sleep and hot wake of s, and times the wake
// and its first token. After the sleep's pause: memcpy, then the tier
// probe, two reads of the offload the wake will read (the same file, the
// same pages) into dst, a region of the engine's device; then the wake and
// its first token; then the probe again (the offload, which the wake
// unlinks, is read through a second link the probe holds meanwhile) and
// memcpy again; with each memcpy, the verified copy of the same bytes.
// around is the probe's fastest read; the wake's bound is the run's
// fastest (row.boundByRunPeak), set once every wake ran. memcpy comes first:
// on a VM the first tens of milliseconds after an idle pause run slower
// (the host's cores ramp up), and the copy before the wake takes that ramp
// (it counts with the copy after the wake). With idle, the wake comes
// straight after the pause, with the cores as the pause left them, and
// memcpy and the probe are only measured after it.
func measureHot(s *sim.Simulator, url string, n int64, dev *arena.Device, src, dst *arena.Arena, idle bool) (hotWake, error) {
	var h hotWake
	huge := meminfo("ShmemHugePages")
	sl, err := s.Sleep(1)
	if err != nil {
		return h, err
	}
	h.huge = float64(meminfo("ShmemHugePages")-huge) / float64(n)
	time.Sleep(asleep)
	link := sl.Source + ".probe"
	if err := os.Link(sl.Source, link); err != nil {
		return h, fmt.Errorf("a second link to the offload for the tier probe: %w", err)
	}
	defer func() { _ = os.Remove(link) }()
	// Both ways to copy out of the tier: a plain copy and the restore's
	// own copy-and-hash pass (non-temporal stores); the faster is the
	// limit. Before the wake the probe reads into the engine's own
	// region (the device's only free region while the engine sleeps, the
	// very pages the wake fills), after it into the probe's region: on
	// this VM a region's pages can copy slower for seconds while the host
	// settles them, and the wake is bounded by the pages it lands in.
	var reads []float64
	read := func(into *arena.Arena) (nodeapi.Bandwidth, error) {
		var best nodeapi.Bandwidth
		for _, hash := range []bool{false, true} {
			p := tierprobe.Of("tmpfs", link, into, arena.FileOptions{})
			p.Hash = hash
			for range 3 {
				b, err := p.Read()
				if err != nil {
					return best, err
				}
				best = tierprobe.Peak(best, b)
				reads = append(reads, b.BytesPerSecond)
			}
		}
		return best, nil
	}
	var before1, before2, before, hashed nodeapi.Bandwidth
	if !idle {
		before1, before2 = nodeagent.MeasureMemcpyBetween(dst, src)
		hashed = measureHashedCopy(dst, src)
		region, err := dev.Alloc(n)
		if err != nil {
			return h, err
		}
		before, err = read(region)
		region.Free()
		if err != nil {
			return h, err
		}
	}
	steal0 := cpuSteal()
	t0 := time.Now()
	if h.rep, err = wake(url); err != nil {
		return h, err
	}
	h.steal = cpuSteal().since(steal0)
	first, err := firstToken(url)
	if err != nil {
		return h, err
	}
	h.ttft = first.Sub(t0)
	after, err := read(dst)
	if err != nil {
		return h, err
	}
	h.around = tierprobe.Peak(before, after)
	slices.Sort(reads)
	h.aroundMedian = reads[len(reads)/2]
	h.memcpy1, h.memcpy2 = nodeagent.MeasureMemcpyBetween(dst, src)
	h.hashed = tierprobe.Peak(hashed, measureHashedCopy(dst, src))
	if !idle {
		h.memcpy1, h.memcpy2 = tierprobe.Around(before1, h.memcpy1), tierprobe.Around(before2, h.memcpy2)
	}
	h.memcpy = nodeagent.Peak(h.memcpy1, h.memcpy2)
	return h, nil
}

// measureHotKernel runs one level-1 cycle of a simulator whose sleep
// returns its memory to the kernel, as every sleep did before the device
// pool: its wake faults fresh memory in as it reads.
func measureHotKernel(r *row, n int64, hot string) error {
	cfg := sim.Default()
	cfg.Model = "sim-kernel"
	cfg.Weights = sim.Weights{Bytes: n, Seed: 11}
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: hot}
	cfg.DeviceMemory = sim.DeviceMemoryKernel
	s := sim.New(cfg, sim.WithLogger(slog.New(slog.DiscardHandler)))
	if err := s.LoadWeights(); err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Sleep(1); err != nil {
		return err
	}
	time.Sleep(asleep)
	rep, err := s.WakeUp(context.Background())
	if err != nil {
		return err
	}
	if !rep.Verified {
		return errors.New("the returned-to-the-kernel hot wake was not verified")
	}
	r.hotKernel = rep
	st := s.WeightsStatus()
	r.wakes += st.Wakes
	r.verified += st.Verified
	return nil
}

func wake(base string) (*sim.StageReport, error) {
	resp, err := http.Post(base+"/wake_up", "", nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("wake_up: %d %s", resp.StatusCode, b)
	}
	var rep sim.StageReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, err
	}
	if !rep.Verified {
		return nil, fmt.Errorf("wake from %s not verified", rep.Tier)
	}
	return &rep, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
