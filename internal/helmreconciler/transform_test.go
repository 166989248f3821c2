package helmreconciler

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestStripManagedFields(t *testing.T) {
	strip := StripManagedFields()
	entry := []any{map[string]any{"manager": "kubectl", "operation": "Update", "fieldsV1": map[string]any{"f:spec": map[string]any{}}}}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.modelorchestra.io/v1", "kind": "Sample",
		"metadata": map[string]any{"name": "a", "namespace": "ns", "labels": map[string]any{"x": "y"}, "managedFields": entry},
		"spec":     map[string]any{"greeting": "hi"},
	}}
	out, err := strip(u)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*unstructured.Unstructured)
	if _, ok := got.Object["metadata"].(map[string]any)["managedFields"]; ok {
		t.Error("unstructured object kept managedFields")
	}
	if got.GetName() != "a" || got.GetNamespace() != "ns" || got.GetLabels()["x"] != "y" || got.Object["spec"] == nil {
		t.Errorf("unstructured object lost more than managedFields: %v", got.Object)
	}
	// No metadata at all: left as it is.
	if _, err := strip(&unstructured.Unstructured{Object: map[string]any{"kind": "Sample"}}); err != nil {
		t.Error(err)
	}

	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	for _, obj := range []metav1.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", ManagedFields: mf}},
		&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "m", ManagedFields: mf}},
	} {
		out, err := strip(obj)
		if err != nil {
			t.Fatal(err)
		}
		if o := out.(metav1.Object); o.GetManagedFields() != nil || o.GetName() == "" {
			t.Errorf("%T: managedFields %v, name %q", o, o.GetManagedFields(), o.GetName())
		}
	}
}
