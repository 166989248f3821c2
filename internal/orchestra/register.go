package orchestra

import "github.com/model-orchestra/operator/internal/plugin"

// Register adds the ModelOrchestra plugins to r. The operator and the
// offline preview (orchestra template) both call it, so they run exactly
// the same plugins.
func Register(r *plugin.Registry) {
	r.RegisterTranslator(TranslatorName, Translator{})
	r.RegisterPostRenderer(ConfigChecksumName, NewConfigChecksum)
	r.RegisterPostRenderer(GPUSchedulingName, NewGPUScheduling)
	r.RegisterPostRenderer(ProxyEnvName, NewProxyEnv)
	r.RegisterStatus(StatusName, Status{})
}
