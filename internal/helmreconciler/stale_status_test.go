package helmreconciler

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/model-orchestra/operator/internal/watches"
)

// A status write that finds a newer resource than the cached copy the
// reconcile read (the usual case: the engine's own last status write has
// not reached the cache yet) is retried shortly, and is not a reconcile
// error: no error log, no failure in the metrics, no backoff.
func TestStaleStatusWriteIsRetriedNotFailed(t *testing.T) {
	gvk := schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}
	cr := &unstructured.Unstructured{}
	cr.SetGroupVersionKind(gvk)
	cr.SetNamespace("ns")
	cr.SetName("stale")
	// Paused: the reconcile only writes the Paused condition, which is the
	// shortest path to a status write.
	cr.SetAnnotations(map[string]string{AnnotationPauseReconcile: "true"})

	conflict := true
	c := fake.NewClientBuilder().WithScheme(runtime.NewScheme()).WithObjects(cr).WithStatusSubresource(cr).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if conflict {
					return apierrors.NewConflict(schema.GroupResource{Group: gvk.Group, Resource: "samples"}, obj.GetName(), nil)
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
		}).Build()
	r := &Reconciler{entry: &watches.Entry{GVK: gvk}, client: c}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "stale"}}

	res, err := r.Reconcile(context.Background(), req)
	if err != nil {
		t.Fatalf("Reconcile returned %v for a stale status write; want a retry without an error", err)
	}
	if res.RequeueAfter != staleStatusRetry {
		t.Errorf("RequeueAfter = %v, want %v", res.RequeueAfter, staleStatusRetry)
	}

	// The retry, with the newer resource, writes the status.
	conflict = false
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(gvk)
	if err := c.Get(context.Background(), req.NamespacedName, got); err != nil {
		t.Fatal(err)
	}
	if st := statusFrom(got); !st.isTrue(TypePaused) {
		t.Errorf("status after the retry: %v", got.Object["status"])
	}
}
