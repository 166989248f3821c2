package watches_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/watches"
)

type nopRenderer struct{}

func (nopRenderer) PostRender(_ context.Context, _ plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	return objs, nil
}

func registry() *plugin.Registry {
	reg := plugin.NewRegistry()
	reg.RegisterTranslator("t", plugin.TranslatorFunc(func(context.Context, *unstructured.Unstructured) (map[string]any, error) { return nil, nil }))
	reg.RegisterPostRenderer("p", func(cfg json.RawMessage) (plugin.PostRenderer, error) {
		if cfg != nil {
			var c struct{ Fail bool }
			if err := json.Unmarshal(cfg, &c); err != nil || c.Fail {
				return nil, errors.New("bad config")
			}
		}
		return nopRenderer{}, nil
	})
	return reg
}

func TestParseDefaultsAndFields(t *testing.T) {
	t.Setenv("RELATED_IMAGE_APP", "img@sha256:1")
	data := `
- group: test.modelorchestra.io
  version: v1
  kind: Sample
  chart: sample
  overrideValues:
    image: ${RELATED_IMAGE_APP}
    other: $RELATED_IMAGE_UNSET
    literal: plain
  reconcilePeriod: 2m
  maxConcurrentReconciles: 3
  selector: {matchLabels: {tier: gold}}
  valuesTranslator: t
  postRenderers: [{name: p}, {name: p, config: {fail: false}}]
- version: v2
  kind: Other
  chart: sample
  watchDependentResources: false
`
	entries, err := watches.Parse("w.yaml", []byte(data), os.DirFS("testdata/charts"), registry())
	if err != nil {
		t.Fatal(err)
	}
	e := entries[0]
	if e.GVK != (schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}) {
		t.Errorf("GVK = %v", e.GVK)
	}
	if !e.WatchDependentResources || entries[1].WatchDependentResources {
		t.Errorf("watchDependentResources = %v, %v; want default true, then the explicit false", e.WatchDependentResources, entries[1].WatchDependentResources)
	}
	want := map[string]string{"image": "img@sha256:1", "literal": "plain"}
	if len(e.OverrideValues) != len(want) || e.OverrideValues["image"] != want["image"] || e.OverrideValues["literal"] != "plain" {
		t.Errorf("overrideValues = %v, want %v (an override of an unset variable is dropped)", e.OverrideValues, want)
	}
	if e.ReconcilePeriod != 2*time.Minute || e.MaxConcurrentReconciles != 3 {
		t.Errorf("reconcilePeriod, maxConcurrentReconciles = %v, %d", e.ReconcilePeriod, e.MaxConcurrentReconciles)
	}
	if !e.Selector.Matches(labels.Set{"tier": "gold"}) || e.Selector.Matches(labels.Set{"tier": "iron"}) {
		t.Errorf("selector %v does not select tier=gold only", e.Selector)
	}
	if e.Translator == nil || len(e.PostRenderers) != 2 || e.Chart.Name() != "sample" {
		t.Errorf("plugins or chart not resolved: %+v", e)
	}
	if entries[1].Selector != nil {
		t.Errorf("entry without selector got %v", entries[1].Selector)
	}
}

func TestParseRefuses(t *testing.T) {
	head := "- {group: g.io, version: v1, kind: K, chart: sample"
	tests := []struct {
		name, data string
		want       []string
	}{
		{"unknown key", head + ", chrat: x}", []string{"w.yaml", "entry 0", "chrat", "unknown field"}},
		{"unknown translator", head + ", valuesTranslator: nope}", []string{"entry 0", "valuesTranslator", `"nope"`, "unknown plugin"}},
		{"unknown post-renderer", head + ", postRenderers: [{name: p}, {name: nope}]}", []string{"postRenderers[1].name", "nope"}},
		{"bad post-renderer config", head + ", postRenderers: [{name: p, config: {fail: true}}]}", []string{"postRenderers[0].config", "bad config"}},
		{"unknown status", head + ", status: nope}", []string{"field status", "nope"}},
		{"missing chart", "- {group: g.io, version: v1, kind: K, chart: absent}", []string{"entry 0", "field chart", "absent"}},
		{"empty chart", "- {group: g.io, version: v1, kind: K}", []string{"field chart", "must not be empty"}},
		{"duplicate GVK", head + "}\n" + head + "}", []string{"entry 1", "duplicate", "entry 0"}},
		{"bad selector", head + ", selector: {matchExpressions: [{key: a, operator: Bogus}]}}", []string{"field selector"}},
		{"bad workers", head + ", maxConcurrentReconciles: 0}", []string{"maxConcurrentReconciles"}},
		{"wrong type", head + ", reconcilePeriod: forever}", []string{"entry 0"}},
		{"not a list", "group: g.io", []string{"list"}},
		{"empty", "[]", []string{"no entries"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := watches.Parse("w.yaml", []byte(tc.data), os.DirFS("testdata/charts"), registry())
			if !errors.Is(err, watches.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLoadFromDiskAndArchive(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "watches.yaml")
	if err := os.WriteFile(path, []byte("- {version: v1, kind: K, chart: ./sample/}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err := watches.Load(path, os.DirFS("testdata/charts"), registry())
	if err != nil {
		t.Fatal(err)
	}
	if got := entries[0].Chart.Metadata.Version; got != "0.1.0" {
		t.Errorf("chart version = %q", got)
	}
	if len(entries[0].Chart.Templates) == 0 || entries[0].Chart.Schema == nil {
		t.Error("chart templates or schema not loaded from the fs.FS")
	}
	if _, err := watches.Load(filepath.Join(dir, "missing.yaml"), os.DirFS("testdata/charts"), registry()); err == nil {
		t.Error("missing watches file accepted")
	}
}
