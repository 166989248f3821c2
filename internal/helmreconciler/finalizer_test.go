package helmreconciler

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func TestCollectedWith(t *testing.T) {
	configMap := schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	clusterRole := schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(configMap, meta.RESTScopeNamespace)
	mapper.Add(clusterRole, meta.RESTScopeRoot)

	owner := &unstructured.Unstructured{}
	owner.SetAPIVersion("test.modelorchestra.io/v1")
	owner.SetKind("Sample")
	owner.SetNamespace("team")
	owner.SetName("demo")
	owner.SetUID("uid-1")
	ref := func(uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "test.modelorchestra.io/v1", Kind: "Sample", Name: "demo", UID: types.UID(uid), Controller: ptr(true)}}
	}
	object := func(gvk schema.GroupVersionKind, ns string, refs []metav1.OwnerReference, annotations map[string]string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(gvk)
		o.SetNamespace(ns)
		o.SetName("x")
		o.SetOwnerReferences(refs)
		o.SetAnnotations(annotations)
		return o
	}
	notController := ref("uid-1")
	notController[0].Controller = nil
	for _, tc := range []struct {
		name string
		o    *unstructured.Unstructured
		want bool
	}{
		{"namespaced, owned", object(configMap, "team", ref("uid-1"), nil), true},
		{"namespaced, owned, namespace left to Helm", object(configMap, "", ref("uid-1"), nil), true},
		{"no owner reference", object(configMap, "team", nil, nil), false},
		{"owner reference not the controller", object(configMap, "team", notController, nil), false},
		{"another resource's", object(configMap, "team", ref("uid-2"), nil), false},
		{"another namespace", object(configMap, "other", ref("uid-1"), nil), false},
		{"cluster-scoped", object(clusterRole, "", ref("uid-1"), nil), false},
		{"kept by resource-policy", object(clusterRole, "", nil, map[string]string{"helm.sh/resource-policy": "keep"}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := collectedWith(tc.o, owner, mapper); got != tc.want {
				t.Errorf("collectedWith = %v, want %v", got, tc.want)
			}
		})
	}
}
