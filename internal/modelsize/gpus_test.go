package modelsize

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/convert"
	"github.com/model-orchestra/operator/internal/hfllama"
)

func TestFitGPU(t *testing.T) {
	gib := int64(1 << 30)
	// an 8B model at Q8_0 with a large KV cache: 14 GiB on one GPU, half
	// on each of two
	one := Size{Architecture: "llama", Parameters: 8e9, WeightType: "Q8_0", FileBytes: 8 * gib, Context: 8192, Parallel: 16, GPUs: 1, GPUMemoryBytes: 14 * gib}
	two := one
	two.GPUs, two.GPUMemoryBytes = 2, 14*gib/2
	cpu := one
	cpu.GPUs, cpu.GPUMemoryBytes = 0, 0
	for _, tc := range []struct {
		name    string
		s       Size
		product string
		margin  int64
		refused []string // what the error names; nil: fits
	}{
		{"fits an L4", one, "NVIDIA-L4", 10, nil},
		{"too large for a T4", one, "Tesla-T4", 10, []string{"14.0GiB on each of 1 GPU(s) for 8192-token context × 16 sequences", "15.4GiB with the 10% margin", "a Tesla-T4 has 15.0GiB"}},
		{"too large for an L4 with a large margin", one, "NVIDIA-L4", 80, []string{"25.2GiB with the 80% margin", "a NVIDIA-L4 has 22.5GiB"}},
		{"split over two T4s", two, "Tesla-T4", 80, nil},
		{"unknown product: not checked", one, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 10, nil},
		{"a CPU estimate: not checked", cpu, "Tesla-T4", 10000, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := FitGPU(tc.s, tc.product, tc.margin)
			if tc.refused == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v, want ErrTooLarge", err)
			}
			for _, want := range tc.refused {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q lacks %q", err, want)
				}
			}
		})
	}
}

func TestGPUMemoryTable(t *testing.T) {
	for _, tc := range []struct {
		product string
		mib     int64
	}{{"NVIDIA-A100-SXM4-80GB", 81920}, {"Tesla-T4", 15360}, {"NVIDIA-L4", 23034}, {"nvidia-l4", 0}, {"", 0}} {
		got, ok := GPUMemory(tc.product)
		if ok != (tc.mib > 0) || got != tc.mib<<20 {
			t.Errorf("GPUMemory(%q) = %d, %v; want %d MiB", tc.product, got, ok, tc.mib)
		}
	}
	if len(GPUProducts()) != len(gpuMemoryMiB) {
		t.Error("GPUProducts misses products")
	}
}

// With GPUs the layers leave the host: the container keeps less, and of
// two GPUs each holds less than one alone (the layers and their KV cache
// split; each keeps its own compute buffers).
func TestReadWithGPUs(t *testing.T) {
	dir := t.TempDir()
	if err := hfllama.WriteTiny(dir, hfllama.TinyOptions{Seed: 1, Hidden: 1024, Intermediate: 2048, Layers: 8, MaxPositions: 2048}); err != nil {
		t.Fatal(err)
	}
	res, err := convert.Run(context.Background(), convert.Options{Dir: dir, Type: convert.F16})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, res.Output)
	cpu, err := Read(path, 2048, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	one, err := Read(path, 2048, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	two, err := Read(path, 2048, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cpu %+v\none %+v\ntwo %+v", cpu, one, two)
	if cpu.GPUMemoryBytes != 0 || one.GPUs != 1 || two.GPUs != 2 {
		t.Errorf("GPUs: cpu %+v one %+v two %+v", cpu, one, two)
	}
	if one.MemoryBytes >= cpu.MemoryBytes || one.GPUMemoryBytes < cpu.FileBytes/2 {
		t.Errorf("one GPU: host %d (CPU only %d), GPU %d for a %d-byte file", one.MemoryBytes, cpu.MemoryBytes, one.GPUMemoryBytes, cpu.FileBytes)
	}
	if two.GPUMemoryBytes >= one.GPUMemoryBytes {
		t.Errorf("two GPUs hold %d each, one holds %d", two.GPUMemoryBytes, one.GPUMemoryBytes)
	}
}
