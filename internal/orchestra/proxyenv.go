package orchestra

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/operator-framework/operator-lib/proxy"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/plugin"
)

// ProxyEnvName is the proxy-env post-renderer's name.
const ProxyEnvName = "proxy-env"

// ProxyEnvConfig is the proxy-env config in watches.yaml.
type ProxyEnvConfig struct {
	// Components are the values of the pods' app.kubernetes.io/component
	// label that get the proxy variables: the pods that download from
	// outside the cluster. Default: model-fetch (the model fetch Job and
	// the engines' fetch init container), root, worker and seat-group (the
	// engines, which may pull models or tokenizers themselves).
	Components []string `json:"components,omitempty"`
}

// proxyEnv gives the pods that download models the cluster-wide proxy
// settings the operator runs with. OLM injects the cluster's proxy (on
// OpenShift, the Proxy object "cluster"; elsewhere the Subscription's
// spec.config.env) into the operator's Deployment as HTTP_PROXY,
// HTTPS_PROXY and NO_PROXY; operator-lib's proxy package reads them, with
// their lower-case twins, and this post-renderer adds them to every
// container and init container of the selected pods.
//
// A variable the chart already sets in a container, in either case, is
// left alone in that container, with its twin: the user's explicit setting
// wins. Without proxy variables in the operator's environment the
// post-renderer changes nothing.
type proxyEnv struct {
	components []string
	env        []corev1.EnvVar
}

// NewProxyEnv builds the proxy-env post-renderer from its config and the
// operator's environment.
func NewProxyEnv(config json.RawMessage) (plugin.PostRenderer, error) {
	return newProxyEnv(config, proxy.ReadProxyVarsFromEnv())
}

func newProxyEnv(config json.RawMessage, env []corev1.EnvVar) (*proxyEnv, error) {
	cfg := ProxyEnvConfig{}
	if err := decodeConfig(ProxyEnvName, config, &cfg); err != nil {
		return nil, err
	}
	if cfg.Components == nil {
		cfg.Components = []string{"model-fetch", "root", "worker", "seat-group"}
	}
	for _, c := range cfg.Components {
		if c == "" {
			return nil, fmt.Errorf("post-renderer %s: config: components must not contain an empty name", ProxyEnvName)
		}
	}
	return &proxyEnv{components: cfg.Components, env: env}, nil
}

// DigestConfig returns what, besides its watches.yaml config, the output
// depends on: the proxy variables. The engine adds it to the digest of
// every release, so that a changed cluster proxy (OLM restarts the operator
// with the new environment) upgrades the releases.
func (p *proxyEnv) DigestConfig() json.RawMessage {
	if len(p.env) == 0 {
		return nil
	}
	b, _ := json.Marshal(p.env)
	return b
}

// PostRender implements plugin.PostRenderer.
func (p *proxyEnv) PostRender(_ context.Context, _ plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	if len(p.env) == 0 {
		return objs, nil
	}
	for _, obj := range objs {
		pt, err := podTemplateOf(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ProxyEnvName, err)
		}
		if pt == nil || !slices.Contains(p.components, pt.tmpl.Labels[labelComponent]) {
			continue
		}
		changed := false
		for _, cs := range [][]corev1.Container{pt.tmpl.Spec.InitContainers, pt.tmpl.Spec.Containers} {
			for i := range cs {
				changed = p.addTo(&cs[i]) || changed
			}
		}
		if !changed {
			continue
		}
		if err := pt.store(); err != nil {
			return nil, fmt.Errorf("%s: %w", ProxyEnvName, err)
		}
	}
	return objs, nil
}

// addTo appends the proxy variables the container does not set itself,
// in either case, and reports whether it added any.
func (p *proxyEnv) addTo(c *corev1.Container) bool {
	set := map[string]bool{}
	for _, e := range c.Env {
		set[strings.ToUpper(e.Name)] = true
	}
	added := false
	for _, e := range p.env {
		if set[strings.ToUpper(e.Name)] {
			continue
		}
		c.Env = append(c.Env, e)
		added = true
	}
	return added
}
