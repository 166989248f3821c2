package orchestra

import (
	"strings"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// ModelCopies reports whether an application's engine loads the hottest
// verified copy of its model file on its node (the chart's
// lifecycle.sleep.modelCopies value): its sidecar points the engine's
// model path at the node agent's hot copy, else its warm copy, else the
// model cache, at start and before each wake, and the leader asks the
// node agent for a hot copy when the engine falls asleep. It holds for an
// Ollama or llama.cpp application that sleeps outside a seat group, whose
// cold tier is the model cache and whose model.file (the GGUF) the
// fetcher's manifest vouches for: a cache the fetch Job fills, a claim of
// the chart's of any access mode or an existingClaim, not a pvc:// source
// (no fetch, so no manifest to verify a copy against). The node agent
// reads the file from the cache where it mounts it (ColdPath: a
// ReadWriteMany claim of the chart's), and otherwise through the engine's
// sidecar, which mounts the cache whatever its access mode. Both engines
// open their GGUF again at each load (Ollama its blob, llama.cpp's router
// the preset's model path), so a symlink re-pointed before the wake is all
// they need; vLLM reads its --model directory at start and at a level-2
// wake's reload_weights (its level-1 wake restores its own RAM copy). The
// simulator keeps its own offload and reads the agent's copies itself.
func ModelCopies(name string, app v1alpha1.Application, s Sleep) bool {
	if app.Lifecycle == nil || (!s.Enabled() && !hasSeat(app)) {
		return false
	}
	if s.Tiers.Cold != v1alpha1.ColdTierModelCache || strings.HasPrefix(app.Model.Source, "pvc://") {
		return false
	}
	switch app.Runtime.Engine {
	case v1alpha1.EngineOllama, v1alpha1.EngineLlamaCPP:
		return cacheFile(app.Model.File) != ""
	case v1alpha1.EngineVLLM:
		// Its model directory (model.file, or the whole cache), on one
		// node: a multi-node vLLM loads it on every node.
		return app.Runtime.Workers == 0 && (app.Model.File == "" || cacheFile(app.Model.File) != "")
	}
	return false
}
