package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/operator-framework/api/crds"
	apiv2 "github.com/operator-framework/api/pkg/operators/v2"
	"github.com/operator-framework/operator-lib/conditions"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/model-orchestra/operator/internal/manager"
)

// olmCondition does what operator-lib's in-cluster condition does (get the
// OperatorCondition, meta.SetStatusCondition on spec.conditions, update),
// for a namespace given here: operator-lib's factory reads the namespace
// from the pod's service account files, which a test process has not.
type olmCondition struct {
	c   client.Client
	key client.ObjectKey
}

func (o olmCondition) Get(ctx context.Context) (*metav1.Condition, error) {
	oc := &apiv2.OperatorCondition{}
	if err := o.c.Get(ctx, o.key, oc); err != nil {
		return nil, err
	}
	return meta.FindStatusCondition(oc.Spec.Conditions, apiv2.Upgradeable), nil
}

func (o olmCondition) Set(ctx context.Context, status metav1.ConditionStatus, opts ...conditions.Option) error {
	oc := &apiv2.OperatorCondition{}
	if err := o.c.Get(ctx, o.key, oc); err != nil {
		return err
	}
	c := metav1.Condition{Type: apiv2.Upgradeable, Status: status}
	for _, opt := range opts {
		opt(&c)
	}
	meta.SetStatusCondition(&oc.Spec.Conditions, c)
	return o.c.Update(ctx, oc)
}

// TestUpgradeableReporterFollowsHelmReleases installs OLM's OperatorCondition
// CRD on the local control plane and checks that the operator reports
// Upgradeable=False while a release Secret says a Helm action is in flight,
// and True once it settles.
func TestUpgradeableReporterFollowsHelmReleases(t *testing.T) {
	cfg := needCluster(t)
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, apiv2.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	createCRD(t, k8s, crds.OperatorCondition())
	ctx := context.Background()
	for _, ns := range []string{"upg-operator", "upg-apps"} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	oc := &apiv2.OperatorCondition{ObjectMeta: metav1.ObjectMeta{Name: "orchestra-operator.v1.0.0", Namespace: "upg-operator"}}
	if err := k8s.Create(ctx, oc); err != nil {
		t.Fatal(err)
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache:                  cache.Options{DefaultLabelSelector: labels.SelectorFromSet(labels.Set{"app.kubernetes.io/managed-by": "Helm"})},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Add(manager.NewUpgradeableReporter(mgr, olmCondition{c: k8s, key: client.ObjectKeyFromObject(oc)})); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	expect := func(status metav1.ConditionStatus, reason, message string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			got := &apiv2.OperatorCondition{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(oc), got); err != nil {
				return err
			}
			c := meta.FindStatusCondition(got.Spec.Conditions, apiv2.Upgradeable)
			if c == nil {
				return errors.New("no Upgradeable condition")
			}
			if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, message) {
				return fmt.Errorf("want Upgradeable=%s %s %q, have %s", status, reason, message, c.String())
			}
			return nil
		})
	}
	expect(metav1.ConditionTrue, manager.ReasonNoReleasePending, "no Helm release is pending")

	release := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.chat.v2", Namespace: "upg-apps", Labels: map[string]string{
			"owner": "helm", "name": "chat", "status": "pending-upgrade", "version": "2", "app.kubernetes.io/managed-by": "Helm",
		}},
		Type: "helm.sh/release.v1",
	}
	if err := k8s.Create(ctx, release); err != nil {
		t.Fatal(err)
	}
	expect(metav1.ConditionFalse, manager.ReasonReleasePending, "upg-apps/chat is pending-upgrade (revision 2)")

	release.Labels["status"] = "deployed"
	if err := k8s.Update(ctx, release); err != nil {
		t.Fatal(err)
	}
	expect(metav1.ConditionTrue, manager.ReasonNoReleasePending, "no Helm release is pending")
}
