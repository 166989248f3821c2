// Package helmreconciler is the generic Helm reconciler engine: for each
// watches.yaml entry it turns custom resources of one kind into Helm
// releases of the entry's chart, through the render pipeline that the
// offline preview also runs.
//
// A reconcile with nothing to change is cheap: the digest of the inputs is
// compared with the digest label of the latest release Secret, read from the
// operator's cache (metadata only), and the live objects are compared with
// the deployed manifest kept in memory, by resourceVersion first. Nothing is
// rendered and nothing is read from the API server.
//
// The files:
//
//   - helm_controller.go: the annotations and labels, New, the controller's
//     watches (the resource, its release Secrets, the kinds it owns).
//   - reconcile.go: one reconcile, as one flow: inputs, release, drift,
//     status.
//   - plan.go: which Helm action a reconcile takes, from the stored
//     revisions (pure, table-tested).
//   - actions.go: the Helm actions (install, upgrade, rollback, uninstall)
//     and what the engine remembers of a deployed release.
//   - finalizer.go: when a release needs the finalizer (objects the garbage
//     collector would not remove, hooks, uninstall-wait), added before the
//     first write of a Helm action; a resource created again under a deleted
//     one's name waits for the garbage collector.
//   - uninstall.go: the deletion of a resource (uninstall, uninstall-wait).
//   - drift.go: the desired objects of a release and the repair of live
//     objects that drifted from them.
//   - live.go: the live objects post-renderers read, watched so that a
//     change to one upgrades the releases rendered from it.
//   - status.go: the conditions and .status, collected during a reconcile
//     and written once.
//   - actionconfig.go: Helm's action configuration; its kube client creates
//     in parallel and records the server's forms of what it creates.
//   - prefetch.go: Helm's reads of a release's objects, started at once.
//   - storage.go, release_driver.go: release Secrets as Helm stores them,
//     with an owner reference, chunking and pooled compression.
//   - transform.go: the cache transform that drops managedFields.
//   - metrics.go: the engine's Prometheus metrics.
package helmreconciler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	libhandler "github.com/operator-framework/operator-lib/handler"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/model-orchestra/operator/internal/render"
	"github.com/model-orchestra/operator/internal/watches"
)

// Annotations on a custom resource. They use the helm-operator's
// helm.sdk.operatorframework.io/ prefix and meaning, so that resources and
// runbooks written for the operator-sdk helm-operator keep working.
const (
	// AnnotationUpgradeForce "true" upgrades with Helm's --force (replace
	// objects that cannot be patched).
	AnnotationUpgradeForce = "helm.sdk.operatorframework.io/upgrade-force"
	// AnnotationUninstallWait "true" keeps the finalizer, and so the custom
	// resource, until every object of the release is gone.
	AnnotationUninstallWait = "helm.sdk.operatorframework.io/uninstall-wait"
	// AnnotationReconcilePeriod (a Go duration) overrides the entry's and
	// the operator's resync period for this resource.
	AnnotationReconcilePeriod = "helm.sdk.operatorframework.io/reconcile-period"
	// AnnotationPauseReconcile "true" stops all Helm actions and drift
	// repair for this resource (deletion still uninstalls).
	AnnotationPauseReconcile = "helm.sdk.operatorframework.io/pause-reconcile"

	// Finalizer makes deletion uninstall the release. It is the
	// helm-operator's, so that resources it served are uninstalled too.
	Finalizer = "helm.sdk.operatorframework.io/uninstall-release"

	// LabelEngine marks release Secrets written by the engine.
	LabelEngine = "modelorchestra.io/engine"
	// EngineName is the value of LabelEngine.
	EngineName = "helm-reconciler"
	// LabelDigest on a release (and its Secret) is the digest of the inputs
	// it was rendered from.
	LabelDigest = "modelorchestra.io/digest"

	// LabelManagedBy is Helm's on every object it applies, with value
	// ManagedByHelm. The engine also puts it on release Secrets, so that the
	// operator's cache, restricted to this label, holds both the owned
	// objects and the release Secrets, and nothing else of the cluster.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByHelm  = "Helm"

	fieldOwner        = "model-orchestra-operator"
	maxHistory        = 10
	uninstallWaitPoll = 2 * time.Second
)

// Options configure a Reconciler.
type Options struct {
	// ReconcilePeriod is the resync period when neither the entry nor the
	// resource sets one. Zero disables periodic resync.
	ReconcilePeriod time.Duration
	// MaxConcurrentReconciles is the number of workers when the entry sets
	// none. Default 1.
	MaxConcurrentReconciles int
	// ActionTimeout bounds one Helm action. Default 5 minutes.
	ActionTimeout time.Duration
	// ChunkSize is the largest release data kept in one Secret; larger
	// releases are split across Secrets. Default DefaultChunkSize.
	ChunkSize int
	// Actions, when set, learns of every Helm action the engine runs.
	Actions ActionTracker
}

