package manager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/polltest"
)

// settlePeriod is the reconcile period the resources of these tests ask
// for, so that a few seconds hold several periodic reconciles.
const settlePeriod = "2s"

// TestAFreshReleaseSettlesAtRevisionOne applies the sleep sample (the node
// agent with its generated caller token, the lifecycle leader, a
// CheckpointPolicy) and checks that its release is installed at revision 1
// and stays there through several reconcile periods: nothing the first
// reconciles learn (the caller token Secret the install created, the
// status they write) is taken for a change of the resource. An upgrade
// right after every install would restart the agent and roll the
// dispatcher, moving the lifecycle leader.
func TestAFreshReleaseSettlesAtRevisionOne(t *testing.T) {
	h := startOperator(t, "settle-fresh")
	objs := readSample(t, "simulator-sleep.yaml")
	var mo *unstructured.Unstructured
	for _, o := range objs {
		o.SetNamespace(h.ns)
		if o.GetKind() == "ModelOrchestra" {
			mo = o
			continue
		}
		h.create(t, o) // the CheckpointPolicy, before the resource that names it
	}
	mo.SetAnnotations(map[string]string{"helm.sdk.operatorframework.io/reconcile-period": settlePeriod})
	h.create(t, mo)

	h.waitDeployed(t, mo.GetName(), 1)
	sec := &corev1.Secret{}
	if err := h.k8s.Get(context.Background(), types.NamespacedName{Namespace: h.ns, Name: mo.GetName() + "-agent-caller"}, sec); err != nil || len(sec.Data["token"]) != 48 {
		t.Fatalf("the caller token Secret: %v, %d token bytes; want the 48 generated at install", err, len(sec.Data["token"]))
	}
	h.staysAt(t, mo.GetName(), 1, sec.Data["token"])
}

// TestTheSizingVerdictUpgradesOnce: an Ollama application with a memory
// limit is installed with its engine held at zero pods until the fetcher's
// verdict (internal/orchestra/sizinggate.go). The verdict that the model
// fits is a real change of the release, the one upgrade (revision 2, the
// root StatefulSet at its replicas); after it the release stays at
// revision 2.
func TestTheSizingVerdictUpgradesOnce(t *testing.T) {
	h := startOperator(t, "settle-sizing")
	mo := readSample(t, "simulator.yaml")[0]
	mo.SetNamespace(h.ns)
	mo.SetName("sized")
	mo.SetAnnotations(map[string]string{"helm.sdk.operatorframework.io/reconcile-period": settlePeriod})
	const app = "echo"
	must(t, unstructured.SetNestedField(mo.Object, "ollama", "spec", "applications", app, "runtime", "engine"))
	unstructured.RemoveNestedField(mo.Object, "spec", "applications", app, "runtime", "args")
	must(t, unstructured.SetNestedMap(mo.Object, map[string]any{"limits": map[string]any{"memory": "1Gi"}}, "spec", "applications", app, "runtime", "resources"))
	must(t, unstructured.SetNestedField(mo.Object, int64(1), "spec", "applications", app, "scaling", "replicas"))
	h.create(t, mo)

	h.waitDeployed(t, "sized", 1)
	root := func() int32 {
		sts := &appsv1.StatefulSet{}
		if err := h.k8s.Get(context.Background(), types.NamespacedName{Namespace: h.ns, Name: "sized-" + app}, sts); err != nil || sts.Spec.Replicas == nil {
			return -1
		}
		return *sts.Spec.Replicas
	}
	if got := root(); got != 0 {
		t.Fatalf("root StatefulSet replicas %d before the verdict; want 0 (held)", got)
	}
	// Nothing changes while the verdict is pending.
	h.staysAt(t, "sized", 1, nil)

	// The fetcher's verdict, as it writes it into the progress ConfigMap
	// its release rendered.
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: h.ns, Name: "sized-" + app + "-model-progress"}
	progress, _ := json.Marshal(map[string]any{"phase": "Complete", "verified": true, "sizing": map[string]any{
		"parallel": 16, "memoryLimitBytes": 1 << 30, "marginPercent": 10, "memoryBytes": 1 << 20, "fits": true,
	}})
	eventually(t, 30*time.Second, func() error {
		if err := h.k8s.Get(context.Background(), key, cm); err != nil {
			return err
		}
		cm.Data = map[string]string{"progress.json": string(progress)}
		return h.k8s.Update(context.Background(), cm)
	})
	h.waitDeployed(t, "sized", 2)
	if got := root(); got != 1 {
		t.Errorf("root StatefulSet replicas %d after the verdict; want 1", got)
	}
	h.staysAt(t, "sized", 2, nil)
}

// operatorHarness is the operator (cmd/orchestra-operator's configuration)
// serving one namespace of the package's control plane.
type operatorHarness struct {
	k8s client.Client
	ns  string
}

