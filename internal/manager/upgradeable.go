package manager

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apiv2 "github.com/operator-framework/api/pkg/operators/v2"
	"github.com/operator-framework/operator-lib/conditions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/model-orchestra/operator/internal/helmreconciler"
)

// OLM's Upgradeable condition.
//
// Under OLM, each operator has an OperatorCondition object named after its
// CSV, which OLM names in the OPERATOR_CONDITION_NAME variable of the
// operator's pod. While its spec.conditions hold Upgradeable=False, OLM does
// not replace the operator with a newer version. The operator reports it
// False while a Helm action (install, upgrade, rollback, uninstall) runs in
// it, and while any Helm release in its namespaces is pending (an action a
// crash left unfinished) or being uninstalled, so that an upgrade of the
// operator does not interrupt a Helm action; True otherwise.
//
// The reporter learns of the running actions from the engine
// (helmreconciler.ActionTracker) and watches the release Secrets through
// the manager's cache (the same informer the engine reads its history
// from: Helm's owner=helm and status labels). It sets the condition with
// operator-lib's conditions package.

// Condition reasons of Upgradeable.
const (
	ReasonActionInFlight   = "HelmActionInFlight"
	ReasonReleasePending   = "HelmReleasePending"
	ReasonNoReleasePending = "NoHelmReleasePending"
)

// EnvOperatorConditionName is set by OLM to the operator's OperatorCondition.
const EnvOperatorConditionName = "OPERATOR_CONDITION_NAME"

// inFlight are the Helm release statuses of an action that has not
// finished.
var inFlight = map[string]bool{
	"pending-install":  true,
	"pending-upgrade":  true,
	"pending-rollback": true,
	"uninstalling":     true,
}

const (
	// upgradeableRetry is how soon a failed update of the condition is
	// retried.
	upgradeableRetry = 5 * time.Second
	// upgradeableCoalesce is the least time between two writes of the
	// condition, except a write that makes it False, which is made at
	// once: a burst of actions writes it False once, then at most once
	// per interval while the message changes, and True once the burst is
	// over.
	upgradeableCoalesce = 5 * time.Second
)

// runningActions is the engine's helmreconciler.ActionTracker: the Helm
// actions running in this process.
type runningActions struct {
	mu      sync.Mutex
	running map[helmreconciler.HelmAction]int
	// changed has a value when running changed since the reporter last
	// read it.
	changed chan struct{}
}

func newRunningActions() *runningActions {
	return &runningActions{running: map[helmreconciler.HelmAction]int{}, changed: make(chan struct{}, 1)}
}

// ActionStarted counts a as running until the returned function is called.
func (a *runningActions) ActionStarted(h helmreconciler.HelmAction) (finished func()) {
	a.mu.Lock()
	a.running[h]++
	a.mu.Unlock()
	poke(a.changed)
	return sync.OnceFunc(func() {
		a.mu.Lock()
		if a.running[h]--; a.running[h] <= 0 {
			delete(a.running, h)
		}
		a.mu.Unlock()
		poke(a.changed)
	})
}

// list returns the running actions.
func (a *runningActions) list() []helmreconciler.HelmAction {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]helmreconciler.HelmAction, 0, len(a.running))
	for h := range a.running {
		out = append(out, h)
	}
	return out
}

// poke leaves a value in ch unless one is there.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// upgradeableReporter keeps OLM's Upgradeable condition in step with the
// Helm actions and releases. It is a manager.Runnable that runs on the
// leader.
type upgradeableReporter struct {
	cache     ctrlcache.Cache
	condition conditions.Condition
	actions   *runningActions
	log       logr.Logger
}

// addUpgradeableReporter adds the reporter to mgr when the operator runs
// under OLM (OPERATOR_CONDITION_NAME is set), with operator-lib's
// in-cluster condition factory, and returns the tracker the engine tells
// of its Helm actions. Otherwise it logs once, adds nothing and returns
// nil.
func addUpgradeableReporter(mgr manager.Manager) (helmreconciler.ActionTracker, error) {
	log := ctrl.Log.WithName("upgradeable")
	if os.Getenv(EnvOperatorConditionName) == "" {
		log.Info("not running under OLM (" + EnvOperatorConditionName + " is not set): the Upgradeable condition is not reported")
		return nil, nil
	}
	// The OperatorCondition is read and updated directly: OLM grants the
	// operator get/update on that one object, not list/watch.
	scheme := runtime.NewScheme()
	if err := apiv2.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: scheme, Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("client for the OperatorCondition: %w", err)
	}
	cond, err := conditions.InClusterFactory{Client: c}.NewCondition(apiv2.ConditionType(apiv2.Upgradeable))
	if err != nil {
		return nil, fmt.Errorf("OLM's Upgradeable condition: %w", err)
	}
	r := &upgradeableReporter{cache: mgr.GetCache(), condition: cond, actions: newRunningActions(), log: log}
	if err := mgr.Add(r); err != nil {
		return nil, err
	}
	return r.actions, nil
}

// NeedLeaderElection makes only the leader, which runs the Helm actions,
// report.
func (r *upgradeableReporter) NeedLeaderElection() bool { return true }

