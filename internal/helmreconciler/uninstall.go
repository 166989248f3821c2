package helmreconciler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/model-orchestra/operator/internal/render"
)

// reconcileDelete uninstalls the release and releases the finalizer; with
// uninstall-wait, only once every object of the release is gone. held says
// that the deletion is held up (the uninstall failed, or objects remain),
// which st then tells: only then is the status of a resource being deleted
// written.
func (r *Reconciler) reconcileDelete(ctx context.Context, obj *unstructured.Unstructured, st *status) (_ reconcile.Result, held bool, _ error) {
	if !controllerutil.ContainsFinalizer(obj, Finalizer) {
		return reconcile.Result{}, false, nil
	}
	cfg, err := r.actions.forResource(obj, helmLog(ctx))
	if err != nil {
		return reconcile.Result{}, false, err
	}
	if boolAnnotation(obj, AnnotationUninstallWait) {
		last, err := cfg.Releases.Last(obj.GetName())
		if err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
			return reconcile.Result{}, false, fmt.Errorf("reading release: %w", err)
		}
		if last != nil {
			if last.Info.Status != release.StatusUninstalled {
				if err := r.uninstall(cfg, obj, true, "uninstall"); err != nil {
					return reconcile.Result{}, true, r.uninstallFailed(obj, st, err)
				}
				r.event(obj, corev1.EventTypeNormal, ReasonUninstallSuccessful, "Uninstall", "uninstalled release %s; waiting for its objects to be gone", obj.GetName())
			}
			remaining, err := r.remainingObjects(ctx, last)
			if err != nil {
				return reconcile.Result{}, false, err
			}
			if len(remaining) > 0 {
				st.set(TypeDeployed, metav1.ConditionFalse, ReasonUninstallWaiting, "uninstalled; waiting for %d objects to be deleted: %s", len(remaining), strings.Join(remaining, ", "))
				return reconcile.Result{RequeueAfter: uninstallWaitPoll}, true, nil
			}
			if err := r.uninstall(cfg, obj, false, "purge"); err != nil {
				return reconcile.Result{}, true, r.uninstallFailed(obj, st, err)
			}
		}
	} else {
		if err := r.uninstall(cfg, obj, false, "uninstall"); err != nil {
			return reconcile.Result{}, true, r.uninstallFailed(obj, st, err)
		}
		r.event(obj, corev1.EventTypeNormal, ReasonUninstallSuccessful, "Uninstall", "uninstalled release %s", obj.GetName())
	}
	patch := client.MergeFrom(obj.DeepCopy())
	controllerutil.RemoveFinalizer(obj, Finalizer)
	if err := r.client.Patch(ctx, obj, patch); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, false, fmt.Errorf("removing finalizer: %w", err)
	}
	r.states.Delete(client.ObjectKeyFromObject(obj))
	r.failures.Delete(client.ObjectKeyFromObject(obj))
	r.listHistory.Delete(obj.GetUID())
	r.live.forget(client.ObjectKeyFromObject(obj))
	return reconcile.Result{}, false, nil
}

// uninstallFailed records a failed uninstall and returns it as an error.
func (r *Reconciler) uninstallFailed(obj *unstructured.Unstructured, st *status, err error) error {
	msg := fmt.Sprintf("uninstall of release %s failed: %v", obj.GetName(), err)
	reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(ReasonUninstallFailed)).Inc()
	st.set(TypeReleaseFailed, metav1.ConditionTrue, ReasonUninstallFailed, "%s", msg)
	r.event(obj, corev1.EventTypeWarning, ReasonUninstallFailed, "Uninstall", "%s", msg)
	return errors.New(msg)
}

// remainingObjects lists the objects of rel that still exist, skipping those
// Helm keeps on purpose (helm.sh/resource-policy: keep).
func (r *Reconciler) remainingObjects(ctx context.Context, rel *release.Release) ([]string, error) {
	objs, err := render.ParseManifest(rel.Manifest)
	if err != nil {
		return nil, err
	}
	var remaining []string
	for _, o := range desiredObjects(objs, rel.Name, rel.Namespace, r.mapper) {
		if o.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
			continue
		}
		have := &metav1.PartialObjectMetadata{}
		have.SetGroupVersionKind(o.GroupVersionKind())
		err := r.reader.Get(ctx, keyOf(o).namespacedName(), have)
		switch {
		case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("checking %s: %w", keyOf(o), err)
		}
		remaining = append(remaining, keyOf(o).String())
		if have.GetDeletionTimestamp() == nil {
			// Deleted again in case a writer recreated it.
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(o.GroupVersionKind())
			u.SetNamespace(o.GetNamespace())
			u.SetName(o.GetName())
			if err := r.client.Delete(ctx, u, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("deleting %s: %w", keyOf(o), err)
			}
		}
	}
	sort.Strings(remaining)
	return remaining, nil
}
