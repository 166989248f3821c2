// Package watches reads watches.yaml: the list of custom resource kinds that
// the Helm reconciler engine serves, each with its chart and plugins.
//
// A watches.yaml file is a YAML list. Each entry has the fields of the
// operator-sdk helm-operator (group, version, kind, chart,
// watchDependentResources, overrideValues, reconcilePeriod,
// maxConcurrentReconciles, selector) and three extensions naming Go plugins
// from a plugin.Registry (valuesTranslator, postRenderers, status).
//
// Loading is strict: an unknown key, an unknown plugin name, a missing chart
// or a duplicate kind is an error that names the file, the entry and the
// field, so that the operator refuses to start rather than misbehave later.
package watches

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/plugin"
)

// Entry is one validated watches.yaml entry, with its chart loaded and its
// plugins resolved.
type Entry struct {
	// GVK is the custom resource kind served by this entry.
	GVK schema.GroupVersionKind
	// ChartName is the chart path as written in watches.yaml.
	ChartName string
	// Chart is the loaded chart.
	Chart *chart.Chart
	// WatchDependentResources makes the engine watch the objects it creates,
	// so that a deleted or edited object is restored promptly.
	WatchDependentResources bool
	// OverrideValues are --set style values (key is a path such as
	// image.repository) applied over the translated values. Environment
	// variables are already expanded; see Parse.
	OverrideValues map[string]string
	// ReconcilePeriod is the resync period; zero means the manager default.
	ReconcilePeriod time.Duration
	// MaxConcurrentReconciles is the number of workers; zero means the
	// manager default.
	MaxConcurrentReconciles int
	// Selector restricts the custom resources served by this entry. It is
	// nil when watches.yaml sets none (every object matches).
	Selector labels.Selector
	// LabelSelector is Selector as written in watches.yaml.
	LabelSelector *metav1.LabelSelector

	// TranslatorName names the values translator ("" = use .spec).
	TranslatorName string
	// Translator turns the custom resource into values; nil = use .spec.
	Translator plugin.Translator
	// PostRenderers run in order after rendering, before the built-ins.
	PostRenderers []PostRenderer
	// StatusName names the status plugin ("" = none).
	StatusName string
	// Status derives extra status fields; nil = none.
	Status plugin.StatusPlugin

	// Source locates the entry for messages, e.g.
	// `watches.yaml: entry 0 (ModelOrchestra.modelorchestra.io)`.
	Source string
}

// PostRenderer is one configured post-renderer of an entry.
type PostRenderer struct {
	Name     string
	Config   json.RawMessage
	Renderer plugin.PostRenderer
}

// rawEntry is the on-disk shape of an entry.
type rawEntry struct {
	Group                   string                `json:"group"`
	Version                 string                `json:"version"`
	Kind                    string                `json:"kind"`
	Chart                   string                `json:"chart"`
	WatchDependentResources *bool                 `json:"watchDependentResources,omitempty"`
	OverrideValues          map[string]string     `json:"overrideValues,omitempty"`
	ReconcilePeriod         *metav1.Duration      `json:"reconcilePeriod,omitempty"`
	MaxConcurrentReconciles *int                  `json:"maxConcurrentReconciles,omitempty"`
	Selector                *metav1.LabelSelector `json:"selector,omitempty"`
	ValuesTranslator        string                `json:"valuesTranslator,omitempty"`
	PostRenderers           []rawPostRenderer     `json:"postRenderers,omitempty"`
	Status                  string                `json:"status,omitempty"`
}

type rawPostRenderer struct {
	Name   string          `json:"name"`
	Config json.RawMessage `json:"config,omitempty"`
}

// ErrInvalid is wrapped by every validation error of Load and Parse.
var ErrInvalid = errors.New("invalid watches file")

// Load reads the watches file at path. Charts named by its entries are
// loaded from charts; plugins are resolved in reg.
func Load(path string, charts fs.FS, reg *plugin.Registry) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading watches file: %w", err)
	}
	return Parse(path, data, charts, reg)
}

// Parse validates data, the content of the watches file called source.
//
// overrideValues are expanded from the environment ($VAR or ${VAR}). An
// override whose value expands to the empty string because a variable it
// names is unset is dropped, so that the chart default applies: an operator
// run outside OLM (no RELATED_IMAGE_* variables) keeps working images
// instead of empty ones.
func Parse(source string, data []byte, charts fs.FS, reg *plugin.Registry) ([]Entry, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, source, err)
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(js, &raws); err != nil {
		return nil, fmt.Errorf("%w: %s: want a YAML list of entries: %w", ErrInvalid, source, err)
	}
	if len(raws) == 0 {
		return nil, fmt.Errorf("%w: %s: no entries", ErrInvalid, source)
	}

	entries := make([]Entry, 0, len(raws))
	seen := map[schema.GroupVersionKind]int{}
	for i, raw := range raws {
		e, err := parseEntry(source, i, raw, charts, reg)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[e.GVK]; dup {
			return nil, fmt.Errorf("%w: %s: entry %d: duplicate group/version/kind %s (also entry %d)", ErrInvalid, source, i, e.GVK, j)
		}
		seen[e.GVK] = i
		entries = append(entries, e)
	}
	return entries, nil
}

