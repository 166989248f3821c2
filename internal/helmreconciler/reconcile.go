package helmreconciler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/render"
)

// Reconcile serves one custom resource: uninstall when it is being deleted,
// otherwise install or upgrade its release when the digest of its inputs
// changed, restore owned objects that drifted, and write its status once.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (result reconcile.Result, err error) {
	start := time.Now()
	outcome := "noop"
	defer func() {
		if err != nil {
			outcome = "error"
		}
		reconcileDuration.WithLabelValues(r.entry.GVK.Kind, outcome).Observe(time.Since(start).Seconds())
	}()
	defer func() {
		if errors.Is(err, errStaleStatus) {
			// The status was computed from a cached copy of the resource
			// older than its last write (typically the engine's own status
			// write, whose watch event had not arrived): not a failure.
			// The retry reads the newer copy.
			result, err = reconcile.Result{RequeueAfter: staleStatusRetry}, nil
		}
	}()
	log := logr.FromContextOrDiscard(ctx)

	obj := r.newObject()
	if err := r.client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.states.Delete(req.NamespacedName)
			r.live.forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("getting %s %s: %w", r.entry.GVK.Kind, req.NamespacedName, err)
	}
	if r.entry.Selector != nil && !r.entry.Selector.Matches(labelsOf(obj)) {
		r.live.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	st := statusFrom(obj)

	if obj.GetDeletionTimestamp() != nil {
		outcome = "uninstall"
		return r.reconcileDelete(ctx, obj, st)
	}
	if boolAnnotation(obj, AnnotationPauseReconcile) {
		outcome = "paused"
		st.set(TypePaused, metav1.ConditionTrue, ReasonPaused,
			"reconciliation is paused by annotation %s; remove it or set it to \"false\" to resume", AnnotationPauseReconcile)
		return reconcile.Result{}, r.writeStatus(ctx, obj, st)
	}
	meta.RemoveStatusCondition(&st.conditions, TypePaused)

	// The finalizer patch runs while the inputs are prepared and the
	// history is read; it is waited for before any Helm action and any
	// status write.
	finalized := func() error { return nil }
	if !controllerutil.ContainsFinalizer(obj, Finalizer) {
		finalized = r.addFinalizer(ctx, obj)
	}
	st.set(TypeInitialized, metav1.ConditionTrue, ReasonInitialized, "the %s engine serves this resource", r.entry.Chart.Name())

	period, err := r.reconcilePeriod(obj)
	if err != nil {
		if err := finalized(); err != nil {
			return reconcile.Result{}, err
		}
		outcome = "invalid"
		st.set(TypeIrreconcilable, metav1.ConditionTrue, ReasonReconcileError, "%v", err)
		reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(ReasonReconcileError)).Inc()
		return reconcile.Result{}, r.writeStatus(ctx, obj, st)
	}

	in, err := render.Prepare(ctx, r.entry, obj)
	if err == nil {
		// Validation is cheap next to a Helm action but not free; it only
		// matters when the inputs changed, which the digest tells.
		if rs := r.state(obj); rs == nil || rs.base != in.Digest {
			err = render.Validate(r.entry, in.Values)
		}
	}
	if err != nil {
		if err := finalized(); err != nil {
			return reconcile.Result{}, err
		}
		outcome = "invalid"
		return reconcile.Result{}, r.irreconcilable(ctx, obj, st, ReasonValuesInvalid, err)
	}

	// The update recording a release deployed runs while the status is
	// written; the reconcile returns once both are done.
	bg := &backgroundWrites{}
	defer func() {
		if werr := bg.wait(); werr != nil && err == nil {
			err = werr
		}
	}()
	rs, acted, err := r.ensureRelease(ctx, obj, in, st, finalized, bg)
	if ferr := finalized(); ferr != nil {
		return reconcile.Result{}, ferr
	}
	if err != nil {
		if werr := r.writeStatus(ctx, obj, st); werr != nil {
			log.Error(werr, "writing status")
		}
		return reconcile.Result{}, err
	}
	if acted != "" {
		outcome = acted
	}

	// Right after a Helm action the cache may not show the objects Helm just
	// wrote yet; their watch events bring the next reconcile, which checks
	// them, so repairing now would only re-apply what is already there.
	live, repaired, err := r.repairDrift(ctx, obj, rs, acted == "")
	if err != nil {
		st.set(TypeIrreconcilable, metav1.ConditionTrue, ReasonReconcileError, "restoring owned objects: %v", err)
		reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(ReasonReconcileError)).Inc()
		if werr := r.writeStatus(ctx, obj, st); werr != nil {
			log.Error(werr, "writing status")
		}
		return reconcile.Result{}, err
	}
	if len(repaired) > 0 {
		if outcome == "noop" {
			outcome = "repair"
		}
		driftRepairs.WithLabelValues(r.entry.GVK.Kind).Add(float64(len(repaired)))
		r.event(obj, corev1.EventTypeNormal, ReasonDriftRepaired, "Repair", "restored %s", strings.Join(repaired, ", "))
	}
	st.set(TypeIrreconcilable, metav1.ConditionFalse, ReasonReconciled, "release %s revision %d matches the resource", obj.GetName(), rs.revision)

	if r.entry.Status != nil {
		res, err := r.entry.Status.Status(ctx, plugin.StatusInput{
			Owner: obj.DeepCopy(), ReleaseName: obj.GetName(), ReleaseRevision: rs.revision, Objects: live, Reader: r.client,
		})
		if err == nil {
			err = st.merge(res.Fields, res.Conditions)
		}
		if err != nil {
			reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(ReasonStatusPluginError)).Inc()
			st.set(TypeIrreconcilable, metav1.ConditionTrue, ReasonStatusPluginError, "status plugin %q: %v", r.entry.StatusName, err)
		}
	}
	if err := r.writeStatus(ctx, obj, st); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: period}, nil
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

