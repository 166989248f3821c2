package helmreconciler

import (
	"context"
	"errors"
	"fmt"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/render"
)

// HelmAction is a Helm action on one release.
type HelmAction struct {
	// Action is install, upgrade, rollback, uninstall or purge (an
	// uninstall that keeps no history).
	Action    string
	Namespace string
	Release   string
}

// ActionTracker learns of the Helm actions the engine runs, for what must
// know that one is in flight (OLM's Upgradeable condition,
// internal/manager).
type ActionTracker interface {
	// ActionStarted is called as a Helm action starts, before it writes
	// anything; the function it returns is called once, when the action
	// has returned. Actions may nest (an install that fails purges what
	// it created) and run concurrently.
	ActionStarted(HelmAction) (finished func())
}

// started tells the tracker, if any, that action on the release of obj
// starts; the caller calls the returned function when it has returned.
func (r *Reconciler) started(action string, obj *unstructured.Unstructured) (finished func()) {
	if r.opts.Actions == nil {
		return func() {}
	}
	return r.opts.Actions.ActionStarted(HelmAction{Action: action, Namespace: obj.GetNamespace(), Release: obj.GetName()})
}

// postRenderer is the render pipeline for an install or upgrade whose
// release labels are labels. Post-renderers read live objects directly
// from the API server: the operator's cache holds only objects labelled
// managed-by Helm, and a render is rare (the digest changed). When
// post-renderers name live inputs, the digest label becomes the digest of
// what was rendered, live inputs included.
func (r *Reconciler) postRenderer(ctx context.Context, obj *unstructured.Unstructured, in render.Inputs, labels map[string]string) *prefetchingPostRenderer {
	renders.WithLabelValues(r.entry.GVK.Kind).Inc()
	pr := render.NewPostRenderer(ctx, r.entry, obj, render.Options{Reader: r.reader, Mapper: r.mapper})
	if len(r.contributors()) > 0 {
		pr = &digestingPostRenderer{PostRenderer: pr, r: r, ctx: ctx, obj: obj, base: in.Digest, labels: labels}
	}
	return &prefetchingPostRenderer{PostRenderer: pr, p: r.actions.prefetch, ctx: ctx, mapper: r.mapper, namespace: obj.GetNamespace()}
}

func releaseLabels(in render.Inputs) map[string]string {
	return map[string]string{LabelDigest: in.Digest, LabelEngine: EngineName}
}

// install installs the release of obj. It also returns the objects of the
// rendered manifest (the release's), or nil.
// forms receives the objects the install creates; cfg's kube client
// records them there (actionOptions.forms).
// fin, when set, learns the objects rendered (finalizerGate.rendered).
func (r *Reconciler) install(ctx context.Context, cfg *action.Configuration, obj *unstructured.Unstructured, in render.Inputs, forms *serverForms, fin *finalizerGate) (*release.Release, []*unstructured.Unstructured, error) {
	defer r.started("install", obj)()
	i := action.NewInstall(cfg)
	i.ReleaseName = obj.GetName()
	i.Namespace = obj.GetNamespace()
	i.Replace = true
	i.Timeout = r.opts.ActionTimeout
	i.Labels = releaseLabels(in)
	pr := r.postRenderer(ctx, obj, in, i.Labels)
	pr.absent = r.cachedAbsent
	fin.rendered(pr.Objects)
	i.PostRenderer = pr
	i.SkipSchemaValidation = true // render.Validate ran, with a clearer message
	i.DisableOpenAPIValidation = true
	rel, err := i.RunWithContext(ctx, r.entry.Chart, in.Values)
	if err != nil {
		helmActions.WithLabelValues(r.entry.GVK.Kind, "install", "failure").Inc()
		// Whatever failed, the retry reads the history from the API server.
		r.listHistory.Store(obj.GetUID(), true)
		msg := fmt.Sprintf("install of release %s failed: %v", obj.GetName(), err)
		if ctx.Err() != nil {
			// The operator is shutting down mid-install: leave the
			// pending release to the next leader, which recovers it.
			return nil, nil, errors.New(msg)
		}
		if errors.Is(err, driver.ErrReleaseExists) {
			// The history changed after it was read (a stale cache or
			// another writer); nothing was written. The retry reads it.
			return nil, nil, fmt.Errorf("%s: %w", msg, errHistoryChanged)
		}
		if rel != nil {
			// The purge deletes only what this install created: an
			// object of the manifest that already existed (one the
			// cache did not show, see cachedAbsent) is not the
			// release's to delete.
			forms.deleteOnlyCreated()
			if uerr := r.uninstall(cfg, obj, false, "purge"); uerr != nil {
				msg += fmt.Sprintf("; removing the partial release failed: %v", uerr)
			} else {
				msg += "; the partial release was removed"
			}
		}
		return nil, nil, errors.New(msg)
	}
	helmActions.WithLabelValues(r.entry.GVK.Kind, "install", "success").Inc()
	return rel, pr.Objects(), nil
}

