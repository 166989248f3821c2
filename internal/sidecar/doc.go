// Package sidecar is orchestra-agent's per-engine sidecar (--role sidecar):
// one runs beside each engine container. It drives its engine's own sleep
// and wake API, drains the engine's requests before a sleep, reports the
// engine's state (GET /state; the wire types and the client are
// internal/sidecarapi), gates the engine container's readiness (GET
// /readyz: only Awake serves), restarts the engine in place, and points
// an engine that loads a model file (Ollama, llama.cpp) at the hottest
// verified copy of it on its node (the node agent's, internal/nodeagent,
// read through internal/nodeapi's CopyMeta). Its mutating endpoints
// accept only the release's caller token (internal/nodeapi).
//
// Engines. Engine is what the sidecar needs of an engine; NewEngine makes
// the adapter of a kind, one file each. An engine's processes (restart,
// device memory) are found through internal/engineproc.
//
// Files:
//   - sidecar.go: Sidecar, the sidecar's state machine and its HTTP API.
//   - config.go: Config, its defaults and validation.
//   - start.go: Start, the role's start.
//   - metrics.go: the sidecar's metrics.
//   - restart.go: restarting the engine in place (POST /restart).
//   - modelcopy.go: ModelCopies, pointing the engine at the hottest
//     verified copy of its model (a file, or vLLM's directory).
//   - modelfiles.go: GET /model/files, the model's files handed to the
//     node agent (with the caller token) where it cannot mount the cache.
//   - engine.go: the Engine interface, EngineConfig, NewEngine.
//   - vllm.go, ollama.go, llamacpp.go: one adapter per engine (the
//     simulator speaks vLLM's API).
//   - process.go: EngineProcess, an engine container's processes:
//     finding and stopping them.
//   - devicemem.go: the engine's device memory, read with nvidia-smi.
//   - enginetest/: fakes of vLLM, Ollama and llama.cpp that quote their
//     documented APIs.
package sidecar