func startOperator(t *testing.T, ns string) *operatorHarness {
	t.Helper()
	cfg := needCluster(t)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{operator.ModelOrchestraCRD(), operator.CheckpointPolicyCRD(), operator.ModelCheckpointCRD()} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(b, crd); err != nil {
			t.Fatal(err)
		}
		createCRD(t, k8s, crd)
	}
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	mc := manager.Default()
	mc.WatchNamespaces = []string{ns}
	mc.MetricsAddr, mc.ProbeAddr = "0", "0"
	mc.RelatedWatches = []manager.RelatedWatch{{Owner: v1alpha1.GroupVersionKind, Kind: orchestra.CheckpointPolicyGVK, Map: orchestra.PolicyReferrers}}
	t.Chdir(t.TempDir()) // the embedded watches.yaml, as in the image
	entries, err := manager.LoadWatches(mc, reg, operator.FS, operator.WatchesFile)
	if err != nil {
		t.Fatal(err)
	}
	// Other tests of the package serve the same kind in this process:
	// controller names are unique per process unless told otherwise.
	mgr, err := manager.New(cfg, mc, entries, func(o *ctrl.Options) { o.Controller.SkipNameValidation = ptr(true) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return &operatorHarness{k8s: k8s, ns: ns}
}

// readSample reads the documents of config/samples/<name>.
func readSample(t *testing.T, name string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(origWD + "/../../config/samples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(o.Object) > 0 {
			out = append(out, o)
		}
	}
}

// create creates o, retrying while the API server's discovery does not
// list its kind yet (Established comes a moment before).
func (h *operatorHarness) create(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		err := h.k8s.Create(context.Background(), o.DeepCopy())
		if err != nil && !meta.IsNoMatchError(err) {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		return err
	})
}

// releaseState is the latest revision of a release (from its storage
// Secrets) and the resource's Deployed condition.
func (h *operatorHarness) releaseState(name string) (revision int, deployed string, err error) {
	ctx := context.Background()
	list := &corev1.SecretList{}
	if err := h.k8s.List(ctx, list, client.InNamespace(h.ns), client.MatchingLabels{"owner": "helm", "name": name}); err != nil {
		return 0, "", err
	}
	for _, s := range list.Items {
		if v, _ := strconv.Atoi(s.Labels["version"]); v > revision {
			revision = v
		}
	}
	mo := &unstructured.Unstructured{}
	mo.SetAPIVersion("modelorchestra.io/v1alpha1")
	mo.SetKind("ModelOrchestra")
	if err := h.k8s.Get(ctx, types.NamespacedName{Namespace: h.ns, Name: name}, mo); err != nil {
		return 0, "", err
	}
	conds, _, _ := unstructured.NestedSlice(mo.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Deployed" && m["status"] == "True" {
			deployed, _ = m["message"].(string)
		}
	}
	return revision, deployed, nil
}

// waitDeployed waits for the release of name to be deployed at revision.
func (h *operatorHarness) waitDeployed(t *testing.T, name string, revision int) {
	t.Helper()
	want := fmt.Sprintf("release %s revision %d is deployed", name, revision)
	eventually(t, 2*time.Minute, func() error {
		rev, msg, err := h.releaseState(name)
		if err != nil {
			return err
		}
		if rev != revision || len(msg) < len(want) || msg[:len(want)] != want {
			return fmt.Errorf("latest revision %d, Deployed %q; want revision %d deployed", rev, msg, revision)
		}
		return nil
	})
}

// staysAt checks that the release of name stays at revision through five
// reconcile periods in which the operator reconciles (token, if set, is
// the caller token, which must not change either).
func (h *operatorHarness) staysAt(t *testing.T, name string, revision int, token []byte) {
	t.Helper()
	period, _ := time.ParseDuration(settlePeriod)
	before := reconciles(t)
	polltest.Consistently(t, 5*period, 200*time.Millisecond, func() error {
		rev, _, err := h.releaseState(name)
		if err != nil {
			return err
		}
		if rev != revision {
			return fmt.Errorf("release %s went to revision %d without a change of its inputs; want it to stay at %d", name, rev, revision)
		}
		if token != nil {
			sec := &corev1.Secret{}
			if err := h.k8s.Get(context.Background(), types.NamespacedName{Namespace: h.ns, Name: name + "-agent-caller"}, sec); err != nil {
				return err
			}
			if string(sec.Data["token"]) != string(token) {
				return fmt.Errorf("the caller token changed")
			}
		}
		return nil
	})
	// The periodic reconciles ran (this package runs one operator at a
	// time): the window proves something.
	if n := reconciles(t) - before; n < 3 {
		t.Errorf("%d reconciles in %s; want at least 3 (reconcile period %s)", n, 5*period, settlePeriod)
	}
}

// reconciles counts the engine's reconciles of ModelOrchestras so far.
func reconciles(t *testing.T) uint64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "orchestra_helm_reconcile_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelValue(m, "kind") == "ModelOrchestra" {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
