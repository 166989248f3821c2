package helmreconciler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// The finalizer.
//
// The finalizer makes the deletion of a resource uninstall its release. It
// is needed only for what the garbage collector would not do alone: every
// release Secret carries a controller owner reference to the resource, and
// so does every object of the manifest that can (namespaced, in the
// resource's namespace), so deleting the resource deletes those. The
// finalizer is added, before the first object of a Helm action is written,
// when the release has something else:
//
//   - an object without the resource's owner reference: cluster-scoped, in
//     another namespace, or given its own controller reference by a
//     post-renderer (objects with helm.sh/resource-policy: keep have none,
//     and an uninstall leaves them too, so they need no finalizer);
//   - hooks (a pre-delete or post-delete hook runs only on uninstall, and
//     hook objects are not post-rendered, so they carry no owner
//     reference);
//   - the uninstall-wait annotation, which holds the resource until every
//     object is gone (added at the start of the reconcile).
//
// A release of only owned objects needs none, and a first install of it
// saves the patch. A resource that has the finalizer keeps it. Without it,
// a deletion returns at once and the garbage collector removes the objects
// and the history in the background; a resource created again under the
// same name meanwhile waits until the garbage collector has removed the
// previous one's release (see errPreviousRelease).

// errPreviousRelease: the release Secrets of the resource's name belong to
// a deleted resource of the same name, which the garbage collector is
// removing.
var errPreviousRelease = errors.New("waiting for the garbage collector to remove the release of a deleted resource of the same name")

// previousReleasePoll is how often a resource waiting for the previous
// release of its name to be removed checks again. The removal of that
// release's Secrets also reconciles it (they are watched), so this is a
// fallback.
const previousReleasePoll = 2 * time.Second

// finalizerGate adds the finalizer to one resource, during one reconcile,
// when its release needs it: before the first write of a Helm action
// (beforeWrite), or at once (start).
type finalizerGate struct {
	r   *Reconciler
	ctx context.Context
	obj *unstructured.Unstructured
	// uninstallWait: the resource has the uninstall-wait annotation.
	uninstallWait bool

	mu sync.Mutex
	// patched waits for the patch once it was started; nil before.
	patched func() error
	// objects returns the objects of the manifest the action renders (nil
	// before it rendered); hooks says the release it stores has hooks.
	objects func() []*unstructured.Unstructured
	hooks   bool
}

func (r *Reconciler) newFinalizerGate(ctx context.Context, obj *unstructured.Unstructured) *finalizerGate {
	g := &finalizerGate{r: r, ctx: ctx, obj: obj, uninstallWait: boolAnnotation(obj, AnnotationUninstallWait)}
	if controllerutil.ContainsFinalizer(obj, Finalizer) {
		g.patched = func() error { return nil }
	}
	return g
}

// start starts adding the finalizer unless it is on or being added.
func (g *finalizerGate) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.patched == nil {
		g.patched = g.r.addFinalizer(g.ctx, g.obj)
	}
}

// wait waits for the patch, if one was started, and returns its error. obj
// must not be written before.
func (g *finalizerGate) wait() error {
	g.mu.Lock()
	p := g.patched
	g.mu.Unlock()
	if p == nil {
		return nil
	}
	return p()
}

// rendered tells the gate the objects of the manifest being applied. A nil
// gate ignores it.
func (g *finalizerGate) rendered(objects func() []*unstructured.Unstructured) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.objects = objects
}

// stored tells the gate of a release record being stored.
func (g *finalizerGate) stored(rls *release.Release) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hooks = g.hooks || len(rls.Hooks) > 0
}

// beforeWrite adds the finalizer, if the release needs it, and waits for it.
// Helm calls it (gatedClient) before it creates or updates any object.
func (g *finalizerGate) beforeWrite() error {
	if g.needed() {
		g.start()
	}
	return g.wait()
}

// needed says whether deleting the resource must run an uninstall: when
// the gate knows nothing of the manifest (CRDs of the chart's crds/
// directory are created before it is rendered), it must.
func (g *finalizerGate) needed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hooks || g.objects == nil || g.uninstallWait {
		return true
	}
	objs := g.objects()
	if objs == nil {
		return true
	}
	for _, o := range objs {
		if !collectedWith(o, g.obj, g.r.mapper) {
			return true
		}
	}
	return false
}

// collectedWith says that the garbage collector deletes o when owner is
// deleted, or that an uninstall would leave o too (resource-policy keep).
func collectedWith(o, owner *unstructured.Unstructured, mapper meta.RESTMapper) bool {
	if o.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
		return true
	}
	ref := metav1.GetControllerOfNoCopy(o)
	if ref == nil || ref.UID != owner.GetUID() || ref.Kind != owner.GetKind() {
		return false
	}
	if ns := o.GetNamespace(); ns != "" && ns != owner.GetNamespace() {
		return false
	}
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	return err == nil && m.Scope.Name() == meta.RESTScopeNameNamespace
}

// addFinalizer starts patching the finalizer onto obj and returns a
// function that waits for the patch (once) and then gives obj the patched
// finalizers and resource version. obj must not be written before.
func (r *Reconciler) addFinalizer(ctx context.Context, obj *unstructured.Unstructured) func() error {
	orig := obj.DeepCopy()
	patched := obj.DeepCopy()
	controllerutil.AddFinalizer(patched, Finalizer)
	done := make(chan error, 1)
	go func() { done <- r.client.Patch(ctx, patched, client.MergeFrom(orig)) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			if err = <-done; err != nil {
				err = fmt.Errorf("adding finalizer: %w", err)
				return
			}
			obj.SetFinalizers(patched.GetFinalizers())
			obj.SetResourceVersion(patched.GetResourceVersion())
		})
		return err
	}
}
