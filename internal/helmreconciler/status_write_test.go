package helmreconciler

import (
	"context"
	"errors"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/model-orchestra/operator/internal/watches"
)

// A reconcile writes the status once, after the finalizer is on; when the
// finalizer cannot be added, it reports that error and writes no status.
// (An invalid reconcile-period annotation is the shortest path past the
// finalizer to a status write: no Helm action runs. uninstall-wait makes
// the reconcile add the finalizer before it knows the release.)
func TestStatusIsWrittenOnceAfterTheFinalizer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		patchErr   error
		wantWrites int
		wantErr    string
	}{
		{name: "finalizer added", wantWrites: 1},
		{name: "finalizer patch fails", patchErr: errors.New("denied"), wantErr: "adding finalizer: denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gvk := schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}
			cr := &unstructured.Unstructured{}
			cr.SetGroupVersionKind(gvk)
			cr.SetNamespace("ns")
			cr.SetName("period")
			cr.SetAnnotations(map[string]string{AnnotationReconcilePeriod: "often", AnnotationUninstallWait: "true"})

			writes := 0
			c := fake.NewClientBuilder().WithScheme(runtime.NewScheme()).WithObjects(cr).WithStatusSubresource(cr).
				WithInterceptorFuncs(interceptor.Funcs{
					Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
						if tc.patchErr != nil {
							return tc.patchErr
						}
						return c.Patch(ctx, obj, patch, opts...)
					},
					SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
						writes++
						return c.SubResource(sub).Update(ctx, obj, opts...)
					},
				}).Build()
			r := &Reconciler{
				entry:  &watches.Entry{GVK: gvk, Chart: &chart.Chart{Metadata: &chart.Metadata{Name: "small"}}},
				client: c,
			}
			req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "period"}}

			_, err := r.Reconcile(context.Background(), req)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Reconcile returned %v, want %q", err, tc.wantErr)
			}
			if writes != tc.wantWrites {
				t.Errorf("%d status writes, want %d", writes, tc.wantWrites)
			}
			if tc.wantWrites == 0 {
				return
			}
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(gvk)
			if err := c.Get(context.Background(), req.NamespacedName, got); err != nil {
				t.Fatal(err)
			}
			if !controllerutil.ContainsFinalizer(got, Finalizer) {
				t.Errorf("finalizers %v, want %s", got.GetFinalizers(), Finalizer)
			}
			if st := statusFrom(got); !st.isTrue(TypeIrreconcilable) || !strings.Contains(conditionMessage(st, TypeIrreconcilable), AnnotationReconcilePeriod) {
				t.Errorf("status %v, want Irreconcilable naming %s", got.Object["status"], AnnotationReconcilePeriod)
			}
		})
	}
}