// Reconciler reconciles the custom resources of one watches.yaml entry.
type Reconciler struct {
	entry    *watches.Entry
	opts     Options
	client   client.Client
	reader   client.Reader // uncached
	cache    cache.Cache
	mapper   meta.RESTMapper
	recorder events.EventRecorder
	actions  *actionConfigs
	ctrl     controller.Controller
	// restConfig and scheme build the caches of live inputs.
	restConfig *rest.Config
	scheme     *runtime.Scheme
	live       *liveInputs

	watchMu sync.Mutex
	watched map[schema.GroupVersionKind]bool

	states sync.Map // types.NamespacedName -> *releaseState
	// failures holds the back-off of failed Helm actions (backoff.go).
	failures sync.Map // types.NamespacedName -> *failureBackoff
	// listHistory holds the UIDs of resources whose release history is
	// always listed from the API server (see mustListHistory).
	listHistory sync.Map
}

// releaseState is what the engine remembers about one deployed release, so
// that a no-op reconcile reads nothing from storage.
type releaseState struct {
	uid      types.UID
	revision int
	digest   string // the release's digest label
	// base is the digest of the resource's inputs without the live inputs
	// (render.Inputs.Digest) this release was found or made for; "" when
	// unknown (read from storage after a restart).
	base     string
	desired  []*unstructured.Unstructured
	verified map[objectKey]string // resourceVersion at which the object matched
}

// New builds the reconciler of entry and registers it with mgr.
func New(mgr ctrl.Manager, entry *watches.Entry, opts Options) (*Reconciler, error) {
	if opts.MaxConcurrentReconciles < 1 {
		opts.MaxConcurrentReconciles = 1
	}
	if opts.ActionTimeout <= 0 {
		opts.ActionTimeout = 5 * time.Minute
	}
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = DefaultChunkSize
	}
	ac, err := newActionConfigs(mgr.GetConfig(), mgr.GetRESTMapper(), opts.ChunkSize, map[string]string{
		LabelEngine: EngineName, LabelManagedBy: ManagedByHelm,
	})
	if err != nil {
		return nil, err
	}
	r := &Reconciler{
		entry:    entry,
		opts:     opts,
		client:   mgr.GetClient(),
		reader:   mgr.GetAPIReader(),
		cache:    mgr.GetCache(),
		mapper:   mgr.GetRESTMapper(),
		recorder: mgr.GetEventRecorder(controllerName(entry)),
		actions:  ac,
		watched:  map[schema.GroupVersionKind]bool{},

		restConfig: mgr.GetConfig(),
		scheme:     mgr.GetScheme(),
		live:       newLiveInputs(),
	}
	if err := indexReleaseSecrets(mgr); err != nil {
		return nil, err
	}
	if err := mgr.Add(r.live); err != nil {
		return nil, fmt.Errorf("adding the cache of live inputs for %s: %w", entry.GVK, err)
	}
	return r, r.setup(mgr)
}

// indexReleaseName indexes the cached release Secrets by release name, so
// that a reconcile finds its history without scanning every release Secret
// of the namespace.
const indexReleaseName = "modelorchestra.io/helm-release-name"

// indexed holds the caches that have the index (one per manager, which
// serves every watches entry).
var indexed sync.Map

func indexReleaseSecrets(mgr ctrl.Manager) error {
	if _, done := indexed.LoadOrStore(mgr.GetCache(), true); done {
		return nil
	}
	err := mgr.GetFieldIndexer().IndexField(context.Background(), releaseSecretMeta(), indexReleaseName, func(o client.Object) []string {
		l := o.GetLabels()
		if l["owner"] != "helm" || l["name"] == "" {
			return nil
		}
		return []string{l["name"]}
	})
	if err != nil {
		indexed.Delete(mgr.GetCache())
		return fmt.Errorf("indexing release Secrets: %w", err)
	}
	return nil
}

// releaseSecretMeta is the cached form of release Secrets: metadata only.
func releaseSecretMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}

func controllerName(e *watches.Entry) string {
	return strings.ToLower(e.GVK.Kind + "." + e.GVK.Group + "-" + e.GVK.Version)
}

func (r *Reconciler) newObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(r.entry.GVK)
	return u
}

