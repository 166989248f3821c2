package helmreconciler

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// objectKey identifies one object of a release.
type objectKey struct {
	GVK       schema.GroupVersionKind
	Namespace string
	Name      string
}

func (k objectKey) String() string {
	if k.Namespace == "" {
		return fmt.Sprintf("%s %s", k.GVK.Kind, k.Name)
	}
	return fmt.Sprintf("%s %s/%s", k.GVK.Kind, k.Namespace, k.Name)
}

func keyOf(o *unstructured.Unstructured) objectKey {
	return objectKey{GVK: o.GroupVersionKind(), Namespace: o.GetNamespace(), Name: o.GetName()}
}

func (k objectKey) namespacedName() types.NamespacedName {
	return types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
}

// Helm's ownership metadata, which it sets on every object it applies.
const (
	helmReleaseNameAnnotation      = "meta.helm.sh/release-name"
	helmReleaseNamespaceAnnotation = "meta.helm.sh/release-namespace"
)

// desiredObjects turns a release manifest into the objects as Helm applies
// them: namespaced objects without a namespace get the release's, and Helm's
// ownership metadata is added.
func desiredObjects(objs []*unstructured.Unstructured, release, namespace string, mapper meta.RESTMapper) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		o = o.DeepCopy()
		gvk := o.GroupVersionKind()
		if o.GetNamespace() == "" {
			if m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err == nil && m.Scope.Name() == meta.RESTScopeNameNamespace {
				o.SetNamespace(namespace)
			}
		}
		l := o.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l[LabelManagedBy] = ManagedByHelm
		o.SetLabels(l)
		a := o.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[helmReleaseNameAnnotation] = release
		a[helmReleaseNamespaceAnnotation] = namespace
		o.SetAnnotations(a)
		out = append(out, o)
	}
	return out
}

// contains reports whether every field set in want has the same value in
// have. Fields that only have (defaults, other writers) sets are ignored;
// lists must have the same length, element by element.
func contains(want, have any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return len(w) == 0 && have == nil
		}
		for k, wv := range w {
			hv, ok := h[k]
			if !ok {
				if isEmpty(wv) {
					continue
				}
				return false
			}
			if !contains(wv, hv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok {
			return len(w) == 0 && have == nil
		}
		if len(w) != len(h) {
			return false
		}
		for i := range w {
			if !contains(w[i], h[i]) {
				return false
			}
		}
		return true
	case nil:
		return true
	case int64:
		return numberEqual(float64(w), have)
	case float64:
		return numberEqual(w, have)
	default:
		return want == have
	}
}

func numberEqual(w float64, have any) bool {
	switch h := have.(type) {
	case int64:
		return float64(h) == w
	case float64:
		return h == w
	}
	return false
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	case string:
		return t == ""
	}
	return false
}

// adoptServerForms replaces each desired object that the last Helm action
// created with the server's form of it (see serverShape), verified at the
// resource version of the server's answer. The first drift check then
// compares like with like instead of applying the object to learn its form.
func (rs *releaseState) adoptServerForms(forms *serverForms) {
	for i, want := range rs.desired {
		key := keyOf(want)
		got, ok := forms.get(key)
		if !ok {
			continue
		}
		rs.desired[i] = &unstructured.Unstructured{Object: serverShape(want.Object, got.Object).(map[string]any)}
		rs.verified[key] = got.GetResourceVersion()
	}
}

// serverShape is want with each value replaced by the server's version of
// it in applied, the server's answer to applying want: fields the server
// left out (zero values of omitempty fields) are dropped, scalars take the
// server's value (defaults filled in, normalised quantities, admission
// changes), and a list the server changed in length is the server's list.
// Fields only the server has stay out, as in want.
func serverShape(want, applied any) any {
	switch w := want.(type) {
	case map[string]any:
		a, ok := applied.(map[string]any)
		if !ok {
			return want
		}
		out := make(map[string]any, len(w))
		for k, wv := range w {
			if av, ok := a[k]; ok {
				out[k] = serverShape(wv, av)
			}
		}
		return out
	case []any:
		a, ok := applied.([]any)
		if !ok {
			return want
		}
		if len(a) != len(w) {
			return runtime.DeepCopyJSONValue(a)
		}
		out := make([]any, len(w))
		for i := range w {
			out[i] = serverShape(w[i], a[i])
		}
		return out
	default:
		return runtime.DeepCopyJSONValue(applied)
	}
}

// repairDrift restores owned objects that were deleted or changed, applying
// only the fields of the manifest (server-side apply), so that fields other
// writers set survive. It returns the live objects and what it restored.
func (r *Reconciler) repairDrift(ctx context.Context, obj *unstructured.Unstructured, rs *releaseState, repair bool) ([]*unstructured.Unstructured, []string, error) {
	if r.entry.WatchDependentResources {
		if err := r.watchDependents(rs.desired); err != nil {
			return nil, nil, err
		}
	}
	var live []*unstructured.Unstructured
	var repaired []string
	for i, want := range rs.desired {
		key := keyOf(want)
		have := &unstructured.Unstructured{}
		have.SetGroupVersionKind(key.GVK)
		err := r.client.Get(ctx, key.namespacedName(), have)
		if err != nil && !apierrors.IsNotFound(err) {
			// Outside the cache's namespaces: read directly.
			err = r.reader.Get(ctx, key.namespacedName(), have)
		}
		switch {
		case apierrors.IsNotFound(err):
			if !repair {
				continue
			}
		case err != nil:
			return nil, nil, fmt.Errorf("reading %s: %w", key, err)
		case !repair:
			live = append(live, have)
			continue
		case rs.verified[key] == have.GetResourceVersion():
			live = append(live, have)
			continue
		case contains(want.Object, have.Object):
			rs.verified[key] = have.GetResourceVersion()
			live = append(live, have)
			continue
		}
		applied := want.DeepCopy()
		if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			return nil, nil, fmt.Errorf("restoring %s: %w", key, err)
		}
		rs.verified[key] = applied.GetResourceVersion()
		live = append(live, applied)
		// From now on compare with what the server made of the desired
		// object (zero values it leaves out, defaults it fills in, what
		// admission changed): that is not drift, and without this every
		// change of the object's status would re-apply it.
		serverForm := &unstructured.Unstructured{Object: serverShape(want.Object, applied.Object).(map[string]any)}
		rs.desired[i] = serverForm
		if have.GetResourceVersion() != "" && contains(serverForm.Object, have.Object) {
			continue // the live object already was the server's form
		}
		repaired = append(repaired, key.String())
	}
	return live, repaired, nil
}
