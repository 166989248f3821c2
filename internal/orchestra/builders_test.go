package orchestra

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/yaml"
)

// Small builders for the plugin tests.

// fromYAML builds an object from YAML.
func fromYAML(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	var m map[string]any
	if err := utiljson.Unmarshal(js, &m); err != nil {
		t.Fatalf("fixture: %v", err)
	}
	return &unstructured.Unstructured{Object: m}
}

// oneApp is the spec of a ModelOrchestra with one application.
const oneApp = `{applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`

// owner builds a ModelOrchestra named demo in namespace ns; spec is a
// YAML flow mapping.
func owner(t *testing.T, spec string) *unstructured.Unstructured {
	t.Helper()
	return fromYAML(t, "apiVersion: modelorchestra.io/v1alpha1\nkind: ModelOrchestra\nmetadata: {name: demo, namespace: ns, generation: 3}\nspec: "+spec+"\n")
}

// workload builds a Deployment (or another kind) whose pod template is the
// given PodTemplateSpec.
func workload(t *testing.T, kind, name string, tmpl corev1.PodTemplateSpec) *unstructured.Unstructured {
	t.Helper()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tmpl)
	if err != nil {
		t.Fatal(err)
	}
	delete(raw["metadata"].(map[string]any), "creationTimestamp")
	apiVersion := "apps/v1"
	spec := map[string]any{"template": raw}
	if kind == "Job" {
		apiVersion = "batch/v1"
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       kind,
		"metadata":   map[string]any{"name": name, "namespace": "ns"},
		"spec":       spec,
	}}
}

func pod(containers ...corev1.Container) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: containers}}
}

func configMap(name string, data map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": "ns"},
		"data":     data,
	}}
}

// template decodes the pod template of a rendered workload.
func template(t *testing.T, obj *unstructured.Unstructured) corev1.PodTemplateSpec {
	t.Helper()
	pt, err := podTemplateOf(obj)
	if err != nil || pt == nil {
		t.Fatalf("pod template of %s: %v", obj.GetName(), err)
	}
	return pt.tmpl
}

type unstructuredT = unstructured.Unstructured
