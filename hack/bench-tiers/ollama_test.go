package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/ollamatest"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

var (
	ollamaTiersBench  = flag.Bool("ollama-tiers-bench", false, "measure the real Ollama engine's first token after loading a generated model from a hot, warm and cold copy, against the tier probe of the same file (make bench-tiers-ollama)")
	ollamaTiersSize   = flag.String("ollama-tiers-size", "256MiB", "size of the generated GGUF model")
	ollamaTiersRounds = flag.Int("ollama-tiers-rounds", 5, "rounds; each loads the model once from every tier, the tiers' order rotating")
	ollamaTiersDocs   = flag.String("ollama-tiers-docs", "", "Markdown file whose bench-tiers-ollama section receives the table")
)

const (
	ollamaStart = "<!-- bench-tiers-ollama:start -->"
	ollamaEnd   = "<!-- bench-tiers-ollama:end -->"
	ollamaModel = "bench"
)

// ollamaTier is one copy of the model Ollama loads, and the probes of
// that copy: every way to read it (the peak is the tier's limit).
type ollamaTier struct {
	name, path string
	probes     []*tierprobe.Probe
	// disk copies are dropped from the page cache before each load.
	disk bool
}

// ollamaLoad is one load of the model from one tier: the first request
// after it, a request right after (the model loaded), and the probes read
// right before and right after.
type ollamaLoad struct {
	tier         string
	first, awake time.Duration
	probe        nodeapi.Bandwidth
	probeMethod  string
	bound        time.Duration
	// load is Ollama's own load_duration of the first request.
	load time.Duration
}

// loadRatio is Ollama's load over the tier probe's time for the same
// bytes: the engine's load against the tier's read, like for like.
func (l ollamaLoad) loadRatio() float64 {
	return float64(l.load) / float64(l.bound-l.awake)
}

func (l ollamaLoad) ratio() float64 { return float64(l.first) / float64(l.bound) }

