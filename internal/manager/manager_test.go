package manager_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/plugin"
)

func TestParseNamespaces(t *testing.T) {
	for in, want := range map[string][]string{
		"":            nil,
		"a":           {"a"},
		" a , b ,,c ": {"a", "b", "c"},
	} {
		if diff := cmp.Diff(want, manager.ParseNamespaces(in)); diff != "" {
			t.Errorf("ParseNamespaces(%q) (-want +got):\n%s", in, diff)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := manager.Default()
	if err := good.Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	for name, mutate := range map[string]func(*manager.Config){
		"no watches file":       func(c *manager.Config) { c.WatchesFile = "" },
		"negative period":       func(c *manager.Config) { c.ReconcilePeriod = -time.Second },
		"no workers":            func(c *manager.Config) { c.MaxConcurrentReconciles = 0 },
		"no timeout":            func(c *manager.Config) { c.ActionTimeout = 0 },
		"election without a id": func(c *manager.Config) { c.LeaderElection, c.LeaderElectionID = true, "" },
	} {
		c := manager.Default()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

const otherWatch = `
- group: test.modelorchestra.io
  version: v1
  kind: Other
  chart: charts/other
`

func TestLoadWatchesEmbeddedFallbackAndDiskOverride(t *testing.T) {
	chartFiles := fstest.MapFS{}
	_ = filepath.WalkDir("testdata/charts/other", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			data, _ := os.ReadFile(p)
			chartFiles[strings.TrimPrefix(p, "testdata/")] = &fstest.MapFile{Data: data}
		}
		return err
	})
	chartFiles["watches.yaml"] = &fstest.MapFile{Data: []byte(otherWatch)}
	reg := plugin.NewRegistry()

	// The default watches file is absent from the working directory: the
	// embedded one is used.
	t.Chdir(t.TempDir())
	c := manager.Default()
	entries, err := manager.LoadWatches(c, reg, chartFiles, "watches.yaml")
	if err != nil || len(entries) != 1 || !strings.HasPrefix(entries[0].Source, "embedded") {
		t.Fatalf("embedded fallback: %v, %+v", err, entries)
	}

	// A watches file on disk, and charts from disk.
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "charts"), os.DirFS(filepath.Join(origWD, "testdata/charts"))); err != nil {
		t.Fatal(err)
	}
	c.WatchesFile = filepath.Join(dir, "w.yaml")
	c.ChartsDir = dir
	if err := os.WriteFile(c.WatchesFile, []byte(otherWatch+"  reconcilePeriod: 7s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err = manager.LoadWatches(c, reg, chartFiles, "watches.yaml")
	if err != nil || entries[0].ReconcilePeriod != 7*time.Second {
		t.Fatalf("disk watches: %v, %+v", err, entries)
	}

	// A watches file given explicitly must exist.
	c.WatchesFile = filepath.Join(dir, "missing.yaml")
	if _, err := manager.LoadWatches(c, reg, chartFiles, "watches.yaml"); err == nil {
		t.Error("a missing explicit watches file was accepted")
	}
}

// TestRunServesProbesMetricsAndElectsALeader runs the manager as the
// operator does: probes, metrics and leader election on a real control
// plane, then shuts it down gracefully.
func TestRunServesProbesMetricsAndElectsALeader(t *testing.T) {
	cfg := needCluster(t)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	_ = coordinationv1.AddToScheme(scheme)
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	data, err := os.ReadFile("testdata/others.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	createCRD(t, k8s, crd)
	ns := "served"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	mc := manager.Default()
	mc.WatchNamespaces = []string{ns}
	mc.MetricsAddr, mc.ProbeAddr = freeAddr(t), freeAddr(t)
	mc.LeaderElection = true
	mc.LeaderElectionNamespace = ns
	mc.LeaderElectionID = "orchestra-test"
	dir := t.TempDir()
	mc.WatchesFile = filepath.Join(dir, "watches.yaml")
	mc.ChartsDir = "testdata"
	if err := os.WriteFile(mc.WatchesFile, []byte(otherWatch), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err := manager.LoadWatches(mc, plugin.NewRegistry(), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- manager.Run(runCtx, cfg, mc, entries)
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		}
	})

	for _, probe := range []string{"/healthz", "/readyz"} {
		eventually(t, 30*time.Second, func() error {
			if code, body := httpGet("http://" + mc.ProbeAddr + probe); code != http.StatusOK {
				return fmt.Errorf("%s answers %d: %s", probe, code, body)
			}
			return nil
		})
	}
	eventually(t, 30*time.Second, func() error {
		lease := &coordinationv1.Lease{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orchestra-test"}, lease); err != nil {
			return fmt.Errorf("the leader Lease: %w", err)
		}
		if h := lease.Spec.HolderIdentity; h == nil || *h == "" {
			return errors.New("the leader Lease has no holder")
		}
		return nil
	})

	// The leader reconciles. The metrics registry is the process's, so
	// other tests' installs of the same kind count too: compare with the
	// values before this one.
	const (
		installs          = `orchestra_helm_actions_total{action="install",kind="Other",result="success"}`
		installReconciles = `orchestra_helm_reconcile_duration_seconds_count{kind="Other",outcome="install"}`
	)
	_, before := httpGet("http://" + mc.MetricsAddr + "/metrics")
	installsBefore, reconcilesBefore := metricValue(before, installs), metricValue(before, installReconciles)
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"color": "green"}}}
	u.SetAPIVersion("test.modelorchestra.io/v1")
	u.SetKind("Other")
	u.SetNamespace(ns)
	u.SetName("o")
	if err := k8s.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		return configMapColor(ctx, k8s, ns, "o-other", "green")
	})
	var metrics string
	eventually(t, 30*time.Second, func() error {
		_, metrics = httpGet("http://" + mc.MetricsAddr + "/metrics")
		if metricValue(metrics, installs) != installsBefore+1 || metricValue(metrics, installReconciles) != reconcilesBefore+1 {
			return fmt.Errorf("/metrics does not count the install:\n%s", grep(metrics, "orchestra_helm"))
		}
		return nil
	})
	for _, m := range []string{"controller_runtime_reconcile_total", "workqueue_depth"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	// Graceful shutdown returns, and releases the Lease.
	cancel()
	stopped = true
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v on shutdown", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("Run did not return after cancellation")
	}
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orchestra-test"}, lease); err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after shutdown", *h)
	}
}