func (r *Reconciler) irreconcilable(ctx context.Context, obj *unstructured.Unstructured, st *status, reason Reason, err error) error {
	reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(reason)).Inc()
	msg := err.Error()
	if !st.isTrue(TypeIrreconcilable) || conditionMessage(st, TypeIrreconcilable) != msg {
		r.event(obj, corev1.EventTypeWarning, reason, "Render", "%s", msg)
	}
	st.set(TypeIrreconcilable, metav1.ConditionTrue, reason, "%s", msg)
	// Nothing changes until the resource does, which the watch reports.
	return r.writeStatus(ctx, obj, st)
}

func conditionMessage(st *status, t string) string {
	if c := meta.FindStatusCondition(st.conditions, t); c != nil {
		return c.Message
	}
	return ""
}

func (r *Reconciler) state(obj *unstructured.Unstructured) *releaseState {
	v, ok := r.states.Load(client.ObjectKeyFromObject(obj))
	if !ok {
		return nil
	}
	rs := v.(*releaseState)
	if rs.uid != obj.GetUID() {
		return nil
	}
	return rs
}

// latestRevision reads the latest release revision's labels from the cache
// (metadata of the release Secrets); ok is false when none is cached.
func (r *Reconciler) latestRevision(ctx context.Context, obj *unstructured.Unstructured) (revisionInfo, bool, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := r.client.List(ctx, list, client.InNamespace(obj.GetNamespace()),
		client.MatchingFields{indexReleaseName: obj.GetName()}); err != nil {
		return revisionInfo{}, false, fmt.Errorf("listing release secrets: %w", err)
	}
	var latest revisionInfo
	found := false
	for _, s := range list.Items {
		l := s.GetLabels()
		v, err := strconv.Atoi(l["version"])
		if err != nil || v <= latest.Revision {
			continue
		}
		latest = revisionInfo{Revision: v, Status: release.Status(l["status"]), Digest: l[LabelDigest]}
		found = true
	}
	return latest, found, nil
}

