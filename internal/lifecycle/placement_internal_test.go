package lifecycle

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestPlanNodeLabels: the node label patches that make the weights labels
// true, from the node agents' copies and what was written before.
func TestPlanNodeLabels(t *testing.T) {
	const kc, ko = "weights.modelorchestra.io/ns.rel-chat", "weights.modelorchestra.io/ns.rel-other"
	keys := map[string]string{"rel-chat": kc, "rel-other": ko}
	s := func(v string) *string { return &v }
	node := func(name string, copies map[string]v1alpha1.Tier) NodeCopies {
		return NodeCopies{Node: name, OK: true, Copies: copies}
	}
	for _, tc := range []struct {
		name    string
		nodes   []NodeCopies
		written map[string]map[string]string
		want    []LabelPatch
	}{
		{"first pass: every key of every answering node, set or removed",
			[]NodeCopies{node("a", map[string]v1alpha1.Tier{"rel-chat": v1alpha1.TierHot}), node("b", map[string]v1alpha1.Tier{"rel-chat": v1alpha1.TierWarm, "rel-other": v1alpha1.TierHot})},
			nil,
			[]LabelPatch{{Node: "a", Labels: map[string]*string{kc: s("hot"), ko: nil}}, {Node: "b", Labels: map[string]*string{kc: s("warm"), ko: s("hot")}}}},
		{"nothing changed: no patch",
			[]NodeCopies{node("a", map[string]v1alpha1.Tier{"rel-chat": v1alpha1.TierHot})},
			map[string]map[string]string{"a": {kc: "hot", ko: ""}},
			nil},
		{"a copy evicted: its label removed; a copy promoted: hot",
			[]NodeCopies{node("a", nil), node("b", map[string]v1alpha1.Tier{"rel-other": v1alpha1.TierHot})},
			map[string]map[string]string{"a": {kc: "hot", ko: ""}, "b": {kc: "", ko: "warm"}},
			[]LabelPatch{{Node: "a", Labels: map[string]*string{kc: nil}}, {Node: "b", Labels: map[string]*string{ko: s("hot")}}}},
		{"an agent that did not answer: its node keeps its labels",
			[]NodeCopies{{Node: "a"}},
			map[string]map[string]string{"a": {kc: "hot", ko: ""}},
			nil},
		{"an agent gone from a node written before: its labels removed",
			[]NodeCopies{node("b", nil)},
			map[string]map[string]string{"a": {kc: "warm", ko: ""}, "b": {kc: "", ko: ""}},
			[]LabelPatch{{Node: "a", Labels: map[string]*string{kc: nil}}}},
		{"a cold copy is no label", []NodeCopies{node("a", map[string]v1alpha1.Tier{"rel-chat": v1alpha1.TierCold})}, map[string]map[string]string{"a": {kc: "", ko: ""}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, PlanNodeLabels(tc.nodes, keys, tc.written)); diff != "" {
				t.Errorf("PlanNodeLabels (-want +got):\n%s", diff)
			}
		})
	}
}

// fakeAgents serves GET /tiers for node agents at 127.0.0.N:port, one
// per node, with copies the test changes.
type fakeAgents struct {
	mu      sync.Mutex
	entries map[string][]nodeapi.Entry // by node
	port    int
}

