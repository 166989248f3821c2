package manager_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/plugin"
)

// writeCounter counts a replica's writes to custom resources and
// ConfigMaps: the work of reconciling, which only the leader may do.
type writeCounter struct {
	next   http.RoundTripper
	writes *atomic.Int64
}

func (w writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet && (strings.Contains(req.URL.Path, "/others") || strings.Contains(req.URL.Path, "/configmaps")) {
		w.writes.Add(1)
	}
	return w.next.RoundTrip(req)
}

type replica struct {
	name    string
	mgr     ctrl.Manager
	writes  atomic.Int64
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

func (r *replica) elected() bool {
	select {
	case <-r.mgr.Elected():
		return true
	default:
		return false
	}
}

// Two replicas with leader election: only the leader reconciles; when it
// shuts down gracefully it releases the Lease, and the other takes over
// well before the Lease would have expired and serves resources created
// after the handover.
func TestLeaderElectionFailover(t *testing.T) {
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
	data, err := os.ReadFile("testdata/others.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	createCRD(t, k8s, crd) // or finds it, made by another test
	ns := "failover"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	mc := manager.Default()
	mc.WatchNamespaces = []string{ns}
	mc.MetricsAddr, mc.ProbeAddr = "0", "0"
	mc.LeaderElection = true
	mc.LeaderElectionNamespace = ns
	mc.LeaderElectionID = "orchestra-failover"
	mc.ChartsDir = "testdata"
	mc.WatchesFile = filepath.Join(t.TempDir(), "watches.yaml")
	if err := os.WriteFile(mc.WatchesFile, []byte(otherWatch), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, err := manager.LoadWatches(mc, plugin.NewRegistry(), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	const leaseDuration = 15 * time.Second
	replicas := []*replica{{name: "a"}, {name: "b"}}
	for _, r := range replicas {
		rc := rest.CopyConfig(cfg)
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return writeCounter{next: rt, writes: &r.writes} })
		m, err := manager.New(rc, mc, entries, func(o *ctrl.Options) {
			o.Controller.SkipNameValidation = ptr(true)
			o.LeaseDuration = ptr(leaseDuration)
		})
		if err != nil {
			t.Fatalf("replica %s: %v", r.name, err)
		}
		r.mgr = m
		runCtx, cancel := context.WithCancel(ctx)
		r.cancel, r.done = cancel, make(chan error, 1)
		go func() { r.done <- m.Start(runCtx) }()
	}
	stop := func(r *replica) {
		if r.stopped {
			return
		}
		r.stopped = true
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("replica %s: %v", r.name, err)
			}
		case <-time.After(40 * time.Second):
			t.Errorf("replica %s did not stop", r.name)
		}
	}
	t.Cleanup(func() {
		for _, r := range replicas {
			stop(r)
		}
	})

	var leader, follower *replica
	eventually(t, 30*time.Second, func() error {
		a, b := replicas[0].elected(), replicas[1].elected()
		if a && b {
			t.Fatal("both replicas are leaders")
		}
		switch {
		case a:
			leader, follower = replicas[0], replicas[1]
		case b:
			leader, follower = replicas[1], replicas[0]
		default:
			return errors.New("no replica is elected")
		}
		return nil
	})

	newOther := func(name, color string) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"color": color}}}
		u.SetAPIVersion("test.modelorchestra.io/v1")
		u.SetKind("Other")
		u.SetNamespace(ns)
		u.SetName(name)
		if err := k8s.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	waitConfigMap := func(name, color string, timeout time.Duration) {
		t.Helper()
		eventually(t, timeout, func() error {
			return configMapColor(ctx, k8s, ns, name, color)
		})
	}

	newOther("before", "green")
	waitConfigMap("before-other", "green", 60*time.Second)
	if follower.elected() {
		t.Fatalf("replica %s is elected while %s leads", follower.name, leader.name)
	}
	if leader.writes.Load() == 0 {
		t.Errorf("the leader (%s) made no writes, yet the resource was reconciled", leader.name)
	}
	if n := follower.writes.Load(); n != 0 {
		t.Errorf("the follower (%s) wrote %d times while not the leader", follower.name, n)
	}

	// Graceful shutdown of the leader releases the Lease: the follower
	// takes over without waiting for it to expire (it retries every 2 s;
	// an expiry would take the 15 s lease duration).
	stopped := time.Now()
	stop(leader)
	eventually(t, leaseDuration/2, func() error {
		if !follower.elected() {
			return fmt.Errorf("replica %s has not taken over", follower.name)
		}
		return nil
	})
	t.Logf("replica %s took over %s after %s stopped", follower.name, time.Since(stopped).Round(100*time.Millisecond), leader.name)

	newOther("after", "blue")
	waitConfigMap("after-other", "blue", 60*time.Second)
	if follower.writes.Load() == 0 {
		t.Errorf("the new leader (%s) made no writes, yet the resource was reconciled", follower.name)
	}
}

func ptr[T any](v T) *T { return &v }
