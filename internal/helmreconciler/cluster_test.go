package helmreconciler_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/watches"
)

// One control plane (etcd, kube-apiserver, kube-controller-manager for
// garbage collection) serves every test of the package; each test works in
// its own namespace with its own manager.
var (
	restCfg    *rest.Config
	kubeconfig string
	k8s        client.Client
	moduleRoot string
)

var (
	sampleGVK = schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}
	otherGVK  = schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Other"}
)

func TestMain(m *testing.M) {
	logOut := io.Discard
	if os.Getenv("ENGINE_TEST_LOG") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))
	code := m.Run()
	if testCluster != nil {
		if err := testCluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the local control plane: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	clusterOnce sync.Once
	testCluster *localcluster.Cluster
	clusterErr  error
)

// needCluster starts the package's control plane on first use (so that the
// pure unit tests of the package run without one) and fails the test if it
// cannot start.
func needCluster(t *testing.T) {
	t.Helper()
	localcluster.SkipUnderShort(t)
	clusterOnce.Do(func() { clusterErr = startCluster() })
	if clusterErr != nil {
		t.Fatalf("local control plane: %v", clusterErr)
	}
}

func startCluster() error {
	root, err := localcluster.ModuleRoot()
	if err != nil {
		return err
	}
	moduleRoot = root
	c, err := localcluster.Start(context.Background(), localcluster.Options{ControllerManager: true})
	if err != nil {
		return fmt.Errorf("starting: %w", err)
	}
	testCluster = c
	restCfg = c.Config()
	restCfg.QPS, restCfg.Burst = 200, 400
	kubeconfig = c.KubeconfigFile()

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	k8s, err = client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	return installCRDs(context.Background())
}

func installCRDs(ctx context.Context) error {
	files, _ := filepath.Glob("testdata/crds/*.yaml")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := k8s.Create(ctx, crd); err != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := &apiextensionsv1.CustomResourceDefinition{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(crd), got); err == nil {
				for _, c := range got.Status.Conditions {
					if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
						goto next
					}
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established", crd.Name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	next:
	}
	return nil
}

// --- fixtures -------------------------------------------------------------

var nsCounter atomic.Int64