func parseEntry(source string, i int, raw json.RawMessage, charts fs.FS, reg *plugin.Registry) (Entry, error) {
	fail := func(field, format string, args ...any) (Entry, error) {
		return Entry{}, fmt.Errorf("%w: %s: entry %d: field %s: %s", ErrInvalid, source, i, field, fmt.Sprintf(format, args...))
	}

	var r rawEntry
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		field := "(entry)"
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return fail(strings.Trim(name, `"`), "unknown field")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field = te.Field
		}
		return fail(field, "%v", err)
	}

	e := Entry{
		GVK:                     schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind},
		ChartName:               r.Chart,
		WatchDependentResources: r.WatchDependentResources == nil || *r.WatchDependentResources,
		LabelSelector:           r.Selector,
		TranslatorName:          r.ValuesTranslator,
		StatusName:              r.Status,
	}
	e.Source = fmt.Sprintf("%s: entry %d (%s)", source, i, e.GVK.GroupKind())

	if r.Version == "" {
		return fail("version", "must not be empty")
	}
	if r.Kind == "" {
		return fail("kind", "must not be empty")
	}
	if r.Chart == "" {
		return fail("chart", "must not be empty")
	}
	if charts == nil {
		return fail("chart", "no charts source to load %q from", r.Chart)
	}
	c, err := LoadChart(charts, r.Chart)
	if err != nil {
		return fail("chart", "%v", err)
	}
	e.Chart = c

	if r.ReconcilePeriod != nil {
		if r.ReconcilePeriod.Duration < 0 {
			return fail("reconcilePeriod", "must not be negative, got %s", r.ReconcilePeriod.Duration)
		}
		e.ReconcilePeriod = r.ReconcilePeriod.Duration
	}
	if r.MaxConcurrentReconciles != nil {
		if *r.MaxConcurrentReconciles < 1 {
			return fail("maxConcurrentReconciles", "must be at least 1, got %d", *r.MaxConcurrentReconciles)
		}
		e.MaxConcurrentReconciles = *r.MaxConcurrentReconciles
	}
	if r.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(r.Selector)
		if err != nil {
			return fail("selector", "%v", err)
		}
		e.Selector = sel
	}

	if len(r.OverrideValues) > 0 {
		e.OverrideValues = map[string]string{}
		keys := make([]string, 0, len(r.OverrideValues))
		for k := range r.OverrideValues {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "" {
				return fail("overrideValues", "empty key")
			}
			if v, ok := expandEnv(r.OverrideValues[k]); ok {
				e.OverrideValues[k] = v
			}
		}
	}

	if r.ValuesTranslator != "" {
		t, err := reg.Translator(r.ValuesTranslator)
		if err != nil {
			return fail("valuesTranslator", "%v", err)
		}
		e.Translator = t
	}
	for j, pr := range r.PostRenderers {
		field := fmt.Sprintf("postRenderers[%d]", j)
		if pr.Name == "" {
			return fail(field+".name", "must not be empty")
		}
		factory, err := reg.PostRenderer(pr.Name)
		if err != nil {
			return fail(field+".name", "%v", err)
		}
		var cfg json.RawMessage
		if len(pr.Config) > 0 && string(pr.Config) != "null" {
			cfg = pr.Config
		}
		renderer, err := factory(cfg)
		if err != nil {
			return fail(field+".config", "post-renderer %q: %v", pr.Name, err)
		}
		e.PostRenderers = append(e.PostRenderers, PostRenderer{Name: pr.Name, Config: cfg, Renderer: renderer})
	}
	if r.Status != "" {
		s, err := reg.Status(r.Status)
		if err != nil {
			return fail("status", "%v", err)
		}
		e.Status = s
	}
	return e, nil
}

// expandEnv expands $VAR and ${VAR} in s. It reports false when the result
// is empty because a variable that s names is unset.
func expandEnv(s string) (string, bool) {
	missing := false
	out := os.Expand(s, func(name string) string {
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = true
		}
		return v
	})
	return out, out != "" || !missing
}
