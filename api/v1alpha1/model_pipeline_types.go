package v1alpha1

// The model pipeline's conversion and sizing: what a ModelSpec asks of the
// fetch Job after the download, and the size it publishes in status.

// ConvertWeightType is the weight type of a converted GGUF file.
// +kubebuilder:validation:Enum=F16;Q8_0;Q4_0
type ConvertWeightType string

// Weight types of a conversion.
const (
	ConvertF16  ConvertWeightType = "F16"
	ConvertQ8_0 ConvertWeightType = "Q8_0"
	ConvertQ4_0 ConvertWeightType = "Q4_0"
)

// ModelConvert is a conversion of the fetched checkpoint to GGUF.
type ModelConvert struct {
	// weightType of the matrices: F16 (2 bytes a weight, lossless for
	// bfloat16 and float16 checkpoints in range), Q8_0 (8.5 bits, llama.cpp's
	// near-lossless 8-bit blocks) or Q4_0 (4.5 bits). Norms stay F32.
	// +optional
	// +kubebuilder:default=Q8_0
	WeightType ConvertWeightType `json:"weightType,omitempty"`
}

// ModelSizing tunes the memory check of a GGUF model.
type ModelSizing struct {
	// marginPercent is added to the memory estimate before it is compared
	// with the memory limit (the estimate leaves out the engine's own
	// runtime and allocator slack).
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=400
	MarginPercent int32 `json:"marginPercent,omitempty"`

	// ignoreMemoryLimit publishes the size but never refuses the model,
	// for users who know the estimate is too high for their engine build.
	// +optional
	IgnoreMemoryLimit bool `json:"ignoreMemoryLimit,omitempty"`
}

// ModelSize is what a GGUF model's header says and the memory estimate for
// the configured context and concurrency.
type ModelSize struct {
	// architecture, for example llama.
	Architecture string `json:"architecture,omitempty"`
	// parameters is the number of weights.
	Parameters int64 `json:"parameters,omitempty"`
	// weightType is the file's predominant weight type, for example Q8_0.
	WeightType string `json:"weightType,omitempty"`
	// contextLength is the model's trained context window in tokens.
	ContextLength int64 `json:"contextLength,omitempty"`
	// fileBytes is the size of the model file.
	FileBytes int64 `json:"fileBytes,omitempty"`
	// context and parallel are what the estimate is for: tokens per
	// sequence and sequences at once.
	Context  int64 `json:"context,omitempty"`
	Parallel int64 `json:"parallel,omitempty"`
	// memoryBytes is the estimated memory to serve the model (weights, KV
	// cache, compute buffers; llama.cpp's layout): all of it on the CPU,
	// what stays on the host when the layers are offloaded to GPUs.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// gpus is the number of GPUs every layer is offloaded to (runtime.gpu.
	// count), and gpuMemoryBytes the estimate for the fullest of them.
	// +optional
	GPUs int64 `json:"gpus,omitempty"`
	// +optional
	GPUMemoryBytes int64 `json:"gpuMemoryBytes,omitempty"`
	// gpuProduct is the requested product (runtime.gpu.product) and
	// gpuProductMemoryBytes its memory from the operator's table of known
	// products (docs/api.md), which gpuMemoryBytes plus the margin was
	// checked against; absent for a product the table does not know, whose
	// memory is not checked.
	// +optional
	GPUProduct string `json:"gpuProduct,omitempty"`
	// +optional
	GPUProductMemoryBytes int64 `json:"gpuProductMemoryBytes,omitempty"`
	// memoryLimitBytes is the engine's memory limit it was checked
	// against, and marginPercent the margin added to the estimate.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
	MarginPercent    int64 `json:"marginPercent,omitempty"`
	// fits is false when the estimate plus the margin exceeds the limit or
	// the GPU product's memory.
	Fits bool `json:"fits"`
}
