package orchestra

import "github.com/model-orchestra/operator/api/v1alpha1"

// ModelCopies reports whether an application's engine loads the hottest
// verified copy of its model file on its node (the chart's
// lifecycle.sleep.modelCopies value): its sidecar points the engine's
// model path at the node agent's hot copy, else its warm copy, else the
// model cache, at start and before each wake, and the leader asks the
// node agent for a hot copy when the engine falls asleep. It holds for an
// Ollama or llama.cpp application that sleeps outside a seat group and
// whose model file the node agent can read (ColdPath: a ReadWriteMany
// cache claim of the chart's). Both engines open their GGUF again at each
// load (Ollama its blob, llama.cpp's router the preset's model path), so a
// symlink re-pointed before the wake is all they need; the simulator keeps
// its own offload and reads the agent's copies itself, and vLLM keeps its
// level-1 copy in its own process and loads a directory of shards.
func ModelCopies(name string, app v1alpha1.Application, s Sleep) bool {
	if app.Lifecycle == nil || !s.Enabled() || hasSeat(app) {
		return false
	}
	switch app.Runtime.Engine {
	case v1alpha1.EngineOllama, v1alpha1.EngineLlamaCPP:
		return ColdPath(name, app, s) != ""
	}
	return false
}
