// Package preview renders ModelOrchestra resources offline, exactly as the
// operator would install them: the resource is validated and defaulted
// against the embedded CRD (schema and CEL rules, as the API server does),
// then rendered by the engine's pipeline (internal/render) with the
// embedded watches.yaml, the embedded chart and the same plugin registry.
// Template does all of it; Values and PostRender are its two halves around
// Helm, for previews with helm template.
//
// CheckpointPolicies in the input are validated against their CRD and
// serve the resources beside them, as the policies of their namespace
// serve them in a cluster; they render nothing themselves. ModelCheckpoints
// (which the chart renders and the lifecycle fills) are validated and
// otherwise ignored.
package preview

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/render"
	"github.com/model-orchestra/operator/internal/watches"
)

// ErrNoResource means the input held no resource to render.
var ErrNoResource = errors.New("no ModelOrchestra resource in the input")

// ErrNotOne means that the input held several resources where one release,
// and so one resource, is meant.
var ErrNotOne = errors.New("not exactly one ModelOrchestra resource")

// Options configure a preview.
type Options struct {
	// Set are --set style assignments applied to each resource before it is
	// validated, for example "spec.applications.chat.scaling.replicas=2".
	Set []string
	// Namespace is used for resources that do not name one; empty means
	// "default".
	Namespace string
	// KubeVersion is the Kubernetes version the chart is rendered for;
	// empty uses DefaultKubeVersion.
	KubeVersion string
}

// DefaultKubeVersion is the Kubernetes version a preview renders for unless
// told otherwise: the version of the Kubernetes libraries the operator is
// built with.
const DefaultKubeVersion = "v1.36.0"

// Renderer previews resources. Build it once with New; it is safe for
// sequential use.
type Renderer struct {
	validator *validation.Validator
	// others validate the kinds that render nothing, by kind.
	others  map[string]*validation.Validator
	entries []watches.Entry
}

// New loads the embedded CRD, watches.yaml and charts, and the plugins.
func New() (*Renderer, error) {
	v, err := validation.New(operator.ModelOrchestraCRD(), "")
	if err != nil {
		return nil, fmt.Errorf("loading the embedded CRD: %w", err)
	}
	others := map[string]*validation.Validator{}
	for kind, crd := range map[string][]byte{
		orchestra.CheckpointPolicyGVK.Kind: operator.CheckpointPolicyCRD(),
		"ModelCheckpoint":                  operator.ModelCheckpointCRD(),
	} {
		if others[kind], err = validation.New(crd, ""); err != nil {
			return nil, fmt.Errorf("loading the embedded %s CRD: %w", kind, err)
		}
	}
	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	entries, err := watches.Parse(operator.WatchesFile, operator.Watches(), operator.FS, reg)
	if err != nil {
		return nil, fmt.Errorf("loading the embedded watches.yaml: %w", err)
	}
	return &Renderer{validator: v, others: others, entries: entries}, nil
}

// Template renders every resource in the YAML stream r and returns the
// manifests, separated by "---". The first invalid resource stops it with
// an error naming the resource and its fields.
func (p *Renderer) Template(ctx context.Context, r io.Reader, opts Options) (string, error) {
	all, err := decode(r)
	if err != nil {
		return "", err
	}
	objs, ctx, err := p.split(ctx, all, opts)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, obj := range objs {
		manifest, err := p.templateOne(ctx, obj, opts)
		if err != nil {
			return "", err
		}
		out.WriteString(manifest)
	}
	return out.String(), nil
}

// Render validates one resource and renders it; it returns the rendered
// result and the validated, defaulted resource.
func (p *Renderer) Render(ctx context.Context, obj *unstructured.Unstructured, opts Options) (*render.Result, *unstructured.Unstructured, error) {
	entry, valid, err := p.prepare(ctx, obj, opts)
	if err != nil {
		return nil, nil, err
	}
	kubeVersion := opts.KubeVersion
	if kubeVersion == "" {
		kubeVersion = DefaultKubeVersion
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, nil, fmt.Errorf("kube version %q: %w", kubeVersion, err)
	}
	ro := render.Options{KubeVersion: kv}
	res, err := render.ForResource(ctx, entry, valid, ro)
	if err != nil {
		return nil, nil, err
	}
	return res, valid, nil
}

