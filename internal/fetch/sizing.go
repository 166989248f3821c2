package fetch

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/model-orchestra/operator/internal/modelsize"
)

// Sizing is published in progress.json and .orchestra/sizing.json.
type Sizing struct {
	modelsize.Size
	// MemoryLimitBytes and MarginPercent are what the estimate was
	// checked against.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
	MarginPercent    int64 `json:"marginPercent,omitempty"`
	// GPUProduct is the requested GPU product and GPUProductMemoryBytes
	// its memory from modelsize's table, which GPUMemoryBytes (plus the
	// margin) was checked against; 0: a product the table does not know,
	// not checked.
	GPUProduct            string `json:"gpuProduct,omitempty"`
	GPUProductMemoryBytes int64  `json:"gpuProductMemoryBytes,omitempty"`
	// Fits is false when the estimate plus the margin exceeds the limit;
	// engine pods wait for it to be true.
	Fits bool `json:"fits"`
	// Overridden is true when the limit check was turned off.
	Overridden bool `json:"overridden,omitempty"`
}

// previousSizing is the sizing the cache in dir recorded last, nil when
// none can be read.
func previousSizing(dir string) *Sizing {
	b, err := os.ReadFile(SizingPath(dir))
	if err != nil {
		return nil
	}
	var sz Sizing
	if json.Unmarshal(b, &sz) != nil {
		return nil
	}
	return &sz
}

// SizingPath is where the cache records its sizing.
func SizingPath(dir string) string { return filepath.Join(dir, metaDir, "sizing.json") }

// sizeModel reads the model's GGUF header, publishes its size and memory
// estimate, and fails (exit 3) when it cannot fit the memory limit.
func sizeModel(cfg Config, dir string, t *tracker, log *slog.Logger) error {
	path := filepath.Join(dir, cfg.SizeFile)
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%w: the model file %s is not in the cache: %w", ErrVerification, cfg.SizeFile, err)
	}
	s, err := modelsize.Read(path, cfg.SizeContext, cfg.SizeParallel, cfg.GPUs)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrVerification, err)
	}
	sz := &Sizing{Size: s, MemoryLimitBytes: cfg.MemoryLimit, MarginPercent: cfg.MemoryMargin, Fits: true, Overridden: cfg.IgnoreMemoryLimit, GPUProduct: cfg.GPUProduct}
	sz.GPUProductMemoryBytes, _ = modelsize.GPUMemory(cfg.GPUProduct)
	fitErr := modelsize.Fit(s, cfg.MemoryLimit, cfg.MemoryMargin)
	if gpuErr := modelsize.FitGPU(s, cfg.GPUProduct, cfg.MemoryMargin); gpuErr != nil {
		if fitErr != nil {
			gpuErr = fmt.Errorf("%w; and on the GPUs: %w", fitErr, gpuErr)
		}
		fitErr = gpuErr
	}
	if fitErr != nil && !cfg.IgnoreMemoryLimit {
		sz.Fits = false
	}
	b, _ := json.MarshalIndent(sz, "", "  ")
	if err := writeFileSynced(SizingPath(dir), append(b, '\n')); err != nil {
		return fmt.Errorf("writing %s: %w", SizingPath(dir), err)
	}
	t.mu.Lock()
	t.sizing = sz
	t.mu.Unlock()
	log.Info("model size", "file", cfg.SizeFile, "architecture", s.Architecture, "parameters", s.Parameters, "weightType", s.WeightType,
		"fileBytes", s.FileBytes, "context", s.Context, "parallel", s.Parallel, "memoryBytes", s.MemoryBytes, "memoryLimit", cfg.MemoryLimit,
		"gpus", s.GPUs, "gpuMemoryBytes", s.GPUMemoryBytes, "gpuProduct", cfg.GPUProduct, "gpuProductMemory", sz.GPUProductMemoryBytes, "fits", sz.Fits)
	if fitErr != nil {
		if cfg.IgnoreMemoryLimit {
			log.Warn("the memory limit check is overridden", "err", fitErr)
			return nil
		}
		return fmt.Errorf("%w: %w", ErrVerification, fitErr)
	}
	t.setPhase(PhaseComplete, t.snapshotMessage()+"; "+s.Summary())
	return nil
}

func (t *tracker) snapshotMessage() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.message
}

// ErrTooLarge is modelsize.ErrTooLarge, for callers of this package.
var ErrTooLarge = modelsize.ErrTooLarge

func writeFileSynced(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
