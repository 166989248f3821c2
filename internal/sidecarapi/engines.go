package sidecarapi

// Engine kinds (api/v1alpha1 Engine values): the sidecar's --engine and
// the Engine its Status reports.
const (
	EngineVLLM      = "vllm"
	EngineSimulator = "simulator"
	EngineOllama    = "ollama"
	EngineLlamaCPP  = "llamacpp"
	EngineDllama    = "dllama"
)
