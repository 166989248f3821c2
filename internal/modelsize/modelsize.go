// Package modelsize reads a GGUF model's header and estimates the memory an
// engine needs to serve it with a given context window and concurrency,
// with github.com/gpustack/gguf-parser-go's llama.cpp estimate (weights,
// KV cache and compute buffers, without mmap: what a memory limit must
// hold). On the CPU everything is in the container's memory; with GPUs
// every layer is offloaded, split evenly over them, and the container
// keeps what llama.cpp leaves on the host. gpus.go holds the table of GPU
// products whose memory is known.
package modelsize

import (
	"errors"
	"fmt"
	"strings"

	ggufparser "github.com/gpustack/gguf-parser-go"
)

// Size is what the header says about a model and what serving it needs.
type Size struct {
	Architecture string `json:"architecture"`
	// Parameters is the number of weights.
	Parameters int64 `json:"parameters"`
	// WeightType is the file's predominant weight type (general.file_type),
	// for example Q8_0.
	WeightType string `json:"weightType"`
	// ContextLength is the model's trained context window.
	ContextLength int64 `json:"contextLength"`
	FileBytes     int64 `json:"fileBytes"`
	// Context and Parallel are what the estimate is for: the configured
	// context window (the model's own when not configured) and the number
	// of sequences served at once.
	Context  int64 `json:"context"`
	Parallel int64 `json:"parallel"`
	// MemoryBytes is the estimated memory to serve it: on the CPU all of
	// it, with GPUs what stays on the host.
	MemoryBytes int64 `json:"memoryBytes"`
	// GPUs is the number of GPUs the estimate offloads to (0: CPU), and
	// GPUMemoryBytes the estimate for the fullest one of them.
	GPUs           int64 `json:"gpus,omitempty"`
	GPUMemoryBytes int64 `json:"gpuMemoryBytes,omitempty"`
}

// Read parses path's header and estimates the memory for context tokens
// per sequence (0: the model's own) and parallel sequences, on the CPU
// (gpus 0) or with every layer offloaded to gpus GPUs.
func Read(path string, context, parallel, gpus int64) (Size, error) {
	gf, err := ggufparser.ParseGGUFFile(path)
	if err != nil {
		return Size{}, fmt.Errorf("reading the GGUF header of %s: %w", path, err)
	}
	md, arch := gf.Metadata(), gf.Architecture()
	s := Size{
		Architecture:  md.Architecture,
		Parameters:    int64(md.Parameters),
		WeightType:    strings.TrimPrefix(md.FileType.String(), "MOSTLY_"),
		ContextLength: int64(arch.MaximumContextLength),
		FileBytes:     int64(md.FileSize),
		Context:       context,
		Parallel:      max(parallel, 1),
		GPUs:          max(gpus, 0),
	}
	if s.Context <= 0 {
		s.Context = s.ContextLength
	}
	// the engines give every sequence its own context window: the KV cache
	// holds context × parallel tokens
	opts := []ggufparser.GGUFRunEstimateOption{
		ggufparser.WithLLaMACppContextSize(int32(s.Context * s.Parallel)),
		ggufparser.WithParallelSize(int32(s.Parallel)),
	}
	if s.GPUs == 0 {
		opts = append(opts, ggufparser.WithLLaMACppOffloadLayers(0))
	} else {
		// every layer on the GPUs (the default), split evenly by layer as
		// llama.cpp does without --tensor-split
		split := make([]float64, s.GPUs)
		for i := range split {
			split[i] = float64(i+1) / float64(s.GPUs)
		}
		split[len(split)-1] = 1
		opts = append(opts, ggufparser.WithTensorSplitFraction(split))
	}
	sum := gf.EstimateLLaMACppRun(opts...).SummarizeItem(false, 0, 0)
	s.MemoryBytes = int64(sum.RAM.UMA)
	if s.GPUs > 0 {
		for _, v := range sum.VRAMs {
			s.GPUMemoryBytes = max(s.GPUMemoryBytes, int64(v.NonUMA))
		}
	}
	return s, nil
}

// ErrTooLarge means a model does not fit its engine's memory limit (or
// the memory of its GPUs).
var ErrTooLarge = errors.New("the model does not fit the engine's memory limit")

// Fit checks the estimate plus a margin (percent of the estimate) against
// a memory limit in bytes; a limit of 0 means none.
func Fit(s Size, limit int64, marginPercent int64) error {
	if limit <= 0 {
		return nil
	}
	need := s.MemoryBytes + s.MemoryBytes*marginPercent/100
	if need > limit {
		where := ""
		if s.GPUs > 0 {
			where = " on the host"
		}
		return fmt.Errorf("%w: %s %s (%s parameters, %s file) needs about %s%s for %d-token context × %d sequences, %s with the %d%% margin; the limit is %s",
			ErrTooLarge, s.Architecture, s.WeightType, Count(s.Parameters), Bytes(s.FileBytes), Bytes(s.MemoryBytes), where, s.Context, s.Parallel, Bytes(need), marginPercent, Bytes(limit))
	}
	return nil
}

// Bytes formats a size with binary units, for example 1.3GiB.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Count formats a parameter count, for example 8.0B or 270K.
func Count(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// Summary is the one-line size kubectl shows, for example
// "1.1B Q8_0 1.1GiB, needs 1.4GiB".
func (s Size) Summary() string {
	return fmt.Sprintf("%s %s %s, needs %s", Count(s.Parameters), s.WeightType, Bytes(s.FileBytes), Bytes(s.MemoryBytes))
}
