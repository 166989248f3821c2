package fetch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/model-orchestra/operator/internal/convert"
	"github.com/model-orchestra/operator/internal/hfllama"
)

type phaseSink struct {
	mu     sync.Mutex
	phases []Phase
}

func (s *phaseSink) Report(_ context.Context, st Status, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.phases) == 0 || s.phases[len(s.phases)-1] != st.Phase {
		s.phases = append(s.phases, st.Phase)
	}
	return nil
}

func tinyRepo(t *testing.T, id string, edit func(dir string)) *repoFixture {
	t.Helper()
	dir := t.TempDir()
	if err := hfllama.WriteTiny(dir, hfllama.TinyOptions{Seed: 4}); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(dir)
	}
	fx := newRepoFixture(id)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fx.add(e.Name(), b, strings.HasSuffix(e.Name(), ".safetensors"))
	}
	return fx
}

// --convert turns the fetched checkpoint into a GGUF beside it, reports a
// Converting phase, and a second run finds both the fetch and the
// conversion complete.
func TestFetchThenConvert(t *testing.T) {
	hub := startHub(t, tinyRepo(t, "acme/tiny-hf", nil))
	cfg := testConfig(t, "hf://acme/tiny-hf", hub.URL())
	cfg.Format = FormatSafetensors
	cfg.Convert = "q8_0"
	sink := &phaseSink{}
	if _, err := runFetch(t, cfg, Options{Sinks: []ProgressSink{sink}}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(cfg.Dest, "model-Q8_0.gguf")
	b, err := os.ReadFile(out)
	if err != nil || string(b[:4]) != "GGUF" {
		t.Fatalf("converted file: %v", err)
	}
	m, err := os.ReadFile(convert.ManifestPath(cfg.Dest))
	if err != nil || !strings.Contains(string(m), `"complete": true`) {
		t.Fatalf("convert manifest: %v %s", err, m)
	}
	sink.mu.Lock()
	phases := append([]Phase(nil), sink.phases...)
	sink.mu.Unlock()
	if !contains(phases, PhaseConverting) || phases[len(phases)-1] != PhaseComplete {
		t.Errorf("phases %v: want Converting, then Complete", phases)
	}
	st, _ := os.Stat(out)
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(out)
	if !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("the second run rewrote the converted file")
	}
}

func contains(ps []Phase, p Phase) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// An unconvertible checkpoint fails with exit code 3 and a message naming
// what is missing; nothing is published under the output name.
func TestFetchConvertUnsupported(t *testing.T) {
	hub := startHub(t, tinyRepo(t, "acme/gpt2", func(dir string) {
		p := filepath.Join(dir, "config.json")
		b, _ := os.ReadFile(p)
		_ = os.WriteFile(p, []byte(strings.Replace(string(b), "LlamaForCausalLM", "GPT2LMHeadModel", 1)), 0o644)
	}))
	cfg := testConfig(t, "hf://acme/gpt2", hub.URL())
	cfg.Convert = "F16"
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrVerification) || ExitCode(err) != ExitVerification || !strings.Contains(err.Error(), `architecture "GPT2LMHeadModel"`) {
		t.Fatalf("err = %v (exit %d), want exit 3 naming the architecture", err, ExitCode(err))
	}
	if _, err := os.Stat(filepath.Join(cfg.Dest, "model-F16.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an output was published: %v", err)
	}
}

func TestConvertFlagValidation(t *testing.T) {
	c := Default()
	c.Source, c.Dest, c.Convert = "hf://a/b", "/models", "Q5_K"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--convert") {
		t.Fatalf("Validate: %v", err)
	}
	c.Convert, c.Source, c.Dest = "F16", "pvc://claim/x", ""
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "needs --dest") {
		t.Fatalf("Validate: %v", err)
	}
}