// cachedAbsent says that the operator's cache, which watches gvk, holds no
// object namespace/name, so that an install need not read it before
// creating it. The cache holds only objects labelled managed-by Helm, so
// the object may still exist without that label, or have been created
// after the cache's last event. Either way Helm's create then fails
// (already exists) instead of Helm's ownership check, the install fails
// and its purge deletes only what it created: nothing of the existing
// object is changed, and the next attempt reads it from the API server
// once the cache shows it, or fails again on the same name.
func (r *Reconciler) cachedAbsent(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) bool {
	r.watchMu.Lock()
	watched := r.watched[gvk]
	r.watchMu.Unlock()
	if !watched {
		// Reading would start an informer for the kind; a GET is cheaper.
		return false
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	// Only NotFound counts: a namespace the cache does not cover is an
	// error, and so is a cache that cannot answer.
	return apierrors.IsNotFound(r.cache.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u))
}

// upgrade upgrades the release of obj. It also returns the objects of the
// rendered manifest (the new revision's), or nil.
// fin, when set, learns the objects rendered.
func (r *Reconciler) upgrade(ctx context.Context, cfg *action.Configuration, obj *unstructured.Unstructured, in render.Inputs, fin *finalizerGate) (*release.Release, []*unstructured.Unstructured, error) {
	defer r.started("upgrade", obj)()
	u := action.NewUpgrade(cfg)
	u.Namespace = obj.GetNamespace()
	u.MaxHistory = maxHistory
	u.Timeout = r.opts.ActionTimeout
	u.Labels = releaseLabels(in)
	u.Force = boolAnnotation(obj, AnnotationUpgradeForce)
	pr := r.postRenderer(ctx, obj, in, u.Labels)
	fin.rendered(pr.Objects)
	u.PostRenderer = pr
	u.SkipSchemaValidation = true
	u.DisableOpenAPIValidation = true
	rel, err := u.RunWithContext(ctx, obj.GetName(), r.entry.Chart, in.Values)
	if err != nil {
		helmActions.WithLabelValues(r.entry.GVK.Kind, "upgrade", "failure").Inc()
		return rel, nil, err
	}
	helmActions.WithLabelValues(r.entry.GVK.Kind, "upgrade", "success").Inc()
	return rel, pr.Objects(), nil
}

// rollback rolls the release back to revision with a three-way merge
// patch, as `helm rollback` does. Not with Force: that replaces every object
// with its manifest, which drops fields other writers set and fails on
// fields the API server set and keeps immutable (a Job's selector), leaving
// the release failed.
func (r *Reconciler) rollback(cfg *action.Configuration, obj *unstructured.Unstructured, revision int) error {
	defer r.started("rollback", obj)()
	rb := action.NewRollback(cfg)
	rb.Version = revision
	rb.MaxHistory = maxHistory
	rb.Timeout = r.opts.ActionTimeout
	if err := rb.Run(obj.GetName()); err != nil {
		helmActions.WithLabelValues(r.entry.GVK.Kind, "rollback", "failure").Inc()
		return err
	}
	helmActions.WithLabelValues(r.entry.GVK.Kind, "rollback", "success").Inc()
	return nil
}