func startFakeAgents(t *testing.T, nodes ...string) *fakeAgents {
	t.Helper()
	f := &fakeAgents{entries: map[string][]nodeapi.Entry{}}
	for i, n := range nodes {
		addr := net.JoinHostPort("127.0.0."+strconv.Itoa(i+1), strconv.Itoa(f.port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("listening on %s: %v", addr, err)
		}
		if f.port == 0 {
			f.port = l.Addr().(*net.TCPAddr).Port
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != nodeapi.PathTiers {
				http.NotFound(w, r)
				return
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			_ = json.NewEncoder(w).Encode(nodeapi.TiersStatus{Entries: f.entries[n]})
		})}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	return f
}

func (f *fakeAgents) set(node string, e ...nodeapi.Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries[node] = e
}

// TestNodeLabelsFollowTheAgentsCopies runs the leader's labeller against
// node agents over HTTP and a Kubernetes API (fake clientset): the nodes
// holding a hot or warm copy of an application's weights get its label,
// a copy evicted takes it away, other labels stay, nothing is patched
// when nothing changed, and a refused patch is counted, not fatal.
func TestNodeLabelsFollowTheAgentsCopies(t *testing.T) {
	const ns, kc, ko = "team", "weights.modelorchestra.io/team.rel-chat", "weights.modelorchestra.io/team.rel-other"
	agents := startFakeAgents(t, "gpu-1", "gpu-2")
	objs := []runtime.Object{}
	for _, n := range []string{"gpu-1", "gpu-2", "cpu-1"} {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}}})
	}
	kube := fake.NewClientset(objs...)
	patches := 0
	kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		return false, nil, nil
	})
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for i, n := range []string{"gpu-1", "gpu-2"} {
		_ = idx.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent-" + n, Labels: map[string]string{"app.kubernetes.io/component": "checkpoint-agent"}},
			Spec: corev1.PodSpec{NodeName: n}, Status: corev1.PodStatus{PodIP: "127.0.0." + strconv.Itoa(i+1)}})
	}
	sleep := func(mc, label string) *SleepConfig {
		return &SleepConfig{NodeLabel: label, Weights: Weights{ModelCheckpoint: mc, AgentSelector: "app.kubernetes.io/component=checkpoint-agent", AgentPort: int32(agents.port)}}
	}
	c := &Controller{
		deps:      Deps{Kube: kube, Namespace: ns},
		log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		pm:        newParkMetrics(prometheus.NewRegistry()),
		podLister: corelisters.NewPodLister(idx),
		apps:      []*appState{newAppState(App{Name: "chat", Sleep: sleep("rel-chat", kc)}), newAppState(App{Name: "other", Sleep: sleep("rel-other", ko)})},
	}
	lb := &nodeLabeller{kick: make(chan struct{}, 1), written: map[string]map[string]string{}}
	entry := func(name string, tier v1alpha1.Tier) nodeapi.Entry {
		e := nodeapi.Entry{Tier: tier}
		e.Namespace, e.Name = ns, name
		return e
	}
	labelsOf := func() map[string]map[string]string {
		out := map[string]map[string]string{}
		for _, n := range []string{"gpu-1", "gpu-2", "cpu-1"} {
			node, err := kube.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out[n] = node.Labels
		}
		return out
	}
	ctx := context.Background()

	// gpu-1 holds chat hot (and, not a copy a new pod reads, an engine's
	// offload of other, and a copy of another namespace's chat); gpu-2
	// holds chat warm.
	off := entry("rel-other", v1alpha1.TierHot)
	off.Offload = true
	foreign := entry("rel-chat", v1alpha1.TierHot)
	foreign.Namespace = "elsewhere"
	agents.set("gpu-1", entry("rel-chat", v1alpha1.TierWarm), entry("rel-chat", v1alpha1.TierHot), off)
	agents.set("gpu-2", entry("rel-chat", v1alpha1.TierWarm), foreign)
	c.labelNodes(ctx, lb, c.labelledApps())
	want := map[string]map[string]string{
		"gpu-1": {"kubernetes.io/hostname": "gpu-1", kc: "hot"},
		"gpu-2": {"kubernetes.io/hostname": "gpu-2", kc: "warm"},
		"cpu-1": {"kubernetes.io/hostname": "cpu-1"},
	}
	if diff := cmp.Diff(want, labelsOf()); diff != "" {
		t.Fatalf("node labels after the first pass (-want +got):\n%s", diff)
	}
	if patches != 2 {
		t.Errorf("%d patches in the first pass, want 2 (one per node with an agent)", patches)
	}

	patches = 0
	c.labelNodes(ctx, lb, c.labelledApps())
	if patches != 0 {
		t.Errorf("%d patches with nothing changed, want 0", patches)
	}

	// The agent on gpu-1 evicts chat; gpu-2 promotes it to hot and
	// places other warm.
	agents.set("gpu-1")
	agents.set("gpu-2", entry("rel-chat", v1alpha1.TierHot), entry("rel-other", v1alpha1.TierWarm))
	c.labelNodes(ctx, lb, c.labelledApps())
	want["gpu-1"] = map[string]string{"kubernetes.io/hostname": "gpu-1"}
	want["gpu-2"] = map[string]string{"kubernetes.io/hostname": "gpu-2", kc: "hot", ko: "warm"}
	if diff := cmp.Diff(want, labelsOf()); diff != "" {
		t.Fatalf("node labels after the copies moved (-want +got):\n%s", diff)
	}

	// The API server refuses the patch (no grant): counted, logged, and
	// the labels are tried again on the next pass.
	kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "gpu-1", nil)
	})
	agents.set("gpu-1", entry("rel-chat", v1alpha1.TierWarm))
	c.labelNodes(ctx, lb, c.labelledApps())
	c.labelNodes(ctx, lb, c.labelledApps())
	if n := testutil.ToFloat64(c.pm.labelPatches.WithLabelValues("forbidden")); n != 2 {
		t.Errorf("forbidden patches counted %v, want 2 (the refused change is tried again)", n)
	}
	if !lb.refused {
		t.Error("the refusal was not recorded")
	}
}
