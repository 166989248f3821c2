package helmreconciler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/polltest"
	"github.com/model-orchestra/operator/internal/watches"
)

// eventually polls f every 50 ms until it passes (polltest.Eventually).
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, 50*time.Millisecond, f)
}

// consistently calls f every 200 ms for the whole of within and fails the
// test at its first error (polltest.Consistently).
func consistently(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Consistently(t, within, 200*time.Millisecond, f)
}

var (
	sampleGVK = schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}
	otherGVK  = schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Other"}
)

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
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				// The grace period is 30 s: say what still runs.
				var b bytes.Buffer
				_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
				t.Logf("the manager has not stopped 20s after its context ended; goroutines:\n%s", b.String())
				err = <-done
			}
			if err != nil {
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
	eventually(t, 10*time.Second, func() error {
		u := get(t, gvk, ns, name)
		change(u)
		if err := k8s.Update(context.Background(), u); err != nil {
			return fmt.Errorf("updating %s: %w", name, err)
		}
		return nil
	})
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
	eventually(t, 60*time.Second, func() error {
		u = get(t, gvk, ns, name)
		if c := condition(u, typ); c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
			return fmt.Errorf("%s: want %s=%s %s; status %s", name, typ, status, reason, describe(u))
		}
		return nil
	})
	return u
}

// waitDeployed waits for revision rev (0: any) to be deployed and reported.
func waitDeployed(t *testing.T, gvk schema.GroupVersionKind, ns, name string, rev int64) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	eventually(t, 60*time.Second, func() error {
		u = get(t, gvk, ns, name)
		c := condition(u, "Deployed")
		got, _, _ := unstructured.NestedInt64(u.Object, "status", "deployedRelease", "revision")
		og, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		if c == nil || c.Status != metav1.ConditionTrue || (rev != 0 && got != rev) || og != u.GetGeneration() {
			return fmt.Errorf("%s: want revision %d deployed at generation %d; status %s", name, rev, u.GetGeneration(), describe(u))
		}
		return nil
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

// gone returns nil once the object is gone, else what is left of it.
func gone(gvk schema.GroupVersionKind, ns, name string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	switch err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("%s %s/%s is still there (deletion requested at %v, finalizers %v)", gvk.Kind, ns, name, u.GetDeletionTimestamp(), u.GetFinalizers())
}

// recreated returns nil once the ConfigMap deleted at UID old is back, as a
// new object with the chart's greeting.
func recreated(t *testing.T, ns, name string, old types.UID, greeting string) error {
	t.Helper()
	got, ok := configMap(t, ns, name)
	switch {
	case !ok:
		return fmt.Errorf("the deleted ConfigMap %s is not back", name)
	case got.UID == old:
		return fmt.Errorf("ConfigMap %s is still the deleted one", name)
	case got.Data["greeting"] != greeting:
		return fmt.Errorf("ConfigMap %s is back with data %v, want greeting %q", name, got.Data, greeting)
	}
	return nil
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
	eventually(t, 30*time.Second, func() error {
		if got := eventReasons(t, ns, name); !slices.Contains(got, reason) {
			return fmt.Errorf("no event %s about %s among %v", reason, name, got)
		}
		return nil
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

func histogramCount(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	families, err := ctrlGather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelsMatch(m, match) {
				n += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return n
}

// gaugeValue returns the value of the gauge name with the labels of match,
// and whether there is one.
func gaugeValue(t *testing.T, name string, match map[string]string) (float64, bool) {
	t.Helper()
	families, err := ctrlGather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelsMatch(m, match) {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}
