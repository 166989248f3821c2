package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/plugin"
)

// TestCheckpointPolicyIsWatched runs the operator as cmd/orchestra-operator
// configures it, with a resource that references a CheckpointPolicy that
// does not exist yet: the release deploys anyway and the status names the
// missing policy; creating the policy reconciles the resource at once (the
// resync period is an hour, and nothing else about the resource changes),
// and the status then says it is resolved.
func TestCheckpointPolicyIsWatched(t *testing.T) {
	cfg := needCluster(t)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, data := range [][]byte{operator.ModelOrchestraCRD(), operator.CheckpointPolicyCRD()} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			t.Fatal(err)
		}
		createCRD(t, k8s, crd)
	}
	ns := "orchestra-policy"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	mc := manager.Default()
	mc.WatchNamespaces = []string{ns}
	mc.MetricsAddr, mc.ProbeAddr = "0", "0"
	mc.ReconcilePeriod = time.Hour
	mc.RelatedWatches = []manager.RelatedWatch{{Owner: v1alpha1.GroupVersionKind, Kind: orchestra.CheckpointPolicyGVK, Map: orchestra.PolicyReferrers}}
	t.Chdir(t.TempDir())
	entries, err := manager.LoadWatches(mc, reg, operator.FS, operator.WatchesFile)
	if err != nil {
		t.Fatal(err)
	}
	// Another test of the package serves the same kind in this process:
	// controller names are unique per process unless told otherwise.
	mgr, err := manager.New(cfg, mc, entries, func(o *ctrl.Options) { o.Controller.SkipNameValidation = ptr(true) })
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	mo := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(`
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: policed}
spec:
  gateway: {replicas: 1}
  applications:
    chat:
      model: {source: "https://example.com/m.gguf", format: gguf, file: m.gguf, cache: {size: 1Gi}}
      runtime: {engine: simulator}
      lifecycle: {minReplicas: 1, checkpointPolicy: fast}
`), &mo.Object); err != nil {
		t.Fatal(err)
	}
	mo.SetNamespace(ns)
	if err := k8s.Create(ctx, mo); err != nil {
		t.Fatalf("creating the resource: %v", err)
	}
	condition := func(typ string) (map[string]any, string) {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(v1alpha1.GroupVersionKind)
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "policed"}, got); err != nil {
			return nil, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == typ {
				return m, ""
			}
		}
		b, _ := json.Marshal(got.Object["status"])
		return nil, string(b)
	}
	eventually(t, 120*time.Second, func() error {
		deployed, status := condition(v1alpha1.ConditionDeployed)
		resolved, _ := condition(v1alpha1.ConditionCheckpointPolicyResolved)
		if deployed == nil || deployed["status"] != "True" || resolved == nil {
			return fmt.Errorf("not Deployed with CheckpointPolicyResolved yet; status %s", status)
		}
		if resolved["status"] != "False" || resolved["reason"] != v1alpha1.ReasonPolicyNotFound ||
			!strings.Contains(fmt.Sprint(resolved["message"]), `checkpointPolicy "fast": CheckpointPolicy orchestra-policy/fast does not exist`) {
			return fmt.Errorf("CheckpointPolicyResolved = %v, want False naming the missing policy", resolved)
		}
		return nil
	})

	policy := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte("apiVersion: modelorchestra.io/v1alpha1\nkind: CheckpointPolicy\nmetadata: {name: fast}\nspec: {slo: {resumeRamSeconds: 2}}\n"), &policy.Object); err != nil {
		t.Fatal(err)
	}
	policy.SetNamespace(ns)
	if err := k8s.Create(ctx, policy); err != nil {
		t.Fatalf("creating the policy: %v", err)
	}
	eventually(t, 30*time.Second, func() error {
		resolved, status := condition(v1alpha1.ConditionCheckpointPolicyResolved)
		if resolved == nil || resolved["status"] != "True" {
			return fmt.Errorf("CheckpointPolicyResolved is not True after the policy was created: %v (status %s)", resolved, status)
		}
		return nil
	})
}
