package render_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/render"
	"github.com/model-orchestra/operator/internal/watches"
)

func loadEntry(t *testing.T, yaml string) *watches.Entry {
	t.Helper()
	entries, err := watches.Parse("watches.yaml", []byte(yaml), os.DirFS("testdata/charts"), newRegistry())
	if err != nil {
		t.Fatalf("parsing watches: %v", err)
	}
	return &entries[0]
}

func sampleCR(spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.modelorchestra.io/v1",
		"kind":       "Sample",
		"metadata":   map[string]any{"name": "demo", "namespace": "team-a", "uid": "1111-2222"},
	}}
	if spec != nil {
		u.Object["spec"] = spec
	}
	return u
}

const plainWatch = `
- group: test.modelorchestra.io
  version: v1
  kind: Sample
  chart: sample
`

func byKind(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		m[o.GetKind()] = o
	}
	return m
}

func TestForResourceBuiltins(t *testing.T) {
	entry := loadEntry(t, plainWatch)
	res, err := render.ForResource(context.Background(), entry, sampleCR(map[string]any{"greeting": "hi"}), render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	objs := byKind(res.Objects)
	if len(res.Objects) != 3 {
		t.Fatalf("got %d objects, want ConfigMap, Deployment, ClusterRole", len(res.Objects))
	}
	if got := objs["ConfigMap"].Object["data"]; !cmp.Equal(got, map[string]any{"greeting": "hi"}) {
		t.Errorf("ConfigMap data = %v, want the spec's greeting", got)
	}

	wantLabels := map[string]string{
		render.LabelInstance:  "demo",
		render.LabelManagedBy: render.ManagedBy,
		render.LabelName:      "sample",
		render.LabelVersion:   "1.2.3",
	}
	if diff := cmp.Diff(wantLabels, objs["ConfigMap"].GetLabels()); diff != "" {
		t.Errorf("ConfigMap labels (-want +got):\n%s", diff)
	}
	if got := objs["Deployment"].GetLabels()[render.LabelComponent]; got != "server" {
		t.Errorf("component label = %q, want the chart's %q kept", got, "server")
	}

	refs := objs["Deployment"].GetOwnerReferences()
	if len(refs) != 1 || refs[0].Kind != "Sample" || refs[0].Name != "demo" || string(refs[0].UID) != "1111-2222" ||
		refs[0].Controller == nil || !*refs[0].Controller {
		t.Errorf("Deployment owner references = %+v, want one controller reference to Sample demo", refs)
	}
	cr := objs["ClusterRole"]
	if len(cr.GetOwnerReferences()) != 0 {
		t.Errorf("cluster-scoped ClusterRole got owner references %v; Kubernetes refuses a namespaced owner", cr.GetOwnerReferences())
	}
	wantAnn := map[string]string{render.AnnotationOwner: "team-a/demo", render.AnnotationOwnerKind: "Sample.test.modelorchestra.io"}
	if diff := cmp.Diff(wantAnn, cr.GetAnnotations()); diff != "" {
		t.Errorf("ClusterRole owner annotations (-want +got):\n%s", diff)
	}
	if !strings.Contains(res.Notes, "demo says hi") {
		t.Errorf("notes = %q", res.Notes)
	}
	// The manifest is what Helm stores; it must parse back to the objects.
	again, err := render.ParseManifest(res.Manifest)
	if err != nil || !cmp.Equal(again, res.Objects) {
		t.Errorf("manifest does not round-trip: %v", err)
	}
}

func TestForResourceUserPostRenderersRunFirstInOrder(t *testing.T) {
	entry := loadEntry(t, plainWatch+`  postRenderers:
    - name: annotate
      config: {key: example.com/first, value: one}
    - name: annotate
      config: {key: example.com/first, value: two}
`)
	res, err := render.ForResource(context.Background(), entry, sampleCR(nil), render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range res.Objects {
		if got := o.GetAnnotations()["example.com/first"]; got != "two/demo" {
			t.Errorf("%s annotation = %q, want the second post-renderer's value", o.GetKind(), got)
		}
	}
	first := entry.PostRenderers[0].Renderer.(*annotate)
	for _, l := range *first.seen {
		if _, ok := l[render.LabelManagedBy]; ok {
			t.Errorf("user post-renderer saw built-in labels %v; built-ins must run last", l)
		}
	}
}

func TestValuesOverridesAndTranslator(t *testing.T) {
	t.Setenv("RELATED_IMAGE_APP", "registry.example/app@sha256:abc")
	entry := loadEntry(t, plainWatch+`  valuesTranslator: greeting
  overrideValues:
    image: $RELATED_IMAGE_APP
    extra.list: "a,b"
    unset: $RELATED_IMAGE_NOT_SET
`)
	got, err := render.Values(context.Background(), entry, sampleCR(map[string]any{"who": "world", "image": "ignored"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"greeting": "hello world",
		"replicas": int64(2),
		"image":    "registry.example/app@sha256:abc",
		"extra":    map[string]any{"list": "a,b"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("values (-want +got):\n%s", diff)
	}

	_, err = render.Values(context.Background(), entry, sampleCR(nil))
	if !errors.Is(err, render.ErrInvalidValues) || !strings.Contains(err.Error(), "spec.who is required") {
		t.Errorf("translator error = %v, want ErrInvalidValues carrying the translator's message", err)
	}
}

func TestSchemaViolationNamesField(t *testing.T) {
	entry := loadEntry(t, plainWatch)
	_, err := render.ForResource(context.Background(), entry, sampleCR(map[string]any{"replicas": "three"}), render.Options{})
	if !errors.Is(err, render.ErrInvalidValues) {
		t.Fatalf("err = %v, want ErrInvalidValues", err)
	}
	if !strings.Contains(err.Error(), "/replicas") {
		t.Errorf("error %q does not name the field path /replicas", err)
	}
}

func TestDigest(t *testing.T) {
	ctx := context.Background()
	entry := loadEntry(t, plainWatch)
	base, err := render.Prepare(ctx, entry, sampleCR(map[string]any{"greeting": "hi"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(base.Digest) != 32 {
		t.Errorf("digest %q is not 32 hex characters (label-value sized)", base.Digest)
	}

	same := sampleCR(map[string]any{"greeting": "hi"})
	same.SetLabels(map[string]string{"unrelated": "label"})
	same.Object["status"] = map[string]any{"observedGeneration": int64(7)}
	tests := []struct {
		name    string
		entry   *watches.Entry
		obj     *unstructured.Unstructured
		changed bool
	}{
		{"labels and status do not count", entry, same, false},
		{"values count", entry, sampleCR(map[string]any{"greeting": "ho"}), true},
		{"post-renderer config counts", loadEntry(t, plainWatch+"  postRenderers: [{name: annotate, config: {key: k}}]\n"), sampleCR(map[string]any{"greeting": "hi"}), true},
		{"overrides count", loadEntry(t, plainWatch+"  overrideValues: {greeting: hi2}\n"), sampleCR(map[string]any{"greeting": "hi"}), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, err := render.Prepare(ctx, tc.entry, tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			if changed := in.Digest != base.Digest; changed != tc.changed {
				t.Errorf("digest changed = %v, want %v", changed, tc.changed)
			}
		})
	}

	t.Run("chart counts", func(t *testing.T) {
		e2 := loadEntry(t, plainWatch)
		e2.Chart.Templates[0].Data = append(e2.Chart.Templates[0].Data, []byte("\n# changed\n")...)
		in, err := render.Prepare(ctx, e2, sampleCR(map[string]any{"greeting": "hi"}))
		if err != nil {
			t.Fatal(err)
		}
		if in.Digest == base.Digest {
			t.Error("digest did not change with the chart")
		}
	})
}