// Start reports the condition now and after every change of the running
// actions or of a release Secret, until ctx is done.
func (r *upgradeableReporter) Start(ctx context.Context) error {
	secrets := make(chan struct{}, 1)
	inf, err := r.cache.GetInformer(ctx, releaseSecretMeta())
	if err != nil {
		return fmt.Errorf("watching release Secrets: %w", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(secrets) },
		UpdateFunc: func(_, _ any) { poke(secrets) },
		DeleteFunc: func(any) { poke(secrets) },
	}); err != nil {
		return fmt.Errorf("watching release Secrets: %w", err)
	}
	poke(secrets)
	var applied *metav1.Condition
	var appliedAt time.Time
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-secrets:
		case <-r.actions.changed:
		case <-timer.C:
		}
		want, err := r.desired(ctx)
		if err != nil {
			r.log.Error(err, "computing OLM's Upgradeable condition; retrying", "in", upgradeableRetry)
			timer.Reset(upgradeableRetry)
			continue
		}
		now := time.Now()
		write, wait := nextWrite(applied, appliedAt, want, now)
		if !write {
			if wait > 0 {
				timer.Reset(wait)
			}
			continue
		}
		if err := r.condition.Set(ctx, want.Status, conditions.WithReason(want.Reason), conditions.WithMessage(want.Message)); err != nil {
			r.log.Error(err, "reporting OLM's Upgradeable condition; retrying", "in", upgradeableRetry)
			timer.Reset(upgradeableRetry)
			continue
		}
		r.log.Info("reported OLM's Upgradeable condition", "status", want.Status, "reason", want.Reason, "message", want.Message)
		applied, appliedAt = &want, now
	}
}

// nextWrite says whether want is written now, given the condition last
// written (nil: none yet) at appliedAt; when it is not but may be later,
// wait says when to ask again. A change to False is written at once,
// other changes no sooner than upgradeableCoalesce after the last write.
func nextWrite(applied *metav1.Condition, appliedAt time.Time, want metav1.Condition, now time.Time) (write bool, wait time.Duration) {
	switch {
	case applied == nil:
		return true, 0
	case applied.Status == want.Status && applied.Reason == want.Reason && applied.Message == want.Message:
		return false, 0
	case want.Status == metav1.ConditionFalse && applied.Status != metav1.ConditionFalse:
		return true, 0
	}
	if d := appliedAt.Add(upgradeableCoalesce).Sub(now); d > 0 {
		return false, d
	}
	return true, 0
}

// desired computes the condition from the running actions and the cached
// release Secrets.
func (r *upgradeableReporter) desired(ctx context.Context) (metav1.Condition, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := r.cache.List(ctx, list, client.MatchingLabels{"owner": "helm"}); err != nil {
		return metav1.Condition{}, fmt.Errorf("listing release Secrets: %w", err)
	}
	return upgradeableCondition(r.actions.list(), list.Items), nil
}

// upgradeableCondition is False while a Helm action runs or a release
// Secret is in an in-flight status, naming them (a running action first,
// and a pending record of a release no action of which runs), and True
// otherwise.
func upgradeableCondition(running []helmreconciler.HelmAction, secrets []metav1.PartialObjectMetadata) metav1.Condition {
	running = slices.Clone(running)
	slices.SortFunc(running, func(a, b helmreconciler.HelmAction) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Release, b.Release), cmp.Compare(a.Action, b.Action))
	})
	items := make([]string, 0, len(running))
	busy := map[string]bool{}
	for _, a := range running {
		items = append(items, fmt.Sprintf("%s of %s/%s is running", a.Action, a.Namespace, a.Release))
		busy[a.Namespace+"/"+a.Release] = true
	}
	var pending []string
	for _, s := range secrets {
		l := s.GetLabels()
		if l["owner"] == "helm" && inFlight[l["status"]] && !busy[s.GetNamespace()+"/"+l["name"]] {
			pending = append(pending, fmt.Sprintf("%s/%s is %s (revision %s)", s.GetNamespace(), l["name"], l["status"], l["version"]))
		}
	}
	sort.Strings(pending)
	items = append(items, pending...)
	if len(items) == 0 {
		return metav1.Condition{Type: apiv2.Upgradeable, Status: metav1.ConditionTrue, Reason: ReasonNoReleasePending, Message: "no Helm action is running and no Helm release is pending"}
	}
	reason := ReasonReleasePending
	if len(running) > 0 {
		reason = ReasonActionInFlight
	}
	const shown = 5
	msg := "Helm " + strings.Join(items[:min(len(items), shown)], ", ")
	if len(items) > shown {
		msg += fmt.Sprintf(" and %d more", len(items)-shown)
	}
	return metav1.Condition{Type: apiv2.Upgradeable, Status: metav1.ConditionFalse, Reason: reason, Message: msg + "; the operator must not be replaced until the Helm actions finish"}
}

// releaseSecretMeta is the metadata-only Secret the engine caches release
// Secrets as (internal/helmreconciler), so that the reporter shares its
// informer.
func releaseSecretMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}