func (r *Reconciler) setup(mgr ctrl.Manager) error {
	workers := r.entry.MaxConcurrentReconciles
	if workers == 0 {
		workers = r.opts.MaxConcurrentReconciles
	}
	owner := r.newObject()
	forOpts := []builder.WatchesOption{builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{},
		predicate.AnnotationChangedPredicate{}, predicate.LabelChangedPredicate{}, deletingPredicate{}))}
	if r.entry.Selector != nil {
		sel := r.entry.Selector
		forOpts = append(forOpts, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return sel.Matches(labelsOf(o))
		})))
	}
	releaseSecrets := releaseSecretMeta()
	// The custom resources are watched with operator-lib's instrumented
	// handler: it enqueues them as For would, and keeps the gauge
	// resource_created_at_seconds{name,namespace,group,version,kind} (the
	// creation time of each served resource) that operator-sdk's operators,
	// helm-operator-plugins among them, export.
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named(controllerName(r.entry)).
		Watches(owner, &libhandler.InstrumentedEnqueueRequestForObject[client.Object]{}, forOpts...).
		WatchesMetadata(releaseSecrets,
			handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), owner, handler.OnlyControllerOwner()),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetLabels()["owner"] == "helm"
			}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Build(r)
	if err != nil {
		return fmt.Errorf("building controller for %s: %w", r.entry.GVK, err)
	}
	r.ctrl = c
	return nil
}

// Watch adds a source to the reconciler's controller, for the objects its
// plugins read that it does not own (see manager.RelatedWatch).
func (r *Reconciler) Watch(src source.Source) error { return r.ctrl.Watch(src) }

// watchDependents starts watching the kinds of objs, once per kind, so that a
// change to an owned object reconciles its owner promptly.
func (r *Reconciler) watchDependents(objs []*unstructured.Unstructured) error {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if r.watched[gvk] {
			continue
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		preds := []predicate.TypedPredicate[*unstructured.Unstructured]{}
		if r.entry.Status == nil {
			// Without a status plugin, status-only changes cannot matter.
			preds = append(preds, dependentChanged{})
		}
		src := source.Kind(r.cache, u, handler.TypedEnqueueRequestsFromMapFunc(r.ownerOf), preds...)
		if err := r.ctrl.Watch(src); err != nil {
			return fmt.Errorf("watching %s: %w", gvk, err)
		}
		r.watched[gvk] = true
	}
	return nil
}

// ownerOf maps an owned object to its custom resource, by controller owner
// reference or by the owner annotations.
func (r *Reconciler) ownerOf(_ context.Context, o *unstructured.Unstructured) []reconcile.Request {
	gk := r.entry.GVK.GroupKind()
	if ref := metav1.GetControllerOf(o); ref != nil {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err == nil && gv.Group == gk.Group && ref.Kind == gk.Kind {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}}
		}
		return nil
	}
	a := o.GetAnnotations()
	if a[render.AnnotationOwnerKind] != gk.String() {
		return nil
	}
	ns, name, ok := strings.Cut(a[render.AnnotationOwner], "/")
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}

// dependentChanged passes creates, deletes and updates that change more than
// status and bookkeeping metadata.
type dependentChanged struct {
	predicate.TypedFuncs[*unstructured.Unstructured]
}

func (dependentChanged) Create(event.TypedCreateEvent[*unstructured.Unstructured]) bool { return true }
func (dependentChanged) Delete(event.TypedDeleteEvent[*unstructured.Unstructured]) bool { return true }
func (dependentChanged) Generic(event.TypedGenericEvent[*unstructured.Unstructured]) bool {
	return true
}

func (dependentChanged) Update(e event.TypedUpdateEvent[*unstructured.Unstructured]) bool {
	return !equalIgnoringStatus(e.ObjectOld, e.ObjectNew)
}

func equalIgnoringStatus(a, b *unstructured.Unstructured) bool {
	strip := func(u *unstructured.Unstructured) map[string]any {
		c := make(map[string]any, len(u.Object))
		for k, v := range u.Object {
			if k != "status" && k != "metadata" {
				c[k] = v
			}
		}
		m := u.Object["metadata"]
		if mm, ok := m.(map[string]any); ok {
			md := make(map[string]any, len(mm))
			for k, v := range mm {
				switch k {
				case "resourceVersion", "managedFields", "generation":
				default:
					md[k] = v
				}
			}
			c["metadata"] = md
		}
		return c
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}

func labelsOf(o client.Object) labels.Set { return labels.Set(o.GetLabels()) }

// deletingPredicate passes updates that start a deletion.
type deletingPredicate struct{ predicate.Funcs }

func (deletingPredicate) Update(e event.UpdateEvent) bool {
	return e.ObjectNew.GetDeletionTimestamp() != nil
}
