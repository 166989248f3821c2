package helmreconciler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/model-orchestra/operator/internal/helmreconciler"
)

// recordingTracker is a helmreconciler.ActionTracker that records each
// start and finish, and at each start the release records stored.
type recordingTracker struct {
	mu sync.Mutex
	// log holds "start install ns/name (records: 0)" and
	// "finish install ns/name".
	log []string
}

func (r *recordingTracker) ActionStarted(a helmreconciler.HelmAction) func() {
	// Not releaseSecrets: this runs on the engine's goroutine, where a
	// test must not fail fatally.
	list := &corev1.SecretList{}
	n := -1
	if err := k8s.List(context.Background(), list, client.InNamespace(a.Namespace), client.MatchingLabels{"owner": "helm", "name": a.Release}); err == nil {
		n = len(list.Items)
	}
	r.add(fmt.Sprintf("start %s %s/%s (records: %d)", a.Action, a.Namespace, a.Release, n))
	return func() { r.add(fmt.Sprintf("finish %s %s/%s", a.Action, a.Namespace, a.Release)) }
}

func (r *recordingTracker) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

func (r *recordingTracker) entries() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// The engine tells its ActionTracker of each Helm action as it starts
// (before the install stores a release record) and as it ends: what OLM's
// Upgradeable condition follows (internal/manager).
func TestActionTrackerIsToldOfEachAction(t *testing.T) {
	needCluster(t)
	ns := newNamespace(t)
	entries := loadEntries(t, sampleWatch)
	sample := &unstructured.Unstructured{}
	sample.SetGroupVersionKind(sampleGVK)
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Cache: cache.Options{
			DefaultLabelSelector: labels.SelectorFromSet(labels.Set{helmreconciler.LabelManagedBy: helmreconciler.ManagedByHelm}),
			ByObject:             map[client.Object]cache.ByObject{sample: {Label: labels.Everything()}},
			DefaultNamespaces:    map[string]cache.Config{ns: {}},
		},
		Client:                 client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tracker := &recordingTracker{}
	if _, err := helmreconciler.New(mgr, &entries[0], helmreconciler.Options{ReconcilePeriod: time.Hour, ActionTimeout: time.Minute, Actions: tracker}); err != nil {
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

	create(t, newCR(sampleGVK, ns, "tracked", map[string]any{"greeting": "hi"}))
	waitDeployed(t, sampleGVK, ns, "tracked", 1)
	update(t, sampleGVK, ns, "tracked", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "bonjour", "spec", "greeting")
	})
	waitDeployed(t, sampleGVK, ns, "tracked", 2)
	if err := k8s.Delete(context.Background(), get(t, sampleGVK, ns, "tracked")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error { return gone(sampleGVK, ns, "tracked") })

	rel := ns + "/tracked"
	want := []string{
		"start install " + rel + " (records: 0)", "finish install " + rel,
		"start upgrade " + rel + " (records: 1)", "finish upgrade " + rel,
		"start uninstall " + rel + " (records: 2)", "finish uninstall " + rel,
	}
	// A reconcile of the deleted resource that runs before the cache sees
	// its finalizer gone uninstalls again and finds nothing: told too,
	// as a pair, and left out here.
	// That second uninstall may still run when the resource is gone: wait
	// until every action told to start was told to finish.
	var got []string
	eventually(t, 10*time.Second, func() error {
		got = tracker.entries()
		open := 0
		for _, e := range got {
			switch {
			case strings.HasPrefix(e, "start "):
				open++
			case strings.HasPrefix(e, "finish "):
				open--
			}
		}
		if open != 0 {
			return fmt.Errorf("%d actions told to start and not to finish: %q", open, got)
		}
		return nil
	})
	again := "start uninstall " + rel + " (records: 0)"
	for i := len(want); i+1 < len(got) && got[i] == again && got[i+1] == "finish uninstall "+rel; {
		got = slices.Delete(got, i, i+2)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("actions told (-want +got):\n%s", diff)
	}
}
