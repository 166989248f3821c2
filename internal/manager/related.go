package manager

import (
	"context"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/model-orchestra/operator/internal/helmreconciler"
	"github.com/model-orchestra/operator/internal/watches"
)

// RelatedWatch makes the reconciler of one watches.yaml kind watch another
// kind that its values translator reads (a policy its resources reference
// by name, for example): a change of such an object reconciles the
// resources Map returns, which re-renders them when their values changed.
type RelatedWatch struct {
	// Owner is the kind served by a watches.yaml entry; its reconciler
	// receives the requests. Without such an entry the watch is not set.
	Owner schema.GroupVersionKind
	// Kind is the watched kind. Its objects are cached whatever their
	// labels (the translator reads them through the cached client). When
	// the API server does not serve it (its CRD is not installed), the
	// watch is not set and a message is logged.
	Kind schema.GroupVersionKind
	// Map returns the resources to reconcile when obj changes, read
	// through the manager's cached client.
	Map func(ctx context.Context, r client.Reader, obj client.Object) []reconcile.Request
}

// servedRelated returns the related watches whose owner an entry serves,
// whose kind the API server serves and which the operator may list and
// watch in the namespaces it serves. An operator installed with the CRDs or
// the permissions of an earlier release runs without the watch, and says
// so, rather than failing to start.
func servedRelated(ctx context.Context, restCfg *rest.Config, related []RelatedWatch, entries []watches.Entry, namespaces []string) ([]RelatedWatch, error) {
	var out []RelatedWatch
	var cs *kubernetes.Clientset
	log := ctrl.Log.WithName("manager")
	for _, rw := range related {
		if entryFor(entries, rw.Owner) < 0 {
			continue
		}
		if cs == nil {
			var err error
			if cs, err = kubernetes.NewForConfig(restCfg); err != nil {
				return nil, fmt.Errorf("API client: %w", err)
			}
		}
		resource, err := servedResource(cs.Discovery(), rw.Kind)
		if err != nil {
			return nil, err
		}
		if resource == "" {
			log.Info("not watching a related kind: the API server does not serve it (is its CRD installed?)", "kind", rw.Kind.String(), "owner", rw.Owner.String())
			continue
		}
		denied, err := deniedVerb(ctx, cs, rw.Kind.Group, resource, namespaces)
		if err != nil {
			return nil, err
		}
		if denied != "" {
			log.Info("not watching a related kind: the operator may not "+denied+" it (are its permissions from an earlier release?)", "kind", rw.Kind.String(), "owner", rw.Owner.String())
			continue
		}
		out = append(out, rw)
	}
	return out, nil
}

// deniedVerb returns the first of list and watch the operator may not use
// on resource in one of namespaces (all namespaces when empty), or "".
func deniedVerb(ctx context.Context, cs kubernetes.Interface, group, resource string, namespaces []string) (string, error) {
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	for _, ns := range namespaces {
		for _, verb := range []string{"list", "watch"} {
			review, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: ns, Verb: verb, Group: group, Resource: resource,
				}},
			}, metav1.CreateOptions{})
			if err != nil {
				return "", fmt.Errorf("reviewing access to %s.%s: %w", resource, group, err)
			}
			if !review.Status.Allowed {
				return verb, nil
			}
		}
	}
	return "", nil
}

// servedResource returns the resource (plural) that serves gvk, or "".
func servedResource(dc discovery.DiscoveryInterface, gvk schema.GroupVersionKind) (string, error) {
	list, err := dc.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("discovering %s: %w", gvk.GroupVersion(), err)
	}
	for _, r := range list.APIResources {
		if r.Kind == gvk.Kind && !strings.Contains(r.Name, "/") {
			return r.Name, nil
		}
	}
	return "", nil
}

func entryFor(entries []watches.Entry, gvk schema.GroupVersionKind) int {
	for i := range entries {
		if entries[i].GVK == gvk {
			return i
		}
	}
	return -1
}

// cacheRelated caches the related kinds without the default label selector.
func cacheRelated(byObject map[client.Object]cache.ByObject, related []RelatedWatch) {
	for _, rw := range related {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(rw.Kind)
		byObject[u] = cache.ByObject{Label: labels.Everything()}
	}
}

// watchRelated adds the related watches to their owners' reconcilers.
func watchRelated(mgr ctrl.Manager, related []RelatedWatch, entries []watches.Entry, recs []*helmreconciler.Reconciler) error {
	for _, rw := range related {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(rw.Kind)
		mapper := rw.Map
		src := source.Kind(mgr.GetCache(), u, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, o *unstructured.Unstructured) []reconcile.Request {
			return mapper(ctx, mgr.GetClient(), o)
		}))
		if err := recs[entryFor(entries, rw.Owner)].Watch(src); err != nil {
			return fmt.Errorf("watching %s for %s: %w", rw.Kind, rw.Owner, err)
		}
	}
	return nil
}
