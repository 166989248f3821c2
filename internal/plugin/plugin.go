// Package plugin defines the three kinds of Go plugin that the Helm reconciler
// engine runs for a watches.yaml entry, and the registry that names them.
//
//   - A Translator turns a custom resource into chart values.
//   - A PostRenderer rewrites the rendered manifests of a custom resource.
//   - A StatusPlugin derives status fields from a release and its live objects.
//
// Plugins are registered by name on a Registry; watches.yaml refers to them by
// that name, and the operator refuses to start when a name is unknown.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Translator turns a custom resource into chart values.
type Translator interface {
	Translate(ctx context.Context, obj *unstructured.Unstructured) (map[string]any, error)
}

// TranslatorFunc adapts a function to Translator.
type TranslatorFunc func(ctx context.Context, obj *unstructured.Unstructured) (map[string]any, error)

// Translate calls f.
func (f TranslatorFunc) Translate(ctx context.Context, obj *unstructured.Unstructured) (map[string]any, error) {
	return f(ctx, obj)
}

// RenderContext is what a post-renderer is given besides the manifests.
type RenderContext struct {
	// Owner is the custom resource being reconciled (or previewed).
	Owner *unstructured.Unstructured
	// Reader reads live objects (for example referenced Secrets). It is nil
	// in the offline preview, where plugins must work without a cluster.
	Reader client.Reader
}

// PostRenderer rewrites rendered manifests. It must be deterministic: the
// same input gives the same output, so that the engine's digest is stable.
type PostRenderer interface {
	PostRender(ctx context.Context, rc RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error)
}

// ObjectRef names a live object that a post-renderer reads.
type ObjectRef struct {
	GVK       schema.GroupVersionKind
	Namespace string
	Name      string
}

// DigestContributor is implemented by a PostRenderer whose output depends
// on live objects it reads through RenderContext.Reader (for example a
// Secret whose digest it writes into a pod template). The engine upgrades a
// release only when the digest of its inputs changes, and it renders nothing
// to find out; DigestInputs tells it which live objects to add to that
// digest. The engine then adds their resourceVersions (or their absence) to
// the digest on every reconcile, and watches them, so that a change of one
// of them upgrades the release promptly.
//
// DigestInputs is given the post-renderer's own output: the objects of a
// fresh render, or those of the deployed release. It must name exactly the
// objects PostRender read to produce them, and it must be cheap: no reads
// and no rendering, only an inspection of objs. The engine reads the named
// objects' metadata from its own cache, in the namespaces of the served
// resources, so the operator needs get, list and watch on their kinds.
type DigestContributor interface {
	DigestInputs(ctx context.Context, rc RenderContext, objs []*unstructured.Unstructured) ([]ObjectRef, error)
}

// PostRendererFactory builds a PostRenderer from its watches.yaml config
// (nil when none is given). It validates the config, so that a bad config
// stops the operator at start-up rather than at the first reconcile.
type PostRendererFactory func(config json.RawMessage) (PostRenderer, error)

// StatusInput is what a status plugin is given.
type StatusInput struct {
	Owner *unstructured.Unstructured
	// ReleaseName and ReleaseRevision identify the deployed Helm release.
	ReleaseName     string
	ReleaseRevision int
	// Objects are the live objects of the release's manifest that exist.
	Objects []*unstructured.Unstructured
	// Reader reads further live objects (for example EndpointSlices).
	Reader client.Reader
}

// StatusResult is what a status plugin contributes to the custom resource's
// status. The engine keeps these fields: it never drops them when it writes
// its own (conditions, deployedRelease, observedGeneration).
type StatusResult struct {
	// Fields are merged into .status. The keys conditions, deployedRelease
	// and observedGeneration belong to the engine and are refused.
	Fields map[string]any
	// Conditions are set alongside the engine's conditions.
	Conditions []metav1.Condition
}

// StatusPlugin derives status from a release and its live objects.
type StatusPlugin interface {
	Status(ctx context.Context, in StatusInput) (StatusResult, error)
}

// ErrUnknownPlugin is returned when a name is not registered.
var ErrUnknownPlugin = errors.New("unknown plugin")

// Registry holds the plugins by name. The zero value is not usable; call
// NewRegistry.
type Registry struct {
	translators   map[string]Translator
	postRenderers map[string]PostRendererFactory
	statuses      map[string]StatusPlugin
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		translators:   map[string]Translator{},
		postRenderers: map[string]PostRendererFactory{},
		statuses:      map[string]StatusPlugin{},
	}
}

// RegisterTranslator registers t under name. It panics on a duplicate name,
// which is a programming error caught by any test that builds the registry.
func (r *Registry) RegisterTranslator(name string, t Translator) {
	mustBeNew(name, r.translators)
	r.translators[name] = t
}

// RegisterPostRenderer registers a post-renderer factory under name.
func (r *Registry) RegisterPostRenderer(name string, f PostRendererFactory) {
	mustBeNew(name, r.postRenderers)
	r.postRenderers[name] = f
}

// RegisterStatus registers a status plugin under name.
func (r *Registry) RegisterStatus(name string, s StatusPlugin) {
	mustBeNew(name, r.statuses)
	r.statuses[name] = s
}

// Translator returns the translator registered under name.
func (r *Registry) Translator(name string) (Translator, error) {
	return lookup("translator", name, r.translators)
}

// PostRenderer returns the post-renderer factory registered under name.
func (r *Registry) PostRenderer(name string) (PostRendererFactory, error) {
	return lookup("post-renderer", name, r.postRenderers)
}

// Status returns the status plugin registered under name.
func (r *Registry) Status(name string) (StatusPlugin, error) {
	return lookup("status plugin", name, r.statuses)
}

func mustBeNew[T any](name string, m map[string]T) {
	if name == "" {
		panic("plugin: empty plugin name")
	}
	if _, ok := m[name]; ok {
		panic(fmt.Sprintf("plugin: %q registered twice", name))
	}
}

func lookup[T any](kind, name string, m map[string]T) (T, error) {
	v, ok := m[name]
	if !ok {
		known := make([]string, 0, len(m))
		for k := range m {
			known = append(known, k)
		}
		sort.Strings(known)
		var zero T
		return zero, fmt.Errorf("%w: %s %q (registered: %v)", ErrUnknownPlugin, kind, name, known)
	}
	return v, nil
}
