package lifecycle_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/plugin"
)

// ownershipSpec has an application with a lifecycle (the chart leaves its
// replicas to the lifecycle leader) and one without (scaling.replicas is
// the chart's, and the operator's drift repair restores it).
const ownershipSpec = `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: own}
spec:
  gateway: {replicas: 1}
  applications:
    elastic:
      model: {source: "https://example.com/m.gguf", file: m.gguf}
      runtime: {engine: simulator}
      lifecycle: {minReplicas: 0, maxReplicas: 3, zeroAfter: 10m}
    fixed:
      model: {source: "https://example.com/m.gguf", file: m.gguf}
      runtime: {engine: simulator}
      scaling: {replicas: 1}
`

// TestUpgradesAndDriftRepairNeverResetLifecycleReplicas runs the operator
// on a real API server: the replica count the lifecycle leader wrote
// survives an upgrade of the release, drift repair of the StatefulSet and
// a restart of the operator followed by another upgrade. The application
// without a lifecycle shows that the same writes are reset when the chart
// owns the count.
func TestUpgradesAndDriftRepairNeverResetLifecycleReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local control plane")
	}
	bin := os.Getenv(localcluster.EnvBinDir)
	if bin == "" {
		bin = filepath.Join(moduleRoot(t), "bin")
	}
	if _, err := os.Stat(filepath.Join(bin, "kube-apiserver")); err != nil {
		t.Skipf("needs the pinned Kubernetes binaries from `make tools` in %s", bin)
	}
	cluster := localcluster.StartForTest(t, localcluster.Options{})
	cfg := cluster.Config()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(operator.ModelOrchestraCRD(), crd); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := k8s.Get(ctx, types.NamespacedName{Name: crd.Name}, got); err != nil {
			return fmt.Errorf("getting the CRD: %w", err)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("the CRD %s is not established", crd.Name)
	})
	const ns = "lifecycle-own"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // no ./watches.yaml: the embedded one is used, as in the image
	stopOperator := startOperator(t, cfg, ns)

	mo := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(ownershipSpec), &mo.Object); err != nil {
		t.Fatal(err)
	}
	mo.SetNamespace(ns)
	if err := k8s.Create(ctx, mo); err != nil {
		t.Fatalf("creating the resource: %v", err)
	}
	waitRevision(t, k8s, ns, 1)

	replicas := func(name string) int32 {
		sts, err := cs.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return *sts.Spec.Replicas
	}
	// The lifecycle leader's writes (the same call it makes).
	if err := lifecycle.Scale(ctx, cs, ns, "own-elastic", 3); err != nil {
		t.Fatal(err)
	}
	if err := lifecycle.Scale(ctx, cs, ns, "own-fixed", 3); err != nil {
		t.Fatal(err)
	}
	// Drift repair restores what the chart renders, and only that.
	eventually(t, 60*time.Second, func() error {
		if n := replicas("own-fixed"); n != 1 {
			return fmt.Errorf("drift repair has not restored the chart's replicas: own-fixed has %d, want 1", n)
		}
		return nil
	})
	if n := replicas("own-elastic"); n != 3 {
		t.Fatalf("after drift repair own-elastic has %d replicas, want the lifecycle's 3", n)
	}

	// An upgrade: an unrelated field changes.
	patchSpec(t, k8s, ns, `{"spec":{"applications":{"elastic":{"serving":{"maxConcurrency":8}}}}}`)
	waitRevision(t, k8s, ns, 2)
	if n := replicas("own-elastic"); n != 3 {
		t.Fatalf("after an upgrade own-elastic has %d replicas, want the lifecycle's 3", n)
	}

	// The lifecycle scales to zero; the operator restarts and upgrades.
	if err := lifecycle.Scale(ctx, cs, ns, "own-elastic", 0); err != nil {
		t.Fatal(err)
	}
	stopOperator()
	startOperator(t, cfg, ns)
	patchSpec(t, k8s, ns, `{"spec":{"applications":{"elastic":{"serving":{"maxConcurrency":6}}}}}`)
	waitRevision(t, k8s, ns, 3)
	// The reconcile that deployed revision 3 also ran drift repair.
	sts, err := cs.AppsV1().StatefulSets(ns).Get(ctx, "own-elastic", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := *sts.Spec.Replicas; n != 0 {
		t.Fatalf("after an operator restart and an upgrade own-elastic has %d replicas, want the lifecycle's 0", n)
	}
	for _, mf := range sts.ManagedFields {
		if mf.Manager == lifecycle.FieldManager && mf.Subresource == "scale" {
			return
		}
	}
	t.Errorf("spec.replicas of own-elastic is not managed by %s through the scale subresource: %+v", lifecycle.FieldManager, sts.ManagedFields)
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := localcluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// startOperator runs the operator as cmd/orchestra-operator configures it,
// watching ns; stop ends it (also at the end of the test).
func startOperator(t *testing.T, cfg *rest.Config, ns string) (stop func()) {
	t.Helper()
	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	mc := manager.Default()
	mc.WatchNamespaces = []string{ns}
	mc.MetricsAddr, mc.ProbeAddr = "0", "0"
	entries, err := manager.LoadWatches(mc, reg, operator.FS, operator.WatchesFile)
	if err != nil {
		t.Fatal(err)
	}
	// A restarted operator in the same process registers its controller
	// again.
	mgr, err := manager.New(cfg, mc, entries, func(o *ctrl.Options) {
		skip := true
		o.Controller.SkipNameValidation = &skip
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("operator: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func patchSpec(t *testing.T, k8s client.Client, ns, patch string) {
	t.Helper()
	mo := &unstructured.Unstructured{}
	mo.SetAPIVersion("modelorchestra.io/v1alpha1")
	mo.SetKind("ModelOrchestra")
	mo.SetNamespace(ns)
	mo.SetName("own")
	if err := k8s.Patch(context.Background(), mo, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// waitRevision waits until release revision rev of the resource is
// deployed.
func waitRevision(t *testing.T, k8s client.Client, ns string, rev int64) {
	t.Helper()
	eventually(t, 120*time.Second, func() error {
		got := &unstructured.Unstructured{}
		got.SetAPIVersion("modelorchestra.io/v1alpha1")
		got.SetKind("ModelOrchestra")
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "own"}, got); err != nil {
			return fmt.Errorf("getting the ModelOrchestra: %w", err)
		}
		if have, _, _ := unstructured.NestedInt64(got.Object, "status", "deployedRelease", "revision"); have < rev {
			b, _ := json.Marshal(got.Object["status"])
			return fmt.Errorf("release revision %d is not deployed yet; status: %s", rev, b)
		}
		return nil
	})
}
