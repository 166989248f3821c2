package manager_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/operator-framework/api/crds"
	apiv2 "github.com/operator-framework/api/pkg/operators/v2"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/plugin"
)

// TestUpgradeableUnderOLM runs the operator as OLM does (the
// OperatorCondition CRD installed, OPERATOR_CONDITION_NAME set, the
// namespace in the service account file that operator-lib's in-cluster
// factory reads) and checks OLM's Upgradeable condition: False while Helm
// installs run, though a hookless install's release record already says
// deployed; True once they finish, after a bounded number of writes for a
// burst of installs; False while a release record is left pending (as a
// crash leaves it) and True once it settles.
func TestUpgradeableUnderOLM(t *testing.T) {
	cfg := needCluster(t)
	scheme := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, apiv2.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	createCRD(t, k8s, crds.OperatorCondition())
	others := &apiextensionsv1.CustomResourceDefinition{}
	data, err := os.ReadFile("testdata/others.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, others); err != nil {
		t.Fatal(err)
	}
	createCRD(t, k8s, others) // or finds it, made by another test
	ctx := context.Background()
	const operatorNS, appsNS = "upg-operator", "upg-apps"
	for _, ns := range []string{operatorNS, appsNS} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	oc := &apiv2.OperatorCondition{ObjectMeta: metav1.ObjectMeta{Name: "orchestra-operator.v1.0.0", Namespace: operatorNS}}
	if err := k8s.Create(ctx, oc); err != nil {
		t.Fatal(err)
	}
	t.Setenv(manager.EnvOperatorConditionName, oc.Name)

	// The operator's requests pass a gate that can hold the creation of
	// the releases' ConfigMaps (an install in flight), and its updates of
	// the OperatorCondition are counted.
	gate := &requestGate{open: make(chan struct{})}
	rc := rest.CopyConfig(cfg)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return gatedTransport{next: rt, gate: gate} })

	mc := manager.Default()
	mc.WatchNamespaces = []string{appsNS}
	mc.MetricsAddr, mc.ProbeAddr = "0", "0"
	mc.MaxConcurrentReconciles = 4
	mc.ChartsDir = "testdata"
	mc.WatchesFile = filepath.Join(t.TempDir(), "watches.yaml")
	if err := os.WriteFile(mc.WatchesFile, []byte(otherWatch), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err := manager.LoadWatches(mc, plugin.NewRegistry(), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	var mgr ctrl.Manager
	inServiceAccountNamespace(t, operatorNS, func() (err error) {
		mgr, err = manager.New(rc, mc, entries, func(o *ctrl.Options) { o.Controller.SkipNameValidation = ptr(true) })
		return err
	})
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		gate.release()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	expect := func(status metav1.ConditionStatus, reason string, message ...string) {
		t.Helper()
		eventually(t, 60*time.Second, func() error {
			got := &apiv2.OperatorCondition{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(oc), got); err != nil {
				return err
			}
			c := meta.FindStatusCondition(got.Spec.Conditions, apiv2.Upgradeable)
			if c == nil {
				return errors.New("no Upgradeable condition")
			}
			if c.Status != status || c.Reason != reason {
				return fmt.Errorf("want Upgradeable=%s %s, have %s", status, reason, c.String())
			}
			for _, m := range message {
				if !strings.Contains(c.Message, m) {
					return fmt.Errorf("message %q lacks %q", c.Message, m)
				}
			}
			return nil
		})
	}
	started := time.Now()
	expect(metav1.ConditionTrue, manager.ReasonNoReleasePending, "no Helm action is running and no Helm release is pending")

	// A burst of installs, held while they create their objects, started
	// one after the other: each start changes the message.
	const burst = 4
	for i := range burst {
		cr := &unstructured.Unstructured{}
		cr.SetAPIVersion("test.modelorchestra.io/v1")
		cr.SetKind("Other")
		cr.SetNamespace(appsNS)
		cr.SetName(fmt.Sprintf("burst-%d", i))
		cr.Object["spec"] = map[string]any{"color": "green"}
		if err := k8s.Create(ctx, cr); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, func() error {
			if n := gate.held.Load(); n <= int64(i) {
				return fmt.Errorf("%d of %d installs are creating their objects", n, i+1)
			}
			return nil
		})
	}
	expect(metav1.ConditionFalse, manager.ReasonActionInFlight, "install of upg-apps/burst-0 is running")
	// What the release records alone say: deployed, the install done.
	rec := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: appsNS, Name: "sh.helm.release.v1.burst-0.v1"}, rec); err != nil {
		t.Fatalf("the held install's release record: %v", err)
	}
	if s := rec.Labels["status"]; s != "deployed" {
		t.Fatalf("the held install's record is %q; this test expects a hookless install recorded deployed before its objects", s)
	}
	gate.release()
	expect(metav1.ConditionTrue, manager.ReasonNoReleasePending, "no Helm action is running and no Helm release is pending")
	// Written once True at start, once False, then at most once per
	// coalescing interval (5 s), the last True (one more for slack): not
	// at each start and end (1 + burst + at least 1).
	elapsed := time.Since(started)
	if n, most := gate.conditionWrites.Load(), int64(3+elapsed/(5*time.Second)); n > most {
		t.Errorf("the condition was written %d times in %s for a burst of %d installs, want at most %d", n, elapsed.Round(time.Second), burst, most)
	}
	for i := range burst {
		eventually(t, 30*time.Second, func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: appsNS, Name: fmt.Sprintf("burst-%d-other", i)}, &corev1.ConfigMap{})
		})
	}

	// A record left pending by an operator killed mid-upgrade.
	release := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.chat.v2", Namespace: appsNS, Labels: map[string]string{
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
	expect(metav1.ConditionTrue, manager.ReasonNoReleasePending, "no Helm action is running and no Helm release is pending")
}

// requestGate holds the creation of ConfigMaps until released and counts
// the updates of OperatorConditions.
type requestGate struct {
	open            chan struct{}
	once            sync.Once
	held            atomic.Int64
	conditionWrites atomic.Int64
}

type gatedTransport struct {
	next http.RoundTripper
	gate *requestGate
}

func (t gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	g := t.gate
	switch {
	case req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/configmaps"):
		g.held.Add(1)
		select {
		case <-g.open:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	case req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/operatorconditions/"):
		g.conditionWrites.Add(1)
	}
	return t.next.RoundTrip(req)
}

func (g *requestGate) release() { g.once.Do(func() { close(g.open) }) }

// inServiceAccountNamespace runs f where the service account file of a pod
// names ns (/var/run/secrets/kubernetes.io/serviceaccount/namespace), as
// operator-lib's in-cluster factory reads it: on an OS thread of its own in
// a private mount namespace, with a tmpfs on /var/run. Nothing else of the
// process sees it. The thread is then parked for the rest of the test
// process: it may be the one that started the control plane, whose
// processes die with it (Pdeathsig), and it cannot rejoin the others (its
// working directory is no longer shared with them). It needs root.
func inServiceAccountNamespace(t *testing.T, ns string, f func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: giving the test a pod's service account file needs a private mount namespace")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unsharing the mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("making the mounts private: %w", err)
			}
			if err := unix.Mount("tmpfs", "/var/run", "tmpfs", 0, "size=1m"); err != nil {
				return fmt.Errorf("mounting a tmpfs on /var/run: %w", err)
			}
			dir := "/var/run/secrets/kubernetes.io/serviceaccount"
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "namespace"), []byte(ns), 0o644); err != nil {
				return err
			}
			return f()
		}()
		select {}
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
