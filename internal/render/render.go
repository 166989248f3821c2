// Package render is the rendering pipeline of the Helm reconciler engine. The
// operator and the offline preview (orchestra template) both run it, so a
// preview shows exactly what the operator would apply:
//
//  1. values: the custom resource's .spec, or what the entry's values
//     translator returns, with the entry's overrideValues set on top;
//  2. the chart's values.schema.json validates the coalesced values;
//  3. Helm renders the chart (templates, NOTES, hooks kept apart);
//  4. the entry's post-renderers run in order;
//  5. the built-in post-renderers run last: the standard
//     app.kubernetes.io/* labels, then ownership (a controller owner
//     reference, or owner annotations where a reference is not allowed).
//
// The digest of the inputs (values, chart, plugin configuration, operator
// version and owner identity) decides whether a release must be upgraded,
// so that a reconcile with nothing to change renders nothing.
package render

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/version"
	"github.com/model-orchestra/operator/internal/watches"
)

// ErrInvalidValues is wrapped when the values do not match the chart's
// values.schema.json or cannot be built from the custom resource. Retrying
// does not help until the custom resource changes.
var ErrInvalidValues = errors.New("invalid values")

// Options are what the pipeline needs besides the entry and the resource.
type Options struct {
	// Reader reads live objects for the post-renderers; nil offline.
	Reader client.Reader
	// Mapper tells namespaced from cluster-scoped kinds for the ownership
	// built-in. Offline (nil) a table of well-known cluster-scoped kinds is
	// used, and unknown kinds are taken as namespaced.
	Mapper meta.RESTMapper
	// KubeVersion and APIVersions are the capabilities of the offline
	// preview (ForResource); the operator uses the cluster's.
	KubeVersion *chartutil.KubeVersion
	APIVersions []string
}

// Inputs are the values of a custom resource and their digest.
type Inputs struct {
	// Values are the chart values before coalescing with the chart's
	// defaults (what `helm get values` shows).
	Values map[string]any
	// Digest identifies (values, chart, plugin configuration, operator
	// version, owner identity). It is 32 hex characters, so that it also
	// fits a label value.
	Digest string
}

// Prepare computes the values of obj and their digest. It does not render.
func Prepare(ctx context.Context, entry *watches.Entry, obj *unstructured.Unstructured) (Inputs, error) {
	vals, err := Values(ctx, entry, obj)
	if err != nil {
		return Inputs{}, err
	}
	d, err := digest(entry, obj, vals)
	if err != nil {
		return Inputs{}, err
	}
	return Inputs{Values: vals, Digest: d}, nil
}

// Values returns the chart values of obj: the translator's result (or a copy
// of .spec) with the entry's overrideValues set on top; overrides win.
func Values(ctx context.Context, entry *watches.Entry, obj *unstructured.Unstructured) (map[string]any, error) {
	var vals map[string]any
	if entry.Translator != nil {
		v, err := entry.Translator.Translate(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("%w: values translator %q: %w", ErrInvalidValues, entry.TranslatorName, err)
		}
		vals = runtime.DeepCopyJSON(normalise(v))
	} else {
		spec, ok := obj.Object["spec"]
		switch s := spec.(type) {
		case nil:
			vals = map[string]any{}
		case map[string]any:
			vals = runtime.DeepCopyJSON(s)
		default:
			_ = ok
			return nil, fmt.Errorf("%w: .spec is a %T, want an object", ErrInvalidValues, s)
		}
	}
	if vals == nil {
		vals = map[string]any{}
	}
	keys := make([]string, 0, len(entry.OverrideValues))
	for k := range entry.OverrideValues {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := strvals.ParseIntoString(k+"="+escapeSetValue(entry.OverrideValues[k]), vals); err != nil {
			return nil, fmt.Errorf("%w: overrideValues %q: %w", ErrInvalidValues, k, err)
		}
	}
	return vals, nil
}

// Validate checks vals, coalesced with the chart's defaults, against the
// chart's values.schema.json (and its subcharts'). The error names the
// offending field paths.
func Validate(entry *watches.Entry, vals map[string]any) error {
	coalesced, err := chartutil.CoalesceValues(entry.Chart, vals)
	if err != nil {
		return fmt.Errorf("%w: coalescing with chart defaults: %w", ErrInvalidValues, err)
	}
	if err := chartutil.ValidateAgainstSchema(entry.Chart, coalesced); err != nil {
		msg := strings.TrimSpace(strings.ReplaceAll(err.Error(), "\n", " "))
		return fmt.Errorf("%w: values.schema.json of chart %s: %s", ErrInvalidValues, entry.Chart.Name(), msg)
	}
	return nil
}

// Result is a rendered custom resource.
type Result struct {
	Inputs
	// Manifest is the post-rendered manifest, as stored in the release.
	Manifest string
	// Objects are the objects of Manifest, in Helm's install order.
	Objects []*unstructured.Unstructured
	// Notes is the rendered NOTES.txt.
	Notes string
}