// prepare applies opts.Set and the namespace to a copy of obj, validates and
// defaults it as the API server would, and finds its watches.yaml entry.
func (p *Renderer) prepare(ctx context.Context, obj *unstructured.Unstructured, opts Options) (*watches.Entry, *unstructured.Unstructured, error) {
	obj = obj.DeepCopy()
	for _, s := range opts.Set {
		if err := strvals.ParseInto(s, obj.Object); err != nil {
			return nil, nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(namespaceOr(opts.Namespace))
	}
	valid, err := p.validator.Validate(ctx, obj)
	if err != nil {
		return nil, nil, err
	}
	entry, err := p.entry(valid)
	if err != nil {
		return nil, nil, err
	}
	return entry, valid, nil
}

// Values returns the chart values the operator renders the one resource in
// r with: the values translator's result with watches.yaml's overrideValues
// on top, as YAML. Given to `helm template <name> <chart> -n <namespace>
// -f`, with PostRender as the post-renderer, they render what Template
// does.
func (p *Renderer) Values(ctx context.Context, r io.Reader, opts Options) ([]byte, error) {
	obj, ctx, err := p.decodeOne(ctx, r, opts)
	if err != nil {
		return nil, err
	}
	entry, valid, err := p.prepare(ctx, obj, opts)
	if err != nil {
		return nil, err
	}
	vals, err := render.Values(ctx, entry, valid)
	if err != nil {
		return nil, err
	}
	if err := render.Validate(entry, vals); err != nil {
		return nil, err
	}
	out, err := yaml.Marshal(vals)
	if err != nil {
		return nil, fmt.Errorf("encoding the values of %s/%s: %w", valid.GetNamespace(), valid.GetName(), err)
	}
	return out, nil
}

// ErrReleaseMismatch means that a manifest given to PostRender was rendered
// for another release name or namespace than the resource's: the operator
// names the release after the resource and installs it in its namespace.
var ErrReleaseMismatch = errors.New("the manifest was rendered for another release than the resource's")

// PostRender runs the operator's post-renderers, with their configuration
// from the embedded watches.yaml and then the engine's built-ins (standard
// labels, ownership), over the manifest rendered by Helm for the one
// resource in cr, and returns the manifest the operator would apply. It is
// what `orchestra post-render` does as Helm's --post-renderer. Secrets that
// the chart does not render are not read, as in Template.
func (p *Renderer) PostRender(ctx context.Context, cr io.Reader, manifest []byte, opts Options) ([]byte, error) {
	obj, ctx, err := p.decodeOne(ctx, cr, opts)
	if err != nil {
		return nil, err
	}
	entry, valid, err := p.prepare(ctx, obj, opts)
	if err != nil {
		return nil, err
	}
	objs, err := render.ParseManifest(string(manifest))
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		instance := o.GetLabels()[render.LabelInstance]
		if ns := o.GetNamespace(); (ns != "" && ns != valid.GetNamespace()) || (instance != "" && instance != valid.GetName()) {
			return nil, fmt.Errorf("%w: %s %s is in namespace %q of release %q, but %s is %s/%s (run helm template %s ... -n %s)",
				ErrReleaseMismatch, o.GetKind(), o.GetName(), ns, instance, valid.GetKind(), valid.GetNamespace(), valid.GetName(), valid.GetName(), valid.GetNamespace())
		}
	}
	out, err := render.NewPostRenderer(ctx, entry, valid, render.Options{}).Run(bytes.NewBuffer(manifest))
	if err != nil {
		return nil, fmt.Errorf("post-rendering %s/%s: %w", valid.GetNamespace(), valid.GetName(), err)
	}
	return out.Bytes(), nil
}

// decodeOne reads the one resource of a YAML or JSON stream, beside the
// policies it may reference (see split).
func (p *Renderer) decodeOne(ctx context.Context, r io.Reader, opts Options) (*unstructured.Unstructured, context.Context, error) {
	all, err := decode(r)
	if err != nil {
		return nil, nil, err
	}
	objs, ctx, err := p.split(ctx, all, opts)
	if err != nil {
		return nil, nil, err
	}
	if len(objs) != 1 {
		return nil, nil, fmt.Errorf("%w: the input holds %d resources; give one (a Helm release renders one)", ErrNotOne, len(objs))
	}
	return objs[0], ctx, nil
}

// split validates the documents of the kinds that render nothing
// (CheckpointPolicy, ModelCheckpoint) against their CRDs and returns the
// others, to render, with a context whose reader serves the
// CheckpointPolicies to the values translator.
func (p *Renderer) split(ctx context.Context, all []*unstructured.Unstructured, opts Options) ([]*unstructured.Unstructured, context.Context, error) {
	var render []*unstructured.Unstructured
	policies := orchestra.PolicyDocuments{}
	for _, obj := range all {
		v := p.others[obj.GetKind()]
		if v == nil || obj.GroupVersionKind().Group != orchestra.CheckpointPolicyGVK.Group {
			render = append(render, obj)
			continue
		}
		obj = obj.DeepCopy()
		if obj.GetNamespace() == "" {
			obj.SetNamespace(namespaceOr(opts.Namespace))
		}
		valid, err := v.Validate(ctx, obj)
		if err != nil {
			return nil, nil, err
		}
		if valid.GroupVersionKind() == orchestra.CheckpointPolicyGVK {
			policies[client.ObjectKeyFromObject(valid)] = valid
		}
	}
	if len(render) == 0 {
		return nil, nil, ErrNoResource
	}
	return render, plugin.WithReader(ctx, policies), nil
}

func namespaceOr(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

func (p *Renderer) templateOne(ctx context.Context, obj *unstructured.Unstructured, opts Options) (string, error) {
	res, _, err := p.Render(ctx, obj, opts)
	if err != nil {
		return "", err
	}
	return render.FormatManifest(res.Objects)
}

func (p *Renderer) entry(obj *unstructured.Unstructured) (*watches.Entry, error) {
	gvk := obj.GroupVersionKind()
	for i := range p.entries {
		if p.entries[i].GVK == gvk {
			return &p.entries[i], nil
		}
	}
	return nil, fmt.Errorf("watches.yaml serves no %s", gvk)
}

// decode reads every document of a YAML or JSON stream; empty documents
// are skipped. Numbers decode as the API server decodes them: whole numbers
// as int64.
func decode(r io.Reader) ([]*unstructured.Unstructured, error) {
	docs := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", i, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
			continue
		}
		var m map[string]any
		if err := utiljson.Unmarshal(js, &m); err != nil {
			return nil, fmt.Errorf("document %d: want an object: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	if len(out) == 0 {
		return nil, ErrNoResource
	}
	return out, nil
}

// TemplateBytes is Template over a byte slice.
func (p *Renderer) TemplateBytes(ctx context.Context, data []byte, opts Options) (string, error) {
	return p.Template(ctx, bytes.NewReader(data), opts)
}
