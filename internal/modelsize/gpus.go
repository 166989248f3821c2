package modelsize

import (
	"fmt"
	"sort"
)

// gpuMemoryMiB is the memory of the GPU products the sizing check knows,
// by the value of the nvidia.com/gpu.product node label that NVIDIA's GPU
// feature discovery sets (the product name NVML reports, spaces replaced
// with dashes), which is what spec.applications.<app>.runtime.gpu.product
// names. The figures are the total memory nvidia-smi reports for the
// product in MiB (with ECC where the product has it on by default), not the
// marketed gigabytes. A product not in the table (another vendor, a MIG
// slice such as NVIDIA-A100-SXM4-40GB-MIG-1g.5gb, a time-sliced -SHARED
// label) is not checked: its model's size is still published.
var gpuMemoryMiB = map[string]int64{
	"Tesla-T4":              15360,
	"NVIDIA-A10G":           23028,
	"NVIDIA-L4":             23034,
	"NVIDIA-L40S":           46068,
	"NVIDIA-A100-PCIE-40GB": 40960,
	"NVIDIA-A100-SXM4-40GB": 40960,
	"NVIDIA-A100-80GB-PCIe": 81920,
	"NVIDIA-A100-SXM4-80GB": 81920,
	"NVIDIA-H100-PCIe":      81559,
	"NVIDIA-H100-80GB-HBM3": 81559,
	"NVIDIA-H200":           143771,
}

// GPUMemory is the memory of one GPU of product in bytes; ok is false for
// a product the table does not know.
func GPUMemory(product string) (bytes int64, ok bool) {
	mib, ok := gpuMemoryMiB[product]
	return mib << 20, ok
}

// GPUProducts lists the products GPUMemory knows, sorted.
func GPUProducts() []string {
	out := make([]string, 0, len(gpuMemoryMiB))
	for p := range gpuMemoryMiB {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// FitGPU checks the estimate for the fullest GPU plus a margin (percent of
// the estimate) against the memory of one GPU of product. A product the
// table does not know, or an estimate for the CPU, is not checked.
func FitGPU(s Size, product string, marginPercent int64) error {
	mem, ok := GPUMemory(product)
	if !ok || s.GPUs == 0 {
		return nil
	}
	need := s.GPUMemoryBytes + s.GPUMemoryBytes*marginPercent/100
	if need > mem {
		return fmt.Errorf("%w: %s %s (%s parameters, %s file) needs about %s on each of %d GPU(s) for %d-token context × %d sequences, %s with the %d%% margin; a %s has %s",
			ErrTooLarge, s.Architecture, s.WeightType, Count(s.Parameters), Bytes(s.FileBytes), Bytes(s.GPUMemoryBytes), s.GPUs, s.Context, s.Parallel, Bytes(need), marginPercent, product, Bytes(mem))
	}
	return nil
}
