package manager

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
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
)

// OLM's Upgradeable condition.
//
// Under OLM, each operator has an OperatorCondition object named after its
// CSV, which OLM names in the OPERATOR_CONDITION_NAME variable of the
// operator's pod. While its spec.conditions hold Upgradeable=False, OLM does
// not replace the operator with a newer version. The operator reports it
// False while any Helm release in its namespaces is pending (an install,
// upgrade or rollback in flight, or one that a crash left unfinished) or
// being uninstalled, so that an upgrade of the operator never interrupts a
// Helm action, and True otherwise.
//
// The reporter watches the release Secrets through the manager's cache (the
// same informer the engine reads its history from: Helm's owner=helm and
// status labels), and sets the condition with operator-lib's conditions
// package.

// Condition reasons of Upgradeable.
const (
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

// upgradeableRetry is how soon a failed update of the condition is retried.
const upgradeableRetry = 5 * time.Second

// UpgradeableReporter keeps OLM's Upgradeable condition in step with the
// Helm releases. It is a manager.Runnable that runs on the leader.
type UpgradeableReporter struct {
	cache     ctrlcache.Cache
	condition conditions.Condition
	log       logr.Logger
}

// NewUpgradeableReporter reports Upgradeable through condition, reading the
// release Secrets from the cache of mgr.
func NewUpgradeableReporter(mgr manager.Manager, condition conditions.Condition) *UpgradeableReporter {
	return &UpgradeableReporter{
		cache:     mgr.GetCache(),
		condition: condition,
		log:       ctrl.Log.WithName("upgradeable"),
	}
}

// addUpgradeableReporter adds the reporter to mgr when the operator runs
// under OLM (OPERATOR_CONDITION_NAME is set), with operator-lib's
// in-cluster condition factory; otherwise it logs once and adds nothing.
func addUpgradeableReporter(mgr manager.Manager) error {
	log := ctrl.Log.WithName("upgradeable")
	if os.Getenv(EnvOperatorConditionName) == "" {
		log.Info("not running under OLM (" + EnvOperatorConditionName + " is not set): the Upgradeable condition is not reported")
		return nil
	}
	// The OperatorCondition is read and updated directly: OLM grants the
	// operator get/update on that one object, not list/watch.
	scheme := runtime.NewScheme()
	if err := apiv2.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: scheme, Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("client for the OperatorCondition: %w", err)
	}
	cond, err := conditions.InClusterFactory{Client: c}.NewCondition(apiv2.ConditionType(apiv2.Upgradeable))
	if err != nil {
		return fmt.Errorf("OLM's Upgradeable condition: %w", err)
	}
	return mgr.Add(NewUpgradeableReporter(mgr, cond))
}

// NeedLeaderElection makes only the leader, which runs the Helm actions,
// report.
func (r *UpgradeableReporter) NeedLeaderElection() bool { return true }

// Start reports the condition now and after every change of a release
// Secret, until ctx is done.
func (r *UpgradeableReporter) Start(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	inf, err := r.cache.GetInformer(ctx, releaseSecretMeta())
	if err != nil {
		return fmt.Errorf("watching release Secrets: %w", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(_, _ any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("watching release Secrets: %w", err)
	}
	poke()
	var applied *metav1.Condition
	retry := time.NewTimer(0)
	<-retry.C
	for {
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil
		case <-changed:
		case <-retry.C:
		}
		want, err := r.desired(ctx)
		if err == nil && applied != nil && applied.Status == want.Status && applied.Message == want.Message {
			continue
		}
		if err == nil {
			err = r.condition.Set(ctx, want.Status, conditions.WithReason(want.Reason), conditions.WithMessage(want.Message))
		}
		if err != nil {
			r.log.Error(err, "reporting OLM's Upgradeable condition; retrying", "in", upgradeableRetry)
			retry.Reset(upgradeableRetry)
			continue
		}
		r.log.Info("reported OLM's Upgradeable condition", "status", want.Status, "reason", want.Reason, "message", want.Message)
		applied = &want
	}
}

// desired computes the condition from the cached release Secrets.
func (r *UpgradeableReporter) desired(ctx context.Context) (metav1.Condition, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := r.cache.List(ctx, list, client.MatchingLabels{"owner": "helm"}); err != nil {
		return metav1.Condition{}, fmt.Errorf("listing release Secrets: %w", err)
	}
	return upgradeableCondition(list.Items), nil
}

// upgradeableCondition is False, naming the releases, while any release
// Secret is in an in-flight status, and True otherwise.
func upgradeableCondition(secrets []metav1.PartialObjectMetadata) metav1.Condition {
	var pending []string
	for _, s := range secrets {
		l := s.GetLabels()
		if l["owner"] == "helm" && inFlight[l["status"]] {
			pending = append(pending, fmt.Sprintf("%s/%s is %s (revision %s)", s.GetNamespace(), l["name"], l["status"], l["version"]))
		}
	}
	if len(pending) == 0 {
		return metav1.Condition{Type: apiv2.Upgradeable, Status: metav1.ConditionTrue, Reason: ReasonNoReleasePending, Message: "no Helm release is pending"}
	}
	sort.Strings(pending)
	const shown = 5
	msg := "Helm release " + strings.Join(pending[:min(len(pending), shown)], ", ")
	if len(pending) > shown {
		msg += fmt.Sprintf(" and %d more", len(pending)-shown)
	}
	return metav1.Condition{Type: apiv2.Upgradeable, Status: metav1.ConditionFalse, Reason: ReasonReleasePending, Message: msg + "; the operator must not be replaced until the Helm action finishes"}
}

// releaseSecretMeta is the metadata-only Secret the engine caches release
// Secrets as (internal/helmreconciler), so that the reporter shares its
// informer.
func releaseSecretMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}