// ForResource renders obj offline, exactly as the operator would install it,
// without talking to a cluster (unless opts.Reader does).
func ForResource(ctx context.Context, entry *watches.Entry, obj *unstructured.Unstructured, opts Options) (*Result, error) {
	in, err := Prepare(ctx, entry, obj)
	if err != nil {
		return nil, err
	}
	if err := Validate(entry, in.Values); err != nil {
		return nil, err
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.DisableHooks = true
	install.SkipSchemaValidation = true // validated above, with a better message
	install.ReleaseName = obj.GetName()
	install.Namespace = obj.GetNamespace()
	install.KubeVersion = opts.KubeVersion
	install.APIVersions = opts.APIVersions
	install.PostRenderer = NewPostRenderer(ctx, entry, obj, opts)
	rel, err := install.RunWithContext(ctx, entry.Chart, in.Values)
	if err != nil {
		return nil, fmt.Errorf("rendering chart %s for %s/%s: %w", entry.Chart.Name(), obj.GetNamespace(), obj.GetName(), err)
	}
	objs, err := ParseManifest(rel.Manifest)
	if err != nil {
		return nil, err
	}
	return &Result{Inputs: in, Manifest: rel.Manifest, Objects: objs, Notes: rel.Info.Notes}, nil
}

// digestInput is what the digest covers. Field order is fixed by the struct
// and map keys are sorted by encoding/json, so the encoding is canonical.
type digestInput struct {
	Operator      string          `json:"operator"`
	Chart         string          `json:"chart"`
	Owner         ownerIdentity   `json:"owner"`
	Translator    string          `json:"translator,omitempty"`
	PostRenderers []postRendererC `json:"postRenderers,omitempty"`
	Values        map[string]any  `json:"values"`
}

type ownerIdentity struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	UID        string `json:"uid,omitempty"`
}

type postRendererC struct {
	Name   string          `json:"name"`
	Config json.RawMessage `json:"config,omitempty"`
	// Effective is what a post-renderer's output depends on besides its
	// config (for example the operator's environment), when it says so.
	Effective json.RawMessage `json:"effective,omitempty"`
}

// configDigester is implemented by a post-renderer whose output depends on
// more than its watches.yaml config; the digest then covers that too.
type configDigester interface {
	DigestConfig() json.RawMessage
}

func digest(entry *watches.Entry, obj *unstructured.Unstructured, vals map[string]any) (string, error) {
	in := digestInput{
		Operator:   version.Version,
		Chart:      ChartDigest(entry.Chart),
		Translator: entry.TranslatorName,
		Values:     vals,
		Owner: ownerIdentity{
			APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(),
			Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID()),
		},
	}
	for _, pr := range entry.PostRenderers {
		c := postRendererC{Name: pr.Name, Config: compactJSON(pr.Config)}
		if d, ok := pr.Renderer.(configDigester); ok {
			c.Effective = d.DigestConfig()
		}
		in.PostRenderers = append(in.PostRenderers, c)
	}
	b, err := json.Marshal(in)
	if err != nil {
		return "", fmt.Errorf("%w: encoding values for the digest: %w", ErrInvalidValues, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

var chartDigests sync.Map // *chart.Chart -> string

// ChartDigest returns a digest of everything in c that affects rendering:
// metadata, templates, values, schema, files and dependencies.
func ChartDigest(c *chart.Chart) string {
	if d, ok := chartDigests.Load(c); ok {
		return d.(string)
	}
	h := sha256.New()
	var walk func(c *chart.Chart)
	walk = func(c *chart.Chart) {
		meta, _ := json.Marshal(c.Metadata)
		writeField(h, "metadata", meta)
		writeField(h, "schema", c.Schema)
		vals, _ := json.Marshal(c.Values)
		writeField(h, "values", vals)
		for _, group := range [][]*chart.File{c.Templates, c.Files} {
			files := append([]*chart.File(nil), group...)
			sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
			for _, f := range files {
				writeField(h, "file:"+f.Name, f.Data)
			}
		}
		deps := append([]*chart.Chart(nil), c.Dependencies()...)
		sort.Slice(deps, func(i, j int) bool { return deps[i].Name() < deps[j].Name() })
		for _, d := range deps {
			writeField(h, "dependency", []byte(d.Name()))
			walk(d)
		}
	}
	walk(c)
	d := hex.EncodeToString(h.Sum(nil))
	chartDigests.Store(c, d)
	return d
}

func writeField(h interface{ Write([]byte) (int, error) }, name string, data []byte) {
	_, _ = fmt.Fprintf(h, "%s:%d:", name, len(data)) // a hash never fails to write
	_, _ = h.Write(data)
}

func compactJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// escapeSetValue escapes the characters that --set syntax gives a meaning
// to inside a value, so that an override value is taken literally.
func escapeSetValue(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `,`, `\,`)
	return r.Replace(v)
}

// normalise makes a translator's result JSON-compatible (for example int to
// int64), so that the digest and Helm see the same values.
func normalise(v map[string]any) map[string]any {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return v
	}
	return jsonNumbers(out).(map[string]any)
}

// jsonNumbers turns float64 values that are whole numbers into int64, as the
// Kubernetes JSON decoder does for custom resources.
func jsonNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = jsonNumbers(e)
		}
		return t
	case []any:
		for i, e := range t {
			t[i] = jsonNumbers(e)
		}
		return t
	case float64:
		if t == float64(int64(t)) {
			return int64(t)
		}
		return t
	default:
		return v
	}
}