func newNamespace(t *testing.T) string {
	t.Helper()
	needCluster(t)
	name := fmt.Sprintf("t%d-%s", nsCounter.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.TrimRight(name, "-")
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return name
}

func registry() *plugin.Registry {
	reg := plugin.NewRegistry()
	reg.RegisterStatus("greeting-status", greetingStatus{})
	reg.RegisterPostRenderer("secret-stamp", func(json.RawMessage) (plugin.PostRenderer, error) { return secretStamp{}, nil })
	return reg
}

func loadEntries(t *testing.T, watchesYAML string) []watches.Entry {
	t.Helper()
	entries, err := watches.Parse("watches.yaml", []byte(watchesYAML), os.DirFS("testdata/charts"), registry())
	if err != nil {
		t.Fatalf("loading watches: %v", err)
	}
	return entries
}

const sampleWatch = `
- group: test.modelorchestra.io
  version: v1
  kind: Sample
  chart: small
`

type managerOpts struct {
	namespaces []string
	chunkSize  int
	// config is the identity the engine runs as; nil is the admin.
	config *rest.Config
	// countAPIRequests counts the engine's requests
	// (orchestra_api_requests_total).
	countAPIRequests bool
}

// startManager runs the engine for entries until the test ends or the
// returned function stops it.
func startManager(t *testing.T, entries []watches.Entry, o managerOpts) (stop func()) {
	t.Helper()
	cfg := manager.Default()
	cfg.WatchNamespaces = o.namespaces
	cfg.MetricsAddr, cfg.ProbeAddr = "0", "0"
	cfg.ReconcilePeriod = time.Hour // drift repair must not wait for a resync
	cfg.MaxConcurrentReconciles = 2
	cfg.ChunkSize = o.chunkSize
	cfg.CountAPIRequests = o.countAPIRequests
	cfg.ActionTimeout = time.Minute
	rc := restCfg
	if o.config != nil {
		rc = o.config
	}
	mgr, err := manager.New(rc, cfg, entries, func(o *ctrl.Options) {
		o.Controller.SkipNameValidation = ptr(true)
	})
	if err != nil {
		t.Fatalf("building manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func ctrlGather() ([]*dto.MetricFamily, error) { return ctrlmetrics.Registry.Gather() }

func ptr[T any](v T) *T { return &v }

func newCR(gvk schema.GroupVersionKind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
}

func get(t *testing.T, gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		t.Fatalf("getting %s %s/%s: %v", gvk.Kind, ns, name, err)
	}
	return u
}

// update applies change to the latest version of obj, retrying conflicts.
func update(t *testing.T, gvk schema.GroupVersionKind, ns, name string, change func(u *unstructured.Unstructured)) {
	t.Helper()
	eventually(t, 10*time.Second, "updating "+name, func() (bool, string) {
		u := get(t, gvk, ns, name)
		change(u)
		if err := k8s.Update(context.Background(), u); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if detail != "" {
			last = detail
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// consistently fails the test if cond turns false within d.
func consistently(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if ok, detail := cond(); !ok {
			t.Fatalf("expected %s for %s: %s", what, d, detail)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func conditions(u *unstructured.Unstructured) []metav1.Condition {
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	b, _ := json.Marshal(raw)
	var cs []metav1.Condition
	_ = json.Unmarshal(b, &cs)
	return cs
}

func condition(u *unstructured.Unstructured, t string) *metav1.Condition {
	return meta.FindStatusCondition(conditions(u), t)
}

func describe(u *unstructured.Unstructured) string {
	s, _ := json.Marshal(u.Object["status"])
	return string(s)
}

// waitCondition waits for condition typ of the resource to have status and
// (when not empty) reason, and returns the resource.
func waitCondition(t *testing.T, gvk schema.GroupVersionKind, ns, name, typ string, status metav1.ConditionStatus, reason string) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	eventually(t, 60*time.Second, fmt.Sprintf("%s %s=%s %s", name, typ, status, reason), func() (bool, string) {
		u = get(t, gvk, ns, name)
		c := condition(u, typ)
		return c != nil && c.Status == status && (reason == "" || c.Reason == reason), describe(u)
	})
	return u
}

// waitDeployed waits for revision rev (0: any) to be deployed and reported.
func waitDeployed(t *testing.T, gvk schema.GroupVersionKind, ns, name string, rev int64) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	eventually(t, 60*time.Second, fmt.Sprintf("%s revision %d deployed", name, rev), func() (bool, string) {
		u = get(t, gvk, ns, name)
		c := condition(u, "Deployed")
		got, _, _ := unstructured.NestedInt64(u.Object, "status", "deployedRelease", "revision")
		og, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		return c != nil && c.Status == metav1.ConditionTrue && (rev == 0 || got == rev) && og == u.GetGeneration(), describe(u)
	})
	return u
}

func configMap(t *testing.T, ns, name string) (*corev1.ConfigMap, bool) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, cm)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("getting ConfigMap %s: %v", name, err)
	}
	return cm, true
}

func releaseSecrets(t *testing.T, ns string) []corev1.Secret {
	t.Helper()
	list := &corev1.SecretList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{"owner": "helm"}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// eventReasons lists the reasons of the events about the named object.
func eventReasons(t *testing.T, ns, name string) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

func waitEvent(t *testing.T, ns, name, reason string) {
	t.Helper()
	eventually(t, 30*time.Second, "event "+reason, func() (bool, string) {
		got := eventReasons(t, ns, name)
		return slices.Contains(got, reason), fmt.Sprint(got)
	})
}

// helmCLI runs bin/helm against the test cluster.
func helmCLI(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(moduleRoot, "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("helm"); err != nil {
			t.Fatalf("the helm CLI is needed in bin/ (make tools) or on PATH: %v", err)
		}
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// metricValue sums a counter of the operator's metrics registry over the
// series whose labels include match.
func metricValue(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelsMatch(m, match) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func labelsMatch(m *dto.Metric, match map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := match[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(match)
}

// greetingStatus is a test status plugin. The whole of a plugin is a type
// like this one plus one registration line (see registry):
//
//	reg.RegisterStatus("greeting-status", greetingStatus{})
type greetingStatus struct{}

func (greetingStatus) Status(_ context.Context, in plugin.StatusInput) (plugin.StatusResult, error) {
	res := plugin.StatusResult{Fields: map[string]any{"objects": int64(len(in.Objects))}}
	for _, o := range in.Objects {
		if o.GetKind() == "ConfigMap" {
			g, _, _ := unstructured.NestedString(o.Object, "data", "greeting")
			res.Fields["greeting"] = g
		}
	}
	res.Conditions = []metav1.Condition{{Type: "GreetingPublished", Status: metav1.ConditionTrue, Reason: "ConfigMapExists", Message: "the greeting is published"}}
	return res, nil
}

// secretStamp is a test post-renderer that reads a live object: it stamps
// the pod template of every Deployment with a digest of the data of the
// Secret "<resource>-token" (absent: "absent"), as config-checksum does for
// the Secrets a pod references, and names that Secret as a live input.
type secretStamp struct{}

const stampAnnotation = "test.modelorchestra.io/token-digest"

func (secretStamp) PostRender(ctx context.Context, rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	stamp := "offline"
	if rc.Reader != nil {
		s := &corev1.Secret{}
		err := rc.Reader.Get(ctx, types.NamespacedName{Namespace: rc.Owner.GetNamespace(), Name: rc.Owner.GetName() + "-token"}, s)
		switch {
		case apierrors.IsNotFound(err):
			stamp = "absent"
		case err != nil:
			return nil, err
		default:
			b, _ := json.Marshal(s.Data)
			sum := sha256.Sum256(b)
			stamp = hex.EncodeToString(sum[:])
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			if err := unstructured.SetNestedField(o.Object, stamp, "spec", "template", "metadata", "annotations", stampAnnotation); err != nil {
				return nil, err
			}
		}
	}
	return objs, nil
}

func (secretStamp) DigestInputs(_ context.Context, rc plugin.RenderContext, _ []*unstructured.Unstructured) ([]plugin.ObjectRef, error) {
	return []plugin.ObjectRef{{GVK: corev1.SchemeGroupVersion.WithKind("Secret"), Namespace: rc.Owner.GetNamespace(), Name: rc.Owner.GetName() + "-token"}}, nil
}
