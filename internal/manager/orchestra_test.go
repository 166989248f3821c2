package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/plugin"
)

// TestOperatorServesTheSampleModelOrchestra runs the operator as
// cmd/orchestra-operator configures it (embedded watches.yaml, chart and
// ModelOrchestra plugins) and checks that the simulator sample is deployed.
func TestOperatorServesTheSampleModelOrchestra(t *testing.T) {
	cfg := needCluster(t)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(operator.ModelOrchestraCRD(), crd); err != nil {
		t.Fatal(err)
	}
	createCRD(t, k8s, crd)
	ns := "orchestra-sample"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	mc := manager.Default()
	mc.WatchNamespaces = []string{ns}
	mc.MetricsAddr, mc.ProbeAddr = "0", "0"
	t.Chdir(t.TempDir()) // no ./watches.yaml: the embedded one is used, as in the image
	entries, err := manager.LoadWatches(mc, reg, operator.FS, operator.WatchesFile)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- manager.Run(runCtx, cfg, mc, entries) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	data, err := os.ReadFile(origWD + "/../../config/samples/simulator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mo := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &mo.Object); err != nil {
		t.Fatal(err)
	}
	mo.SetNamespace(ns)
	// Established can come a moment before the API server's discovery
	// lists the kind: retry a create that finds no such kind.
	eventually(t, 30*time.Second, func() error {
		err := k8s.Create(ctx, mo.DeepCopy())
		if err != nil && !meta.IsNoMatchError(err) {
			t.Fatalf("creating the sample: %v", err)
		}
		return err
	})
	eventually(t, 120*time.Second, func() error {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(mo.GroupVersionKind())
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: mo.GetName()}, got); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Deployed" && m["status"] == "True" {
				return nil
			}
		}
		b, _ := json.Marshal(got.Object["status"])
		return fmt.Errorf("the sample is not Deployed; status %s", b)
	})
	list := &corev1.SecretList{}
	if err := k8s.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"owner": "helm", "status": "deployed"}); err != nil || len(list.Items) != 1 {
		t.Errorf("deployed release Secrets: %d, %v", len(list.Items), err)
	}
}