// ensureRelease makes the latest revision a deployed release of the wanted
// inputs, running a Helm action only when the digest differs. It returns
// the remembered state of the deployed release and the action taken ("" if
// none).
func (r *Reconciler) ensureRelease(ctx context.Context, obj *unstructured.Unstructured, in render.Inputs, st *status, finalized func() error, bg *backgroundWrites) (*releaseState, string, error) {
	latest, cached, err := r.latestRevision(ctx, obj)
	if err != nil {
		return nil, "", err
	}
	rs := r.state(obj)
	if cached && latest.Status == release.StatusDeployed {
		want := in.Digest
		if len(r.contributors()) > 0 {
			// The live inputs are those named for the deployed objects.
			if rs == nil || rs.revision != latest.Revision {
				if rs, err = r.loadState(ctx, obj, latest.Revision); err != nil {
					return nil, "", err
				}
			}
			if want, err = r.liveDigest(ctx, obj, in.Digest, rs.desired); err != nil {
				return nil, "", err
			}
		}
		if latest.Digest == want {
			if rs == nil || rs.revision != latest.Revision {
				if rs, err = r.loadState(ctx, obj, latest.Revision); err != nil {
					return nil, "", err
				}
			}
			rs.base = in.Digest
			r.markDeployed(st, obj, rs, ReasonUpToDate, "release %s revision %d is deployed and up to date")
			return rs, "", nil
		}
	}

	// No Helm action writes an object before the finalizer is on: a
	// deletion must uninstall what it creates. The patch runs while Helm
	// reads the history, renders and stores the pending release.
	forms := &serverForms{}
	cfg, err := r.actions.forReconcile(obj, helmLog(ctx), actionOptions{
		beforeWrite: finalized,
		noHistory:   !cached && rs == nil && !r.mustListHistory(obj),
		background:  bg,
		forms:       forms,
	})
	if err != nil {
		return nil, "", err
	}
	hist, err := cfg.Releases.History(obj.GetName())
	if err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
		return nil, "", fmt.Errorf("reading release history: %w", err)
	}
	infos := make([]revisionInfo, 0, len(hist))
	for _, h := range hist {
		infos = append(infos, revisionInfo{Revision: h.Version, Status: h.Info.Status, Digest: h.Labels[LabelDigest]})
	}
	want := in.Digest
	if len(hist) > 0 && len(r.contributors()) > 0 {
		releaseutil.SortByRevision(hist)
		if l := hist[len(hist)-1]; l.Info.Status == release.StatusDeployed {
			objs, err := render.ParseManifest(l.Manifest)
			if err != nil {
				return nil, "", fmt.Errorf("parsing the manifest of revision %d: %w", l.Version, err)
			}
			if want, err = r.liveDigest(ctx, obj, in.Digest, desiredObjects(objs, l.Name, l.Namespace, r.mapper)); err != nil {
				return nil, "", err
			}
		}
	}
	p := planRelease(infos, want)
	if p.Step == stepUpgrade || p.PurgeFirst {
		// Recovery and upgrades change stored releases before Helm writes
		// objects; they wait for the finalizer first.
		if err := finalized(); err != nil {
			return nil, "", err
		}
	}
	if p.Recovered != "" {
		logr.FromContextOrDiscard(ctx).Info("recovering release", "detail", p.Recovered)
		r.event(obj, corev1.EventTypeWarning, ReasonReleaseRecovered, "Recover", "%s", p.Recovered)
	}

	var rel *release.Release
	var rendered []*unstructured.Unstructured // the objects of rel's manifest, when rendered here
	var acted string
	switch p.Step {
	case stepNone:
		releaseutil.SortByRevision(hist)
		rel = hist[len(hist)-1]
	case stepInstall:
		acted = "install"
		if p.PurgeFirst {
			if err := r.uninstall(cfg, obj, false, "purge"); err != nil {
				return nil, acted, r.failed(st, obj, ReasonInstallFailed, "removing the failed release before installing again: %v", err)
			}
		}
		if rel, rendered, err = r.install(ctx, cfg, obj, in, forms); errors.Is(err, errHistoryChanged) {
			return nil, acted, err
		} else if err != nil {
			return nil, acted, r.failed(st, obj, ReasonInstallFailed, "%v", err)
		}
		r.event(obj, corev1.EventTypeNormal, ReasonInstallSuccessful, "Install", "installed release %s revision %d (chart %s)", rel.Name, rel.Version, chartRef(rel))
	case stepUpgrade:
		acted = "upgrade"
		if p.MarkFailed > 0 {
			if err := markFailed(cfg, obj.GetName(), p.MarkFailed); err != nil {
				return nil, acted, r.failed(st, obj, ReasonUpgradeFailed, "%v", err)
			}
		}
		deployed := lastDeployed(hist)
		if deployed == nil {
			return nil, acted, fmt.Errorf("release %s has no deployed revision to upgrade from", obj.GetName())
		}
		rel, rendered, err = r.upgrade(ctx, cfg, obj, in)
		if err != nil {
			msg := fmt.Sprintf("upgrade of release %s failed: %v", obj.GetName(), err)
			if ctx.Err() != nil {
				// Shutting down mid-upgrade: the next leader recovers the
				// pending revision.
				return nil, acted, errors.New(msg)
			}
			if rel != nil {
				if rbErr := r.rollback(cfg, obj, deployed.Version); rbErr != nil {
					return nil, acted, r.failed(st, obj, ReasonRollbackFailed, "%s; rollback to revision %d failed: %v", msg, deployed.Version, rbErr)
				}
				msg += fmt.Sprintf("; rolled back to revision %d", deployed.Version)
				r.event(obj, corev1.EventTypeWarning, ReasonRollbackSuccessful, "Rollback", "%s", msg)
				if cur, err := cfg.Releases.Deployed(obj.GetName()); err == nil {
					if rs, err := r.remember(obj, cur, nil); err == nil {
						c := r.entry.Chart.Metadata
						st.deployed = &DeployedRelease{Name: obj.GetName(), Revision: rs.revision, Chart: c.Name, Version: c.Version, Digest: rs.digest}
					}
				}
			}
			return nil, acted, r.failed(st, obj, ReasonUpgradeFailed, "%s", msg)
		}
		r.event(obj, corev1.EventTypeNormal, ReasonUpgradeSuccessful, "Upgrade", "upgraded release %s to revision %d (chart %s)", rel.Name, rel.Version, chartRef(rel))
	}

	if p.Step != stepNone || rs == nil || rs.revision != rel.Version {
		// (A release this process already remembers keeps what it learned
		// of its objects: the server's forms and the verified versions.)
		if rs, err = r.remember(obj, rel, rendered); err != nil {
			return nil, acted, err
		}
	}
	rs.adoptServerForms(forms)
	rs.base = in.Digest
	reason := ReasonUpToDate
	switch p.Step {
	case stepInstall:
		reason = ReasonInstallSuccessful
	case stepUpgrade:
		reason = ReasonUpgradeSuccessful
	}
	r.markDeployed(st, obj, rs, reason, "release %s revision %d is deployed")
	return rs, acted, nil
}

