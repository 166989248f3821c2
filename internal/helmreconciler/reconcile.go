package helmreconciler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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
			r.failures.Delete(req.NamespacedName)
			r.live.forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("getting %s %s: %w", r.entry.GVK.Kind, req.NamespacedName, err)
	}
	if r.entry.Selector != nil && !r.entry.Selector.Matches(labelsOf(obj)) {
		r.live.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	// The status is collected in st during the reconcile and written once,
	// when it returns, if it changed. The write runs before the background
	// release write is waited for, so that the two overlap.
	st := statusFrom(obj)
	report := true // whether st is written
	finalized := func() error { return nil }
	bg := &backgroundWrites{}
	defer func() {
		if werr := bg.wait(); werr != nil && err == nil {
			err = werr
		}
	}()
	defer func() {
		if !report {
			return
		}
		if ferr := finalized(); ferr != nil {
			// Nothing is reported before the finalizer is on.
			result, err = reconcile.Result{}, ferr
			return
		}
		switch werr := r.writeStatus(ctx, obj, st); {
		case werr == nil:
		case err == nil:
			result, err = reconcile.Result{}, werr
		default:
			log.Error(werr, "writing status")
		}
	}()

	if obj.GetDeletionTimestamp() != nil {
		outcome = "uninstall"
		result, report, err = r.reconcileDelete(ctx, obj, st)
		return result, err
	}
	if boolAnnotation(obj, AnnotationPauseReconcile) {
		outcome = "paused"
		st.set(TypePaused, metav1.ConditionTrue, ReasonPaused,
			"reconciliation is paused by annotation %s; remove it or set it to \"false\" to resume", AnnotationPauseReconcile)
		return reconcile.Result{}, nil
	}
	meta.RemoveStatusCondition(&st.conditions, TypePaused)

	// The finalizer is added when the release needs it (finalizer.go):
	// before Helm writes the first object, and waited for before anything
	// is reported. uninstall-wait always needs it; its patch runs while the
	// inputs are prepared and the history is read.
	fin := r.newFinalizerGate(ctx, obj)
	if fin.uninstallWait {
		fin.start()
	}
	finalized = fin.wait
	st.set(TypeInitialized, metav1.ConditionTrue, ReasonInitialized, "the %s engine serves this resource", r.entry.Chart.Name())

	period, err := r.reconcilePeriod(obj)
	if err != nil {
		if err := finalized(); err != nil {
			return reconcile.Result{}, err
		}
		outcome = "invalid"
		st.set(TypeIrreconcilable, metav1.ConditionTrue, ReasonReconcileError, "%v", err)
		reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(ReasonReconcileError)).Inc()
		return reconcile.Result{}, nil
	}

	in, err := render.Prepare(plugin.WithReader(ctx, r.client), r.entry, obj)
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
		r.irreconcilable(obj, st, ReasonValuesInvalid, err)
		// Nothing changes until the resource does, which the watch reports.
		return reconcile.Result{}, nil
	}

	rs, acted, err := r.ensureRelease(ctx, obj, in, st, fin, bg)
	if errors.Is(err, errPreviousRelease) {
		// A resource of the same name was deleted without an uninstall
		// (it had no finalizer): the garbage collector is removing its
		// release. Installing now would take over objects it is deleting.
		outcome = "waiting"
		st.set(TypeDeployed, metav1.ConditionFalse, ReasonPreviousRelease, "%v", err)
		return reconcile.Result{RequeueAfter: previousReleasePoll}, nil
	}
	if bo := (*errBackingOff)(nil); errors.As(err, &bo) {
		outcome = "backoff"
		return reconcile.Result{RequeueAfter: bo.wait}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := finalized(); err != nil {
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
	return reconcile.Result{RequeueAfter: period}, nil
}

// irreconcilable reports that the resource cannot be reconciled as it is,
// with an event when the reason is new.
func (r *Reconciler) irreconcilable(obj *unstructured.Unstructured, st *status, reason Reason, err error) {
	reconcileFailures.WithLabelValues(r.entry.GVK.Kind, string(reason)).Inc()
	msg := err.Error()
	if !st.isTrue(TypeIrreconcilable) || conditionMessage(st, TypeIrreconcilable) != msg {
		r.event(obj, corev1.EventTypeWarning, reason, "Render", "%s", msg)
	}
	st.set(TypeIrreconcilable, metav1.ConditionTrue, reason, "%s", msg)
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
		if ref := metav1.GetControllerOfNoCopy(&s); ref != nil && ref.UID != obj.GetUID() && ref.Kind == obj.GetKind() {
			return revisionInfo{}, false, fmt.Errorf("%w (release Secret %s, owner uid %s)", errPreviousRelease, s.GetName(), ref.UID)
		}
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
func (r *Reconciler) ensureRelease(ctx context.Context, obj *unstructured.Unstructured, in render.Inputs, st *status, fin *finalizerGate, bg *backgroundWrites) (_ *releaseState, _ string, retErr error) {
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

	// No Helm action writes an object before the finalizer is on, when
	// the release needs it: a deletion must uninstall what it creates.
	forms := &serverForms{}
	cfg, err := r.actions.forReconcile(obj, helmLog(ctx), actionOptions{
		beforeWrite: fin.beforeWrite,
		stored:      fin.stored,
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
	if p.Step != stepNone {
		if err := r.backingOff(obj, want, time.Now()); err != nil {
			return nil, "", err
		}
		defer func() { r.noteAction(obj, want, retErr, time.Now()) }()
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
		if rel, rendered, err = r.install(ctx, cfg, obj, in, forms, fin); errors.Is(err, errHistoryChanged) {
			return nil, acted, err
		} else if err != nil {
			return nil, acted, r.failed(st, obj, ReasonInstallFailed, "%v", err)
		}
		// No event: the Deployed condition (reason InstallSuccessful, with
		// its transition time) tells it, and an event would be one more
		// write to the API server per install. Events are kept for what a
		// condition does not keep: upgrades, rollbacks, recoveries,
		// repairs and failures.
	case stepUpgrade:
		acted = "upgrade"
		if rel, rendered, err = r.upgradeOrRollback(ctx, cfg, obj, in, st, hist, p.MarkFailed, fin); err != nil {
			return nil, acted, err
		}
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

// upgradeOrRollback upgrades the release of obj from its latest deployed
// revision in hist, after marking failed the revision that an interrupted
// action left pending (pending > 0). An upgrade that failed after storing
// its revision is rolled back to the deployed one, which st then reports.
// It also returns the objects of the rendered manifest (the new
// revision's), or nil.
func (r *Reconciler) upgradeOrRollback(ctx context.Context, cfg *action.Configuration, obj *unstructured.Unstructured, in render.Inputs, st *status, hist []*release.Release, pending int, fin *finalizerGate) (*release.Release, []*unstructured.Unstructured, error) {
	if pending > 0 {
		if err := markFailed(cfg, obj.GetName(), pending); err != nil {
			return nil, nil, r.failed(st, obj, ReasonUpgradeFailed, "%v", err)
		}
	}
	deployed := lastDeployed(hist)
	if deployed == nil {
		return nil, nil, fmt.Errorf("release %s has no deployed revision to upgrade from", obj.GetName())
	}
	rel, rendered, err := r.upgrade(ctx, cfg, obj, in, fin)
	if err == nil {
		r.event(obj, corev1.EventTypeNormal, ReasonUpgradeSuccessful, "Upgrade", "upgraded release %s to revision %d (chart %s)", rel.Name, rel.Version, chartRef(rel))
		return rel, rendered, nil
	}
	msg := fmt.Sprintf("upgrade of release %s failed: %v", obj.GetName(), err)
	if ctx.Err() != nil {
		// Shutting down mid-upgrade: the next leader recovers the pending
		// revision.
		return nil, nil, errors.New(msg)
	}
	if rel != nil {
		if rbErr := r.rollback(cfg, obj, deployed.Version); rbErr != nil {
			return nil, nil, r.failed(st, obj, ReasonRollbackFailed, "%s; rollback to revision %d failed: %v", msg, deployed.Version, rbErr)
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
	return nil, nil, r.failed(st, obj, ReasonUpgradeFailed, "%s", msg)
}

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

func (r *Reconciler) event(obj *unstructured.Unstructured, eventType string, reason Reason, action, format string, args ...any) {
	r.recorder.Eventf(obj, nil, eventType, string(reason), action, "%s", eventNote(fmt.Sprintf(format, args...)))
}

// maxEventNote is the longest note the API server accepts in an
// events.k8s.io/v1 Event (validation: "can have at most 1024 characters").
const maxEventNote = 1024

// eventNote shortens a message to what an Event can hold, cut at a rune
// boundary and marked, so that a long error (a Helm failure listing every
// object) still gets its event; the status condition keeps all of it.
func eventNote(msg string) string {
	if len(msg) <= maxEventNote {
		return msg
	}
	const more = " … (cut; the resource's status conditions hold the whole message)"
	cut := maxEventNote - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
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
