package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

// hotNote lists the run's hot wakes: each one's hot and time to first
// token ratios, the least share of an offload in huge pages, the most
// steal.
func (r row) hotNote() string {
	var hot, ttft []string
	huge, steal := 1.0, 0.0
	for _, h := range r.hotWakes {
		hot = append(hot, fmt.Sprintf("%.2f/%.2f/%.2f/%.2f", h.ratio(), h.probeRatio(), h.load(), h.typicalRatio()))
		ttft = append(ttft, fmt.Sprintf("%.2f", h.ttftRatio()))
		huge, steal = min(huge, h.huge), max(steal, h.steal)
	}
	out := fmt.Sprintf("hot ÷ memcpy/÷ probe/probe around ÷ probe/hot ÷ median read around %s, TTFT %s (%.0f %% huge, %.0f %% stolen)", strings.Join(hot, " "), strings.Join(ttft, " "), 100*huge, 100*steal)
	if i := r.idleWake; i.rep != nil {
		out += fmt.Sprintf(", straight after the pause hot %.2f, TTFT %.2f", i.ratio(), i.ttftRatio())
	}
	return out
}

func render(rows []row, loadBefore, loadAfter string, took time.Duration, hotNote string, criu nodeapi.CRIUReport) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fpr := "no free page reporting"
	if arena.FreePageReporting() {
		fpr = "free page reporting on (virtio balloon): freed memory returns to the host, so memory an engine returns at each sleep is faulted in again in 4 KiB pages; device regions and the baselines' memory, faulted in once and kept, are in huge pages"
	}
	fmt.Fprintf(&b, "`go run ./hack/bench-tiers` on %s, %d CPUs; load average %s before, %s after; %s; %s; the engine is up and serving for %v after it loads, before its first sleep, and sleeps %v before each wake; %s.\n\n",
		host, runtime.NumCPU(), loadBefore, loadAfter, took.Round(time.Second), hotNote, servesFor, asleep, fpr)
	fmt.Fprintf(&b, "Each bandwidth column is the median of %d runs, interleaved (every run measures every column, in order); each ratio column is the median of the runs' own ratios, each of a restore and the bandwidth measured around it in the same run; the warm restore and its raw read, and the time to first token and its bound, are those of the run whose ratio is the median; every wake of every run is counted in the last column. ", rows[0].runs)
	fmt.Fprintf(&b, "Bandwidths in GB/s (10^9 bytes/s), into pre-faulted memory in huge pages, the kind a restore lands in. The bounds are tier probes (`internal/tierprobe`, shared with bench-mux and bench-tiers-ollama). The hot tier's is the fastest read of the run, of the reads right before and right after each of its hot wakes (a limit is the most the tier delivers, and the tier does not change between the wakes of a run, only the machine's load does; on a shared machine another process only slows a read down, and a bound from the reads around one wake alone was beaten by single wakes that ran in a quieter moment than those reads); the warm tier's is the fastest of the reads right before and right after the one warm wake. The tmpfs column reads the hot wake's own tier file (the level-1 offload) after the sleep's pause, into a region of the engine's own device kept for the run, with the restore's read options (a copy out of a populated read-only mapping, 1 MiB chunks, %d threads), both with a plain copy and with the restore's own copy-and-hash pass (its non-temporal stores skip reading the destination, and can copy faster than a plain copy), each three times right before the wake (after memcpy, which takes the cores' ramp after the pause), into the engine's own region (the device's only free region while the engine sleeps: the pages the wake fills), and three times right after its first token, into the probe's region (through a second link to the offload, which the wake unlinks). The warm file's raw read is the peak of 1 and of the warm restore's %d O_DIRECT readers (8 MiB blocks) of the warm copy itself into the same region, once right before and once right after the warm wake, one reader first before it and last after it, the fastest of the four reads. memcpy (a reference, not a bound) copies min(size, %s) from a buffer kept for the run into that region, the peak of 1 and 2 threads, once right before the hot wake and once right after its first token, the two copies taken together; the disk and S3 columns are references read once per run into a buffer as large as the file. ", arena.DefaultWorkers(), arena.DirectWorkers, arena.Size(memcpyBytes))
	fmt.Fprintf(&b, "A restore is the whole wake of the weights: take the engine's region of its device pool (mapped and faulted in when it loaded, kept while it slept, as GPU memory stays on the device), fill it, then combine the chunk digests and compare. The hot tier's file, in huge pages, is mapped read-only with MAP_POPULATE and 2 workers copy 1 MiB chunks out of the mapping into the region, each copying and hashing (XXH3) a chunk in one pass, every 64 bytes loaded once, stored and hashed; the warm and cold tiers are read with O_DIRECT by %d readers in 8 MiB blocks, each hashing the block it read. ", arena.DirectWorkers)
	b.WriteString("The kernel column is the same hot wake by an engine whose sleep returns its memory to the kernel (`--device-memory=kernel`, the model before the pool): map, fault each chunk in just before copying into it, copy, hash. Fresh memory: mmap + MADV_POPULATE_WRITE of memory freed one sleep earlier. Time to first token is to the first non-empty content delta of a streamed chat sent right after the wake; its bound is the bytes at the tier probe's rate plus the simulator's TTFT (the memcpy-based bound of earlier runs, a stricter one, in parentheses).\n\n")
	b.WriteString("| Weights | memcpy | fresh memory | tmpfs read (tier probe) | disk O_DIRECT | S3 fake | hot restore (alloc+copy+verify s) | hot restore, memory returned to the kernel | warm restore | cold restore | hot ÷ memcpy | hot ÷ tier probe (≥ 0.8; above 1 the probe is wrong) | hot, returned to the kernel, ÷ memcpy | warm ÷ raw read of the same file (≥ 0.8) | TTFT after hot wake ÷ (bytes÷tier probe + TTFT) (≤ 1.2) | wakes verified |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.skipped != "" {
			fmt.Fprintf(&b, "| %s | %s |%s\n", arena.Size(r.size), r.skipped, strings.Repeat("  |", 14))
			continue
		}
		hotBW, kernelBW, warmBW, coldBW := restoreBW(r.hot), restoreBW(r.hotKernel), restoreBW(r.warm), restoreBW(r.cold)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s (%.3f+%.3f+%.3f) | %s (%.3f+%.3f+%.3f) | %s | %s | %.2f | %.2f | %.2f | %.2f (%s) | %.2f (%v ÷ %v; %.2f) | %d/%d |\n",
			arena.Size(r.size), gbps(r.memcpy.BytesPerSecond), gbps(r.fresh.BytesPerSecond), gbps(r.tmpfs.BytesPerSecond), gbps(r.disk.BytesPerSecond), gbps(r.s3.BytesPerSecond),
			gbps(hotBW), r.hot.AllocSeconds, r.hot.CopySeconds, r.hot.VerifySeconds,
			gbps(kernelBW), r.hotKernel.AllocSeconds, r.hotKernel.CopySeconds, r.hotKernel.VerifySeconds, gbps(warmBW), gbps(coldBW),
			r.ratio.hot, r.ratio.probe, r.ratio.kernel, r.ratio.warm, gbps(r.warmRaw.BytesPerSecond),
			r.ratio.ttft, r.ttftHot.Round(time.Millisecond), r.ttftBound.Round(time.Millisecond), r.ratio.ttftMemcpy,
			r.verified, r.wakes)
	}
	var beaten []string
	for _, r := range rows {
		for _, x := range append(slices.Clone(r.hotBeaten), r.warmBeaten...) {
			beaten = append(beaten, fmt.Sprintf("%s: %s", arena.Size(r.size), strings.TrimPrefix(x, tierprobe.ErrBeaten.Error()+": ")))
		}
	}
	if len(beaten) > 0 {
		fmt.Fprintf(&b, "\n**Wakes that beat their tier probe by more than 5 %% (the probe is then not the limit):** %s.\n", strings.Join(beaten, "; "))
	}
	fmt.Fprintf(&b, "\nPeaks: memcpy 1 thread / 2 threads, disk and warm file 1 reader / %d readers: ", arena.DirectWorkers)
	var parts []string
	for _, r := range rows {
		if r.skipped == "" {
			parts = append(parts, fmt.Sprintf("%s memcpy %s / %s, disk %s / %s, warm file %s / %s", arena.Size(r.size),
				gbps(r.memcpy1.BytesPerSecond), gbps(r.memcpy2.BytesPerSecond),
				gbps(r.disk1.BytesPerSecond), gbps(r.disk2.BytesPerSecond),
				gbps(r.warmRaw1.BytesPerSecond), gbps(r.warmRaw2.BytesPerSecond)))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	b.WriteString("Verified copy, the hot restore's copy and hash between pre-faulted buffers (each 1 MiB chunk copied and hashed with XXH3 in one pass, 2 threads), the most a restore that hashes every byte it lands can do from a source as fast as memory (the fastest of the copies right before and right after each hot wake of the run, as memcpy is measured), and the hot restore as a share of it: ")
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			parts = append(parts, fmt.Sprintf("%s %s GB/s (%.2f of memcpy), hot restore %.2f of it", arena.Size(r.size), gbps(r.hashedCopy.BytesPerSecond),
				r.hashedCopy.BytesPerSecond/r.memcpy.BytesPerSecond, restoreBW(r.hot)/r.hashedCopy.BytesPerSecond))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	b.WriteString("The hot restore against a typical read of its own tier file at the same moment (the median of the twelve reads around each wake; the median of the wakes, the median run): ")
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			parts = append(parts, fmt.Sprintf("%s %.2f", arena.Size(r.size), r.ratio.typical))
		}
	}
	b.WriteString(strings.Join(parts, ", ") + " (about 1 where the verified restore costs no more than a read of its tier; the table's bound is the fastest read of the run, the tier's limit).\n\n")
	fmt.Fprintf(&b, "Each run in order, its %d hot wakes in order: the wake's ratio to memcpy and to the run's tier probe, the fastest read around it as a share of the run's tier probe (below 1: the load slowed the reads around this wake), and the wake's ratio to the median of the twelve reads around it (a typical read of the same file at the same moment: about 1 where the verified restore costs no more than a read of its tier), and its time to first token's to its bound, with the least share of a tier file (the level-1 offload) in huge pages, from ShmemHugePages around the sleep that wrote it, and the most CPU time the hypervisor took (steal, /proc/stat) while a wake ran; then one more wake straight after the pause, with the cores as the pause left them (memcpy only after it; not in the table): ", hotWakesPerRun)
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			var each []string
			for _, e := range r.each {
				each = append(each, e.hotNote())
			}
			parts = append(parts, fmt.Sprintf("%s %s", arena.Size(r.size), strings.Join(each, "; ")))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	b.WriteString("Bound of the hot restore with its memory returned to the kernel, as a share of memcpy: the slower of the tier probe and fresh memory (fault, then copy): ")
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" {
			sink := 1 / (1/r.fresh.BytesPerSecond + 1/r.memcpy.BytesPerSecond) // fault, then copy
			parts = append(parts, fmt.Sprintf("%s %.2f (fault then copy %s GB/s; tmpfs %s GB/s)", arena.Size(r.size),
				min(sink, r.tmpfs.BytesPerSecond)/r.memcpy.BytesPerSecond, gbps(sink), gbps(r.tmpfs.BytesPerSecond)))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n\n")
	if !criu.CheckPassed {
		fmt.Fprintf(&b, "Process snapshot (criu): unsupported on this node: %s.\n", strings.TrimSuffix(criu.Reason, "."))
		return b.String()
	}
	fmt.Fprintf(&b, "Process snapshot (criu %s), the optional tier that keeps the whole process rather than its weights: a simulator process (orchestra-sim's code, the weights in its device pool), up and serving for %v, is dumped by the agent's code (`criu dump --tcp-close --file-locks`, the process ends) into the hot tier's tmpfs and, after the same %v pause, restored (`criu restore --restore-detached`); the restored simulator then sleeps at level 1 and wakes, which hashes the weights it holds against the digest it took at its load. The restore's bandwidth is the weights over criu's restore, compared like for like with the hot wake of the same run whose memory was returned to the kernel: both read the weights from the hot tier's tmpfs into fresh memory (criu maps the restored process's memory anew); the verification (that sleep and wake) comes after it: ", criu.Version, servesFor, asleep)
	parts = parts[:0]
	for _, r := range rows {
		if r.skipped == "" && r.snap != nil {
			s := r.snap
			parts = append(parts, fmt.Sprintf("%s dump %.2f s, restore %.2f s (%s GB/s, %.2f × the hot wake into fresh memory), %.0f MiB of images, verified by a sleep and wake in %.2f s",
				arena.Size(r.size), s.dump.Seconds, s.restore.Seconds, gbps(s.bytesPerSecond(r.size)), r.ratio.snapshot, float64(s.dump.Bytes)/(1<<20), s.verify.Seconds()))
		}
	}
	b.WriteString(strings.Join(parts, "; ") + ".\n")
	return b.String()
}

func updateDocs(path, table string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, startMarker), strings.Index(s, endMarker)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", path, startMarker, endMarker)
	}
	s = s[:i+len(startMarker)] + "\n" + table + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