// errHistoryChanged: an install found a release revision that the history
// it read did not show; nothing was written, and a retry reads the history
// from the API server.
var errHistoryChanged = errors.New("the release history changed while installing; retrying")

// mustListHistory says the history of obj is read from the API server even
// when the cache shows no release Secret: a release without the engine's
// label (written by the helm CLI or another operator) is not in the cache.
func (r *Reconciler) mustListHistory(obj *unstructured.Unstructured) bool {
	_, ok := r.listHistory.Load(obj.GetUID())
	return ok
}

func (r *Reconciler) markDeployed(st *status, obj *unstructured.Unstructured, rs *releaseState, reason Reason, format string) {
	c := r.entry.Chart.Metadata
	st.deployed = &DeployedRelease{Name: obj.GetName(), Revision: rs.revision, Chart: c.Name, Version: c.Version, Digest: rs.digest}
	if reason != ReasonUpToDate || !st.isTrue(TypeDeployed) {
		st.set(TypeDeployed, metav1.ConditionTrue, reason, format, obj.GetName(), rs.revision)
	}
	st.set(TypeReleaseFailed, metav1.ConditionFalse, ReasonReleaseSucceeded, "the last Helm action succeeded")
}

// failed records a failed Helm action and returns it as an error.
func (r *Reconciler) failed(st *status, obj *unstructured.Unstructured, reason Reason, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(reason)).Inc()
	st.set(TypeReleaseFailed, metav1.ConditionTrue, reason, "%s", msg)
	if reason == ReasonInstallFailed {
		st.set(TypeDeployed, metav1.ConditionFalse, reason, "%s", msg)
		st.deployed = nil
	}
	r.event(obj, corev1.EventTypeWarning, reason, "Reconcile", "%s", msg)
	return errors.New(msg)
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
func (r *Reconciler) install(ctx context.Context, cfg *action.Configuration, obj *unstructured.Unstructured, in render.Inputs, forms *serverForms) (*release.Release, []*unstructured.Unstructured, error) {
	i := action.NewInstall(cfg)
	i.ReleaseName = obj.GetName()
	i.Namespace = obj.GetNamespace()
	i.Replace = true
	i.Timeout = r.opts.ActionTimeout
	i.Labels = releaseLabels(in)
	pr := r.postRenderer(ctx, obj, in, i.Labels)
	pr.absent = r.cachedAbsent
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
func (r *Reconciler) upgrade(ctx context.Context, cfg *action.Configuration, obj *unstructured.Unstructured, in render.Inputs) (*release.Release, []*unstructured.Unstructured, error) {
	u := action.NewUpgrade(cfg)
	u.Namespace = obj.GetNamespace()
	u.MaxHistory = maxHistory
	u.Timeout = r.opts.ActionTimeout
	u.Labels = releaseLabels(in)
	u.Force = boolAnnotation(obj, AnnotationUpgradeForce)
	pr := r.postRenderer(ctx, obj, in, u.Labels)
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

// reconcileDelete uninstalls the release and releases the finalizer; with
// uninstall-wait, only once every object of the release is gone.
func (r *Reconciler) reconcileDelete(ctx context.Context, obj *unstructured.Unstructured, st *status) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, Finalizer) {
		return reconcile.Result{}, nil
	}
	cfg, err := r.actions.forResource(obj, helmLog(ctx))
	if err != nil {
		return reconcile.Result{}, err
	}
	if boolAnnotation(obj, AnnotationUninstallWait) {
		last, err := cfg.Releases.Last(obj.GetName())
		if err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
			return reconcile.Result{}, fmt.Errorf("reading release: %w", err)
		}
		if last != nil {
			if last.Info.Status != release.StatusUninstalled {
				if err := r.uninstall(cfg, obj, true, "uninstall"); err != nil {
					return reconcile.Result{}, r.uninstallFailed(ctx, obj, st, err)
				}
				r.event(obj, corev1.EventTypeNormal, ReasonUninstallSuccessful, "Uninstall", "uninstalled release %s; waiting for its objects to be gone", obj.GetName())
			}
			remaining, err := r.remainingObjects(ctx, last)
			if err != nil {
				return reconcile.Result{}, err
			}
			if len(remaining) > 0 {
				st.set(TypeDeployed, metav1.ConditionFalse, ReasonUninstallWaiting, "uninstalled; waiting for %d objects to be deleted: %s", len(remaining), strings.Join(remaining, ", "))
				if err := r.writeStatus(ctx, obj, st); err != nil {
					return reconcile.Result{}, err
				}
				return reconcile.Result{RequeueAfter: uninstallWaitPoll}, nil
			}
			if err := r.uninstall(cfg, obj, false, "purge"); err != nil {
				return reconcile.Result{}, r.uninstallFailed(ctx, obj, st, err)
			}
		}
	} else {
		if err := r.uninstall(cfg, obj, false, "uninstall"); err != nil {
			return reconcile.Result{}, r.uninstallFailed(ctx, obj, st, err)
		}
		r.event(obj, corev1.EventTypeNormal, ReasonUninstallSuccessful, "Uninstall", "uninstalled release %s", obj.GetName())
	}
	patch := client.MergeFrom(obj.DeepCopy())
	controllerutil.RemoveFinalizer(obj, Finalizer)
	if err := r.client.Patch(ctx, obj, patch); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("removing finalizer: %w", err)
	}
	r.states.Delete(client.ObjectKeyFromObject(obj))
	r.listHistory.Delete(obj.GetUID())
	r.live.forget(client.ObjectKeyFromObject(obj))
	return reconcile.Result{}, nil
}