// TestOllamaTiersBenchmark loads a generated GGUF model into the real
// Ollama engine (the pinned build, `ollama serve` in process) from a hot
// copy (a huge-page tmpfs, as the node agent mounts the hot tier), a warm
// copy (node-local disk, page cache dropped) and a cold copy (the model
// cache's file, page cache dropped), and times the first non-empty token
// of the first request after the unload, against the bytes at the tier
// probe's rate of the same file plus the time to first token of the model
// already loaded.
func TestOllamaTiersBenchmark(t *testing.T) {
	if !*ollamaTiersBench {
		t.Skip("a benchmark: make bench-tiers-ollama runs it (-ollama-tiers-bench)")
	}
	srv := ollamatest.Start(t)
	size, err := modelgen.ParseSize(*ollamaTiersSize)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := modelgen.ForSize(size)
	if err != nil {
		t.Fatal(err)
	}
	loadBefore := loadavg()
	start := time.Now()

	// The cold copy: the model cache's file, on the node's disk.
	cacheDir, err := os.MkdirTemp("/var/tmp", "mo-bench-ollama-cache-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(cacheDir) }()
	cold := filepath.Join(cacheDir, "model.gguf")
	sha, n, err := modelgen.WriteFile(cold, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := createFrom(ctx, srv, cold); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(srv.Dir, "models", "blobs", "sha256-"+sha)
	if _, err := os.Stat(blob); err != nil {
		t.Fatalf("ollama's blob of the model: %v", err)
	}

	// The hot copy, on a huge-page tmpfs as the node agent mounts it.
	hotNote := ""
	mnt, err := os.MkdirTemp("", "mo-bench-ollama-hot-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.Remove(mnt) }()
	if _, err := nodeagent.MountHotTier(mnt, 2*n+(64<<20)); err != nil {
		hotNote = fmt.Sprintf(" (a huge-page tmpfs could not be mounted: %v; /dev/shm instead)", err)
		if mnt, err = os.MkdirTemp("/dev/shm", "mo-bench-ollama-hot-"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = os.RemoveAll(mnt) }()
	} else {
		defer func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) }()
	}
	hot := filepath.Join(mnt, "model.gguf")
	// The warm copy, on the node's disk.
	warmDir, err := os.MkdirTemp("/var/tmp", "mo-bench-ollama-warm-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(warmDir) }()
	warm := filepath.Join(warmDir, "model.gguf")
	{
		a, err := arena.New(n, arena.Options{})
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(cold)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := arena.Fill(a.Bytes(), f); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		// Tier copies are written as the node agent writes them.
		if err := arena.WriteFile(hot, a.Bytes(), false); err != nil {
			t.Fatal(err)
		}
		if err := arena.WriteFile(warm, a.Bytes(), true); err != nil {
			t.Fatal(err)
		}
		a.Free()
	}
	hotNote = fmt.Sprintf("huge=%s%s", nodeagent.HugePagesOf(mnt), hotNote)

	// Every probe reads into one destination kept for the run, as large
	// as the file, pre-faulted in huge pages.
	dst, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	diskProbes := func(tier, path string) []*tierprobe.Probe {
		buffered := tierprobe.Of(tier, path, dst, arena.FileOptions{Method: arena.ReadPread})
		buffered.DropCache = true
		return []*tierprobe.Probe{buffered, tierprobe.Of(tier, path, dst, arena.FileOptions{Direct: true})}
	}
	tiers := []ollamaTier{
		{name: "hot", path: hot, probes: []*tierprobe.Probe{
			tierprobe.Of("hot", hot, dst, arena.FileOptions{Method: arena.ReadMapped}),
			tierprobe.Of("hot", hot, dst, arena.FileOptions{Method: arena.ReadPread}),
		}},
		{name: "warm", path: warm, disk: true, probes: diskProbes("warm", warm)},
		{name: "cold", path: cold, disk: true, probes: diskProbes("cold", cold)},
	}

	prompt, err := ollamaPrompt(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var loads []ollamaLoad
	for round := range *ollamaTiersRounds {
		for k := range tiers {
			tier := tiers[(round+k)%len(tiers)]
			l, err := ollamaLoadFrom(ctx, srv.URL, blob, tier, n, prompt)
			if err != nil {
				t.Fatalf("round %d, %s: %v", round+1, tier.name, err)
			}
			t.Logf("round %d, %s: first token %v (loaded: %v; ollama's load %v), probe %s GB/s (%s), bound %v, ratio %.2f, load ÷ probe time %.1f",
				round+1, tier.name, l.first.Round(time.Millisecond), l.awake.Round(time.Millisecond), l.load.Round(time.Millisecond), gbps(l.probe.BytesPerSecond), l.probeMethod, l.bound.Round(time.Millisecond), l.ratio(), l.loadRatio())
			loads = append(loads, l)
		}
	}
	table := renderOllama(loads, tiers, n, cfg, hotNote, loadBefore, loadavg(), time.Since(start))
	fmt.Print(table)
	if *ollamaTiersDocs != "" {
		if err := replaceSection(*ollamaTiersDocs, ollamaStart, ollamaEnd, table); err != nil {
			t.Fatal(err)
		}
	}
}

// createFrom creates the benchmark's model in Ollama from the GGUF file
// at path (the file's bytes are only held while they are pushed).
func createFrom(ctx context.Context, srv *ollamatest.Server, path string) error {
	gguf, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return srv.Create(ctx, ollamaModel, gguf)
}

// ollamaLoadFrom unloads the model, points Ollama's blob at the tier's
// copy, reads the tier probes, drops a disk copy from the page cache, and
// times the first request (which loads the model) and one right after;
// then reads the probes again.
func ollamaLoadFrom(ctx context.Context, url, blob string, tier ollamaTier, n int64, prompt string) (ollamaLoad, error) {
	l := ollamaLoad{tier: tier.name}
	if err := ollamaUnload(ctx, url); err != nil {
		return l, err
	}
	if err := os.Remove(blob); err != nil && !errors.Is(err, os.ErrNotExist) {
		return l, err
	}
	if err := os.Symlink(tier.path, blob); err != nil {
		return l, err
	}
	before, err := probePeak(tier.probes)
	if err != nil {
		return l, err
	}
	if tier.disk {
		if err := nodeagent.DropCache(tier.path); err != nil {
			return l, err
		}
	}
	var done ollamaDone
	if l.first, done, err = ollamaFirstToken(ctx, url, prompt); err != nil {
		return l, fmt.Errorf("the first request after the unload: %w", err)
	}
	l.load = time.Duration(done.LoadDuration)
	if l.awake, _, err = ollamaFirstToken(ctx, url, prompt); err != nil {
		return l, fmt.Errorf("the request after the load: %w", err)
	}
	after, err := probePeak(tier.probes)
	if err != nil {
		return l, err
	}
	// The fastest read, of any method, before or after, is the tier's
	// limit.
	l.probe = tierprobe.Peak(append(before, after...)...)
	l.probeMethod = l.probe.Method
	l.bound = tierprobe.Bound(n, l.probe) + l.awake
	return l, nil
}

// probePeak reads each probe once.
func probePeak(ps []*tierprobe.Probe) ([]nodeapi.Bandwidth, error) {
	var out []nodeapi.Bandwidth
	for _, p := range ps {
		b, err := p.Read()
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// ollamaUnload unloads the model (keep_alive 0) and waits until /api/ps no
// longer lists it, so its runner and mappings are gone.
func ollamaUnload(ctx context.Context, url string) error {
	body, _ := json.Marshal(map[string]any{"model": ollamaModel, "keep_alive": 0})
	resp, err := http.Post(url+"/api/generate", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unloading: HTTP %d", resp.StatusCode)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var ps struct {
			Models []struct{ Name string } `json:"models"`
		}
		r, err := http.Get(url + "/api/ps")
		if err != nil {
			return err
		}
		err = json.NewDecoder(r.Body).Decode(&ps)
		_ = r.Body.Close()
		if err != nil {
			return err
		}
		if len(ps.Models) == 0 {
			// The runner process ends after the unload: give it a
			// moment to unmap the model before its pages are dropped.
			time.Sleep(500 * time.Millisecond)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("the model was still loaded a minute after the unload")
}

// ollamaFirstToken sends one streamed chat through Ollama's own API
// (/api/chat: temperature 0, a fixed seed, 8 tokens) and returns the time
// to its first non-empty content and Ollama's own account of the request
// (its final chunk): load_duration is the model's load.
func ollamaFirstToken(ctx context.Context, url, prompt string) (time.Duration, ollamaDone, error) {
	body, _ := json.Marshal(map[string]any{
		"model": ollamaModel, "stream": true,
		"options":  map[string]any{"temperature": 0, "seed": 1, "num_predict": 8},
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/chat", bytes.NewReader(body))
	if err != nil {
		return 0, ollamaDone{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ollamaDone{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, ollamaDone{}, fmt.Errorf("chat: HTTP %d", resp.StatusCode)
	}
	first, done, err := ollamaChatStream(resp.Body, time.Now)
	if err != nil {
		return 0, done, err
	}
	return first.Sub(sent), done, nil
}

// ollamaPrompt finds a prompt whose answer starts with content: the
// generated model's weights are random, and at temperature 0 some prompts
// draw the end token first. The same prompt then serves every load.
func ollamaPrompt(ctx context.Context, url string) (string, error) {
	var err error
	for k := range 10 {
		p := "Say something about tiers " + string(rune('a'+k))
		if _, _, err = ollamaFirstToken(ctx, url, p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no prompt drew content from the model: %w", err)
}

func renderOllama(loads []ollamaLoad, tiers []ollamaTier, n int64, cfg modelgen.Config, hotNote, loadBefore, loadAfter string, took time.Duration) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "`make bench-tiers-ollama` on %s, %d CPUs; load average %s before, %s after; %s. ", host, runtime.NumCPU(), loadBefore, loadAfter, took.Round(time.Second))
	fmt.Fprintf(&b, "The real Ollama engine (`ollama serve` %s, the pinned build, in process, `num_thread` 1) and a generated GGUF model of %.0f MiB (%d layers, embedding %d), loaded %d times from each tier, the tiers' order rotating each round: Ollama's blob of the model is a symlink to the tier's copy; hot is a copy on a tmpfs (%s), warm a copy on the node's disk, cold the model cache's own file on the node's disk (on this machine the same disk as the warm copy: cold and warm differ only with a PVC or S3 behind the cache), both dropped from the page cache (`fadvise(DONTNEED)`) before each load. ", ollamatest.Version, float64(n)/(1<<20), cfg.Layers, cfg.Embedding, len(loads)/len(tiers), hotNote)
	b.WriteString("Each load: unload the model (`keep_alive` 0, wait until `/api/ps` lists nothing), point the blob at the tier's copy, read the tier probes, drop a disk copy from the page cache, send a streamed chat (Ollama's `/api/chat`, 8 tokens, temperature 0) and time its first non-empty content: the load and the first token (**first token after load**), with Ollama's own `load_duration` from the answer's last chunk; then the same chat again, the model loaded (**TTFT loaded**); then the probes again. The probes (`internal/tierprobe`, shared with bench-tiers and bench-mux) read the same file into one buffer kept for the run, pre-faulted in huge pages, every way it can be read, without hashing: hot with `pread` and a copy out of a populated mapping, warm and cold with `pread` after dropping the file's pages and with `O_DIRECT` (8 readers, 8 MiB blocks); the fastest read, of any method, before or after the load, is the tier's limit. The bound is the model's bytes at that rate plus TTFT loaded; Ollama's load is compared with the bytes at that rate alone. Medians of the loads; a ratio's p50 is that of the loads' own ratios.\n\n")
	b.WriteString("| Copy | loads | tier probe (GB/s, fastest method) | first token after load p50 | max | TTFT loaded p50 | bound p50 (bytes ÷ probe + TTFT loaded) | first token after load ÷ bound p50 | min | Ollama load_duration p50 | load ÷ (bytes ÷ probe) p50 |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, tier := range tiers {
		var ls []ollamaLoad
		for _, l := range loads {
			if l.tier == tier.name {
				ls = append(ls, l)
			}
		}
		if len(ls) == 0 {
			continue
		}
		med := func(key func(ollamaLoad) float64) ollamaLoad { return medianBy(ls, key) }
		pr := med(func(l ollamaLoad) float64 { return l.probe.BytesPerSecond })
		first := med(func(l ollamaLoad) float64 { return float64(l.first) })
		maxFirst := slices.MaxFunc(ls, func(a, b ollamaLoad) int { return int(a.first - b.first) })
		awake := med(func(l ollamaLoad) float64 { return float64(l.awake) })
		bound := med(func(l ollamaLoad) float64 { return float64(l.bound) })
		ratio := med(ollamaLoad.ratio)
		minRatio := slices.MinFunc(ls, func(a, b ollamaLoad) int {
			if a.ratio() < b.ratio() {
				return -1
			}
			return 1
		})
		load := med(func(l ollamaLoad) float64 { return float64(l.load) })
		loadRatio := med(ollamaLoad.loadRatio)
		fmt.Fprintf(&b, "| %s | %d | %s (%s) | %v | %v | %v | %v | %.2f | %.2f | %v | %.1f |\n", tier.name, len(ls), gbps(pr.probe.BytesPerSecond), pr.probeMethod,
			first.first.Round(time.Millisecond), maxFirst.first.Round(time.Millisecond), awake.awake.Round(time.Millisecond), bound.bound.Round(time.Millisecond), ratio.ratio(), minRatio.ratio(),
			load.load.Round(time.Millisecond), loadRatio.loadRatio())
	}
	return b.String()
}

// replaceSection writes table between the start and end markers of the
// markdown file at path.
func replaceSection(path, start, end, table string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", path, start, end)
	}
	return os.WriteFile(path, []byte(s[:i+len(start)]+"\n"+table+s[j:]), 0o644)
}