// The size is read from the converted file's header and published; a
// memory limit the estimate (plus margin) exceeds fails the run naming the
// numbers and records fits=false, which engine pods wait on; the override
// publishes the size without failing.
func TestSizingAgainstTheMemoryLimit(t *testing.T) {
	hub := startHub(t, tinyRepo(t, "acme/tiny-hf", nil))
	cfg := testConfig(t, "hf://acme/tiny-hf", hub.URL())
	cfg.Convert, cfg.SizeFile, cfg.SizeParallel, cfg.MemoryMargin = "F16", "model-F16.gguf", 2, 20
	cfg.MemoryLimit = 1 << 20
	sink := &sizingSink{}
	_, err := runFetch(t, cfg, Options{Sinks: []ProgressSink{sink}})
	if !errors.Is(err, ErrTooLarge) || ExitCode(err) != ExitVerification || !strings.Contains(err.Error(), "the limit is 1.0MiB") || !strings.Contains(err.Error(), "× 2 sequences") {
		t.Fatalf("err = %v (exit %d), want a too-large error naming the numbers", err, ExitCode(err))
	}
	b, _ := os.ReadFile(SizingPath(cfg.Dest))
	if !strings.Contains(string(b), `"fits": false`) {
		t.Fatalf("sizing.json: %s", b)
	}
	last := sink.last()
	if last.Phase != PhaseFailed || last.Sizing == nil || last.Sizing.Fits || last.Sizing.Architecture != "llama" || last.Sizing.WeightType != "F16" || last.Sizing.MemoryBytes <= last.Sizing.FileBytes/2 {
		t.Fatalf("last progress: %+v sizing %+v", last, last.Sizing)
	}
	cfg.IgnoreMemoryLimit = true
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("with the override: %v", err)
	}
	b, _ = os.ReadFile(SizingPath(cfg.Dest))
	if !strings.Contains(string(b), `"fits": true`) || !strings.Contains(string(b), `"overridden": true`) {
		t.Fatalf("sizing.json with the override: %s", b)
	}
}

type sizingSink struct {
	mu sync.Mutex
	st Status
}

func (s *sizingSink) Report(_ context.Context, st Status, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = st
	return nil
}

func (s *sizingSink) last() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// A GPU product of known memory is a limit too: a model whose per-GPU
// estimate plus the margin exceeds it is refused naming the product, and
// a product the table does not know publishes the size unchecked.
func TestSizingAgainstTheGPUProduct(t *testing.T) {
	hub := startHub(t, tinyRepo(t, "acme/tiny-hf", nil))
	cfg := testConfig(t, "hf://acme/tiny-hf", hub.URL())
	cfg.Convert, cfg.SizeFile, cfg.SizeParallel = "F16", "model-F16.gguf", 2
	// a margin so large that the tiny model's few MiB exceed a T4's 15 GiB
	cfg.GPUs, cfg.GPUProduct, cfg.MemoryMargin = 1, "Tesla-T4", 1_000_000
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrTooLarge) || ExitCode(err) != ExitVerification || !strings.Contains(err.Error(), "a Tesla-T4 has 15.0GiB") || !strings.Contains(err.Error(), "on each of 1 GPU(s)") {
		t.Fatalf("err = %v (exit %d), want a too-large error naming the GPU", err, ExitCode(err))
	}
	b, _ := os.ReadFile(SizingPath(cfg.Dest))
	if !strings.Contains(string(b), `"fits": false`) || !strings.Contains(string(b), `"gpuProductMemoryBytes": 16106127360`) {
		t.Fatalf("sizing.json: %s", b)
	}
	cfg.GPUProduct = "Acme-X1"
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("an unknown product: %v", err)
	}
	b, _ = os.ReadFile(SizingPath(cfg.Dest))
	if !strings.Contains(string(b), `"fits": true`) || strings.Contains(string(b), "gpuProductMemoryBytes") || !strings.Contains(string(b), `"gpuMemoryBytes"`) {
		t.Fatalf("sizing.json with an unknown product: %s", b)
	}
}

// A run over a cache that was sized before reports that verdict from its
// first report on, until it sizes the model again: the operator keeps the
// engine while a report has a verdict for its check.
func TestSizingReportsTheCachesVerdictUntilResized(t *testing.T) {
	hub := startHub(t, tinyRepo(t, "acme/tiny-hf", nil))
	cfg := testConfig(t, "hf://acme/tiny-hf", hub.URL())
	cfg.Convert, cfg.SizeFile, cfg.SizeParallel, cfg.MemoryLimit = "F16", "model-F16.gguf", 2, 1<<30
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatal(err)
	}
	first := &firstSizingSink{}
	if _, err := runFetch(t, cfg, Options{Sinks: []ProgressSink{first}}); err != nil {
		t.Fatal(err)
	}
	if first.st == nil || first.st.Sizing == nil || !first.st.Sizing.Fits || first.st.Sizing.MemoryLimitBytes != 1<<30 {
		t.Fatalf("the second run's first report: %+v", first.st)
	}
}

type firstSizingSink struct {
	mu sync.Mutex
	st *Status
}

func (s *firstSizingSink) Report(_ context.Context, st Status, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		s.st = &st
	}
	return nil
}