// uninstall removes the release's objects; keepHistory leaves its Secrets
// (status uninstalled) for uninstall-wait to read the manifest from.
func (r *Reconciler) uninstall(cfg *action.Configuration, obj *unstructured.Unstructured, keepHistory bool, name string) error {
	defer r.started(name, obj)()
	u := action.NewUninstall(cfg)
	u.KeepHistory = keepHistory
	u.IgnoreNotFound = true
	u.Timeout = r.opts.ActionTimeout
	u.DeletionPropagation = "background"
	if _, err := u.Run(obj.GetName()); err != nil {
		helmActions.WithLabelValues(r.entry.GVK.Kind, name, "failure").Inc()
		return err
	}
	helmActions.WithLabelValues(r.entry.GVK.Kind, name, "success").Inc()
	return nil
}

// lastDeployed returns the latest deployed revision of hist, or nil.
func lastDeployed(hist []*release.Release) *release.Release {
	var d *release.Release
	for _, h := range hist {
		if h.Info != nil && h.Info.Status == release.StatusDeployed && (d == nil || h.Version > d.Version) {
			d = h
		}
	}
	return d
}

// markFailed marks a revision left pending by an interrupted action failed,
// which unblocks Helm ("another operation is in progress").
func markFailed(cfg *action.Configuration, name string, revision int) error {
	rel, err := cfg.Releases.Get(name, revision)
	if err != nil {
		return fmt.Errorf("reading revision %d left pending: %w", revision, err)
	}
	rel.SetStatus(release.StatusFailed, fmt.Sprintf("marked failed by the operator: the action was interrupted while %s", rel.Info.Status))
	if err := cfg.Releases.Update(rel); err != nil {
		return fmt.Errorf("marking revision %d failed: %w", revision, err)
	}
	return nil
}

func chartRef(rel *release.Release) string {
	if rel.Chart == nil || rel.Chart.Metadata == nil {
		return "?"
	}
	return rel.Chart.Metadata.Name + "-" + rel.Chart.Metadata.Version
}

// remember keeps the desired objects of a deployed release in memory.
// objs are those of its manifest when the caller has them (it rendered
// it), else nil: the manifest is parsed.
func (r *Reconciler) remember(obj *unstructured.Unstructured, rel *release.Release, objs []*unstructured.Unstructured) (*releaseState, error) {
	if objs == nil {
		var err error
		if objs, err = render.ParseManifest(rel.Manifest); err != nil {
			return nil, fmt.Errorf("parsing the manifest of revision %d: %w", rel.Version, err)
		}
	}
	rs := &releaseState{
		uid:      obj.GetUID(),
		revision: rel.Version,
		digest:   rel.Labels[LabelDigest],
		desired:  desiredObjects(objs, rel.Name, rel.Namespace, r.mapper),
		verified: map[objectKey]string{},
	}
	r.states.Store(client.ObjectKeyFromObject(obj), rs)
	return rs, nil
}

// loadState reads a deployed revision from storage (after a restart).
func (r *Reconciler) loadState(ctx context.Context, obj *unstructured.Unstructured, revision int) (*releaseState, error) {
	cfg, err := r.actions.forResource(obj, helmLog(ctx))
	if err != nil {
		return nil, err
	}
	rel, err := cfg.Releases.Get(obj.GetName(), revision)
	if err != nil {
		return nil, fmt.Errorf("reading release %s revision %d: %w", obj.GetName(), revision, err)
	}
	return r.remember(obj, rel, nil)
}

// errHistoryChanged: an install found a release revision that the history
// it read did not show; nothing was written, and a retry reads the history
// from the API server.
var errHistoryChanged = errors.New("the release history changed while installing; retrying")
