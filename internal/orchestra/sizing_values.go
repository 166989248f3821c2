package orchestra

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// The model's sizing as chart values, and the format each engine loads natively.

// sizingValues are the fetch Job's sizing flags for engines that load one
// GGUF file in one pod (llamacpp, ollama): the file, the context and
// concurrency the engine is configured with, and the engine container's
// memory limit (none, or a llama.cpp root whose weights are split over
// RPC workers, publishes the size without a check), and its GPUs: the
// estimate offloads every layer to runtime.gpu.count GPUs and checks the
// fullest against runtime.gpu.product's memory where modelsize knows it.
func sizingValues(app v1alpha1.Application) map[string]any {
	m, rt := app.Model, app.Runtime
	if rt.Engine != v1alpha1.EngineLlamaCPP && rt.Engine != v1alpha1.EngineOllama {
		return nil
	}
	if m.File == "" || (m.Format != v1alpha1.ModelFormatGGUF && m.Convert == nil) {
		return nil
	}
	margin, ignore := int64(10), false
	if sz := m.Sizing; sz != nil {
		margin, ignore = int64(sz.MarginPercent), sz.IgnoreMemoryLimit
	}
	var limit int64
	if rt.Resources != nil && rt.Workers == 0 {
		if q, ok := rt.Resources.Limits[corev1.ResourceMemory]; ok {
			limit = q.Value()
		}
	}
	gpus, product := int64(0), ""
	if rt.Workers == 0 && rt.GPU.Count > 0 {
		gpus, product = int64(rt.GPU.Count), rt.GPU.Product
	}
	return map[string]any{
		"file":              m.File,
		"context":           int64(app.Serving.ContextLength),
		"parallel":          int64(max(app.Serving.MaxConcurrency, 1)),
		"memoryLimit":       limit,
		"marginPercent":     margin,
		"ignoreMemoryLimit": ignore,
		"gpus":              gpus,
		"gpuProduct":        product,
	}
}

// nativeFormat is the model format an engine loads when none is given.
func nativeFormat(e v1alpha1.Engine) v1alpha1.ModelFormat {
	switch e {
	case v1alpha1.EngineDllama:
		return v1alpha1.ModelFormatDllama
	case v1alpha1.EngineVLLM:
		return v1alpha1.ModelFormatSafetensors
	case v1alpha1.EngineSimulator:
		return ""
	default:
		return v1alpha1.ModelFormatGGUF
	}
}