func (r *Reconciler) uninstallFailed(ctx context.Context, obj *unstructured.Unstructured, st *status, err error) error {
	msg := fmt.Sprintf("uninstall of release %s failed: %v", obj.GetName(), err)
	reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(ReasonUninstallFailed)).Inc()
	st.set(TypeReleaseFailed, metav1.ConditionTrue, ReasonUninstallFailed, "%s", msg)
	r.event(obj, corev1.EventTypeWarning, ReasonUninstallFailed, "Uninstall", "%s", msg)
	if werr := r.writeStatus(ctx, obj, st); werr != nil {
		logr.FromContextOrDiscard(ctx).Error(werr, "writing status")
	}
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

// writeStatus writes .status if it changed.
func (r *Reconciler) writeStatus(ctx context.Context, obj *unstructured.Unstructured, st *status) error {
	s, changed, err := st.build()
	if err != nil || !changed {
		return err
	}
	obj.Object["status"] = s
	if err := r.client.Status().Update(ctx, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		if apierrors.IsConflict(err) {
			return fmt.Errorf("writing status: %w: %w", errStaleStatus, err)
		}
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

// errStaleStatus: the status write found a newer resource than the one the
// reconcile read; the reconcile is retried, without reporting an error.
var errStaleStatus = errors.New("the resource changed since it was read")

// staleStatusRetry is how soon a reconcile whose status write met a newer
// resource runs again: the cache is normally that far behind at most.
const staleStatusRetry = 100 * time.Millisecond

func (r *Reconciler) event(obj *unstructured.Unstructured, eventType string, reason Reason, action, format string, args ...any) {
	r.recorder.Eventf(obj, nil, eventType, string(reason), action, format, args...)
}

// reconcilePeriod is the resource's annotation, else the entry's period,
// else the operator's.
func (r *Reconciler) reconcilePeriod(obj *unstructured.Unstructured) (time.Duration, error) {
	if v, ok := obj.GetAnnotations()[AnnotationReconcilePeriod]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("annotation %s=%q is not a non-negative Go duration such as 5m", AnnotationReconcilePeriod, v)
		}
		return d, nil
	}
	if r.entry.ReconcilePeriod > 0 {
		return r.entry.ReconcilePeriod, nil
	}
	return r.opts.ReconcilePeriod, nil
}

func boolAnnotation(obj client.Object, key string) bool {
	v, err := strconv.ParseBool(obj.GetAnnotations()[key])
	return err == nil && v
}

// helmLog sends Helm's debug output to the reconcile's logger at V(1).
func helmLog(ctx context.Context) action.DebugLog {
	log := logr.FromContextOrDiscard(ctx).WithName("helm").V(1)
	return func(format string, args ...any) {
		if log.Enabled() {
			log.Info(fmt.Sprintf(format, args...))
		}
	}
}
