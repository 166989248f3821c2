package main

import (
	"cmp"
	"slices"
	"time"

	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sim"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

type row struct {
	size int64
	// memcpy is the peak of memcpy1 (one thread) and memcpy2 (the
	// restore's workers), those of the hot wake whose ratio is the median
	// (hotWake): this VM's memory bandwidth moves by half from one minute
	// to the next, so the hot ratios compare a wake with copies that
	// bracket it. disk is the peak of its two O_DIRECT reads likewise.
	memcpy, memcpy1, memcpy2 nodeapi.Bandwidth
	// hashedCopy is the hot restore's verified copy between two
	// pre-faulted arenas (arena.VerifiedCopy: each 1 MiB chunk copied and
	// hashed with XXH3 in one pass): the most a verified restore can do
	// from a source as fast as memory. It is the fastest of the copies
	// right before and right after every hot wake of the run (one copy
	// at the run's start was a single moment of a shared machine, which a
	// wake in a quieter moment beat).
	hashedCopy nodeapi.Bandwidth
	fresh, s3  nodeapi.Bandwidth
	// tmpfs is the run's tier probe (tierProbe): the fastest read of
	// the hot tier of the whole run, every hot wake's bound.
	tmpfs              nodeapi.Bandwidth
	disk, disk1, disk2 nodeapi.Bandwidth
	// warmRaw is the O_DIRECT read of the warm copy itself, right before
	// and right after the warm wake (both reads as one): the shared
	// disk's bandwidth moves by 3× from one minute to the next, so the
	// ratio compares the wake with reads that bracket it. warmRaw1 is
	// one reader, warmRaw2 the restore's readers; warmRaw the faster.
	warmRaw, warmRaw1, warmRaw2 nodeapi.Bandwidth
	hot, warm, cold             *sim.StageReport
	// hotKernel is the hot wake of a simulator whose sleep returns the
	// memory to the kernel (--device-memory=kernel), the model before the
	// device pool.
	hotKernel *sim.StageReport
	// ttftHot is the time to first token after the hot wake, ttftBound
	// what the bytes at the tier probe's rate and the simulator's TTFT
	// alone would take.
	ttftHot, ttftBound time.Duration
	// warmBeaten and hotBeaten count the wakes that ran faster than
	// their probe (tierprobe.Check): the probe is then not the limit.
	hotBeaten, warmBeaten []string
	// hotWakes are the run's hot sleeps and wakes, in order; hot,
	// memcpy and the hot ratio are those of the wake whose ratio is the
	// median, the time to first token and its bound likewise.
	hotWakes []hotWake
	// idleWake is one more hot wake, straight after the pause, outside
	// the ratios.
	idleWake hotWake
	// snap is the process snapshot round trip, where criu works.
	snap *snapshot
	// each is every run, in order, as measured (median keeps them).
	each []row
	// ratio holds this run's ratios, each of a restore and the
	// bandwidth measured around it; the table gives their medians.
	ratio           ratios
	wakes, verified int
	skipped         string
	runs            int
}

// hotWake is one level-1 sleep and hot wake, with the memcpy measured
// around the wake (measureHot).
type hotWake struct {
	rep                      *sim.StageReport
	memcpy, memcpy1, memcpy2 nodeapi.Bandwidth
	// around is the tier probe around the wake: the fastest of the
	// reads of the offload right before the wake and right after. probe
	// is the run's tier probe, the fastest of every wake's around: the
	// tier's limit does not change from one wake to the next, only the
	// load of the machine does, and a bound taken from the reads of one
	// wake's window alone was beaten by single wakes that ran in a
	// quieter moment than the reads around them.
	around, probe nodeapi.Bandwidth
	// aroundMedian is the median of the reads around the wake (bytes/s):
	// a typical read of the same file at the same moment, which the
	// restore, the same read with a hash, should match.
	aroundMedian float64
	// hashed is the verified copy (arena.VerifiedCopy) of memcpy's
	// source into the probe's region, the fastest of one right before
	// the wake and one right after.
	hashed          nodeapi.Bandwidth
	ttft, ttftBound time.Duration
	// huge is the share of the tier file (the level-1 offload) in huge
	// pages, from ShmemHugePages around the sleep that wrote it.
	huge float64
	// steal is the share of the CPU time the hypervisor took while the
	// wake ran.
	steal float64
}

func (h hotWake) ratio() float64 { return restoreBW(h.rep) / h.memcpy.BytesPerSecond }

func (h hotWake) ttftRatio() float64 { return float64(h.ttft) / float64(h.ttftBound) }

// probeRatio is the wake's restore over the run's tier probe: at most 1
// where the probe is the limit.
func (h hotWake) probeRatio() float64 { return restoreBW(h.rep) / h.probe.BytesPerSecond }

// typicalRatio is the wake's restore over the median read around it:
// about 1 where the restore costs no more than a read of its tier.
func (h hotWake) typicalRatio() float64 { return restoreBW(h.rep) / h.aroundMedian }

// load is the tier probe around the wake over the run's: below 1 where
// the machine's load slowed the reads around this wake.
func (h hotWake) load() float64 { return h.around.BytesPerSecond / h.probe.BytesPerSecond }

// boundByRunPeak sets every hot wake's bound to the run's tier probe,
// the fastest read around any of them (the idle wake's too), and the
// run's verified copy to the fastest of theirs.
func (r *row) boundByRunPeak(n int64) {
	all := append(slices.Clone(r.hotWakes), r.idleWake)
	var peak nodeapi.Bandwidth
	for _, h := range all {
		peak = tierprobe.Peak(peak, h.around)
		r.hashedCopy = tierprobe.Peak(r.hashedCopy, h.hashed)
	}
	set := func(h *hotWake) {
		h.probe = peak
		h.ttftBound = tierprobe.Bound(n, peak) + simTTFT
	}
	for i := range r.hotWakes {
		set(&r.hotWakes[i])
	}
	set(&r.idleWake)
	r.tmpfs = peak
}

// ttftMemcpyRatio is the time to first token over bytes ÷ memcpy + the
// simulator's TTFT, the bound of earlier runs (memcpy is no slower than
// the tier probe: a stricter bound, not a physical one).
func (h hotWake) ttftMemcpyRatio() float64 {
	return float64(h.ttft) / float64(time.Duration(float64(h.rep.Bytes)/h.memcpy.BytesPerSecond*float64(time.Second))+simTTFT)
}

// medianBy is the element of xs whose key is the median (the upper one
// of an even count).
func medianBy[T any](xs []T, key func(T) float64) T {
	sorted := slices.Clone(xs)
	slices.SortStableFunc(sorted, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return sorted[len(sorted)/2]
}

// ratios are one run's figures against the targets.
type ratios struct {
	hot, kernel, warm, ttft float64
	// probe is the hot restore over its tier probe; ttftMemcpy the time
	// to first token over the memcpy-based bound of earlier runs.
	probe, ttftMemcpy float64
	// snapshot is the process snapshot's restore over the hot restore
	// with memory returned to the kernel, both into fresh memory (0
	// without one).
	snapshot float64
	// typical is the hot restore over the median read around it
	// (hotWake.typicalRatio), the median of the run's wakes.
	typical float64
}

// withRatios sets the run's ratios from its measurements: the hot ratio
// and the time to first token's are the medians of its hot wakes' own.
func (r row) withRatios() row {
	h := medianBy(r.hotWakes, hotWake.ratio)
	r.hot, r.memcpy, r.memcpy1, r.memcpy2 = h.rep, h.memcpy, h.memcpy1, h.memcpy2
	f := medianBy(r.hotWakes, hotWake.ttftRatio)
	r.ttftHot, r.ttftBound = f.ttft, f.ttftBound
	r.ratio = ratios{
		hot:        h.ratio(),
		probe:      medianBy(r.hotWakes, hotWake.probeRatio).probeRatio(),
		kernel:     restoreBW(r.hotKernel) / r.memcpy.BytesPerSecond,
		warm:       restoreBW(r.warm) / r.warmRaw.BytesPerSecond,
		ttft:       f.ttftRatio(),
		ttftMemcpy: medianBy(r.hotWakes, hotWake.ttftMemcpyRatio).ttftMemcpyRatio(),
		typical:    medianBy(r.hotWakes, hotWake.typicalRatio).typicalRatio(),
	}
	if r.snap != nil {
		r.ratio.snapshot = r.snap.bytesPerSecond(r.size) / restoreBW(r.hotKernel)
	}
	return r
}

// median takes, for every column on its own, the median of the runs; the
// verification counts are summed.
func median(runs []row) row {
	// A run skipped for want of memory ends the size's runs; the runs
	// before it are the size's figures.
	if i := slices.IndexFunc(runs, func(r row) bool { return r.skipped != "" }); i > 0 {
		runs = runs[:i]
	}
	runs[0].each = slices.Clone(runs)
	if len(runs) == 1 || runs[0].skipped != "" {
		runs[0].runs = 1
		return runs[0]
	}
	pick := func(key func(row) float64) row { return medianBy(runs, key) }
	out := runs[0]
	// memcpy and the hot restore are those of the run whose hot ratio is
	// the median, as within a run.
	h := pick(func(r row) float64 { return r.ratio.hot })
	out.memcpy, out.memcpy1, out.memcpy2, out.hot = h.memcpy, h.memcpy1, h.memcpy2, h.hot
	out.hashedCopy = pick(func(r row) float64 { return r.hashedCopy.BytesPerSecond }).hashedCopy
	out.fresh = pick(func(r row) float64 { return r.fresh.BytesPerSecond }).fresh
	// The tier probe is that of the run whose hot ÷ probe is the median.
	p := pick(func(r row) float64 { return r.ratio.probe })
	out.tmpfs = p.tmpfs
	d := pick(func(r row) float64 { return r.disk.BytesPerSecond })
	out.disk, out.disk1, out.disk2 = d.disk, d.disk1, d.disk2
	out.s3 = pick(func(r row) float64 { return r.s3.BytesPerSecond }).s3
	out.hotKernel = pick(func(r row) float64 { return restoreBW(r.hotKernel) }).hotKernel
	// The warm restore and the raw reads around it stay paired.
	w := pick(func(r row) float64 { return r.ratio.warm })
	out.warm, out.warmRaw, out.warmRaw1, out.warmRaw2 = w.warm, w.warmRaw, w.warmRaw1, w.warmRaw2
	out.cold = pick(func(r row) float64 { return restoreBW(r.cold) }).cold
	// So do the time to first token and its bound.
	f := pick(func(r row) float64 { return r.ratio.ttft })
	out.ttftHot, out.ttftBound = f.ttftHot, f.ttftBound
	// The snapshot and its ratio to the hot restore of its run likewise.
	sn := pick(func(r row) float64 { return r.ratio.snapshot })
	out.snap = sn.snap
	// Each ratio is the median of the runs' own ratios.
	out.ratio = ratios{
		hot:        h.ratio.hot,
		kernel:     pick(func(r row) float64 { return r.ratio.kernel }).ratio.kernel,
		warm:       w.ratio.warm,
		ttft:       f.ratio.ttft,
		probe:      p.ratio.probe,
		ttftMemcpy: pick(func(r row) float64 { return r.ratio.ttftMemcpy }).ratio.ttftMemcpy,
		typical:    pick(func(r row) float64 { return r.ratio.typical }).ratio.typical,
		snapshot:   sn.ratio.snapshot,
	}
	out.hotBeaten, out.warmBeaten = nil, nil
	for _, r := range runs {
		out.hotBeaten = append(out.hotBeaten, r.hotBeaten...)
		out.warmBeaten = append(out.warmBeaten, r.warmBeaten...)
	}
	out.wakes, out.verified = 0, 0
	for _, r := range runs {
		out.wakes += r.wakes
		out.verified += r.verified
	}
	out.runs = len(runs)
	return out
}
