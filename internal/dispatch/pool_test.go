package dispatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

func testHealth() Health {
	return Health{FailureThreshold: 2, EjectBase: metav1.Duration{Duration: time.Second}, EjectMax: metav1.Duration{Duration: 4 * time.Second}}
}

func TestPoolPrefersTheLeastLoadedRootAndCapsConcurrency(t *testing.T) {
	p := newPool(2, testHealth(), func(string, bool) {})
	p.set([]string{"http://a", "http://b"})
	ctx := context.Background()
	var got []string
	var held []lease
	for range 4 {
		r, err := p.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.url)
		held = append(held, r)
	}
	if diff := cmp.Diff([]string{"http://a", "http://b", "http://a", "http://b"}, got); diff != "" {
		t.Errorf("acquire order (-want +got):\n%s", diff)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.acquire(short); err == nil {
		t.Fatal("acquired a fifth slot from two roots of maxConcurrency 2")
	}
	p.release(held[1], true, true)
	r, err := p.acquire(ctx)
	if err != nil || r.url != "http://b" {
		t.Fatalf("after releasing b: %v %v", r, err)
	}
}

func TestPoolEjectsFailingRootsWithBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	var health []string
	p := newPool(10, testHealth(), func(u string, ok bool) {
		if ok {
			health = append(health, u+" up")
		} else {
			health = append(health, u+" down")
		}
	})
	p.now = func() time.Time { return now }
	p.set([]string{"http://a"})
	fail := func() {
		r, err := p.acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.release(r, false, true)
	}
	steps := []struct {
		name        string
		failures    int
		advance     time.Duration
		wantEjected bool
	}{
		{"one failure is tolerated", 1, 0, false},
		{"threshold ejects for ejectBase", 1, 0, true},
		{"ejection ends after ejectBase", 0, time.Second, false},
		{"a further failure doubles it", 1, time.Second + time.Millisecond, true},
		{"but not past ejectMax", 0, 0, true},
	}
	for _, s := range steps {
		for range s.failures {
			fail()
		}
		now = now.Add(s.advance)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		r, err := p.acquire(ctx)
		cancel()
		if ejected := err != nil; ejected != s.wantEjected {
			t.Fatalf("%s: ejected = %v, want %v", s.name, ejected, s.wantEjected)
		}
		if r.root != nil {
			p.release(r, true, false)
		}
	}
	if got := p.roots["http://a"].ejectedUntil.Sub(now); got != time.Second*2-time.Millisecond && got > 4*time.Second {
		t.Errorf("ejection beyond ejectMax: %v", got)
	}
	// One success heals the root.
	now = now.Add(5 * time.Second)
	l, err := p.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p.release(l, true, true)
	r := l.root
	if r.failures != 0 || !r.ejectedUntil.IsZero() {
		t.Errorf("after a success: %d failures, ejected until %v", r.failures, r.ejectedUntil)
	}
	if health[len(health)-1] != "http://a up" {
		t.Errorf("health reports %v, want the root reported up at the end", health)
	}
}

// TestPoolCountsABurstAsOneFailure: the requests in flight when an engine
// crashes fail together; they are one failure, not one each (each used to
// double the ejection: the only engine stayed out for about 30 s).
func TestPoolCountsABurstAsOneFailure(t *testing.T) {
	p := newPool(32, testHealth(), func(string, bool) {})
	p.set([]string{"http://a"})
	var burst []lease
	for range 16 {
		l, err := p.acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		burst = append(burst, l)
	}
	for _, l := range burst {
		p.release(l, false, true)
	}
	if r := p.roots["http://a"]; r.failures != 1 || !r.ejectedUntil.IsZero() {
		t.Fatalf("after a burst of 16: %d failures, ejected until %v; want 1 failure, not ejected", r.failures, r.ejectedUntil)
	}
	// Failures of requests started after it count: the threshold (2) ejects.
	l, _ := p.acquire(context.Background())
	p.release(l, false, true)
	if r := p.roots["http://a"]; r.failures != 2 || r.ejectedUntil.IsZero() {
		t.Fatalf("after a second failure: %d failures, ejected until %v; want ejected", r.failures, r.ejectedUntil)
	}
}

// TestPoolProbesEjectedRootsBackIn: an ejected root is back in rotation as
// soon as its health check passes, long before its back-off ends.
func TestPoolProbesEjectedRootsBackIn(t *testing.T) {
	h := testHealth()
	h.EjectBase.Duration, h.EjectMax.Duration = time.Hour, time.Hour
	h.ProbeInterval.Duration = 10 * time.Millisecond
	var healthy atomic.Bool
	probed := make(chan struct{}, 100)
	p := newPool(1, h, func(string, bool) {})
	p.probe = func(string) bool {
		probed <- struct{}{}
		return healthy.Load()
	}
	p.set([]string{"http://a"})
	for range h.FailureThreshold {
		l, _ := p.acquire(context.Background())
		p.release(l, false, true)
	}
	// Three failed probes leave it out.
	for range 3 {
		select {
		case <-probed:
		case <-time.After(5 * time.Second):
			t.Fatal("an ejected root was not probed")
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := p.acquire(short); err == nil {
		t.Fatal("an ejected root whose probe fails got traffic")
	}
	healthy.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.acquire(ctx); err != nil {
		t.Fatalf("the root did not come back after its probe passed: %v", err)
	}
}

func TestPoolKeepsInflightOfRemovedRoots(t *testing.T) {
	p := newPool(1, testHealth(), func(string, bool) {})
	p.set([]string{"http://a"})
	r, _ := p.acquire(context.Background())
	p.set([]string{"http://b"})
	if diff := cmp.Diff([]string{"http://b"}, p.urls()); diff != "" {
		t.Errorf("roots (-want +got):\n%s", diff)
	}
	p.release(r, true, true)
	if _, ok := p.roots["http://a"]; ok {
		t.Error("a removed root stayed after its last request")
	}
}

func TestRootURLs(t *testing.T) {
	yes, no := true, false
	name, port := "http", int32(8001)
	slice := func(ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{Ports: ports, Endpoints: eps}
	}
	ep := func(ready, terminating *bool, addrs ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
	}
	tests := []struct {
		name   string
		app    App
		slices []*discoveryv1.EndpointSlice
		want   []string
	}{
		{"ready and unknown endpoints count, others not", App{Port: 8000},
			[]*discoveryv1.EndpointSlice{slice(nil, ep(&yes, nil, "10.0.0.2"), ep(nil, nil, "10.0.0.1"), ep(&no, nil, "10.0.0.3"), ep(&yes, &yes, "10.0.0.4"))},
			[]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}},
		{"named port wins", App{Port: 8000, PortName: "http"},
			[]*discoveryv1.EndpointSlice{slice([]discoveryv1.EndpointPort{{Name: &name, Port: &port}}, ep(&yes, nil, "10.0.0.1"))},
			[]string{"http://10.0.0.1:8001"}},
		{"IPv6 and duplicates across slices", App{Port: 8000},
			[]*discoveryv1.EndpointSlice{slice(nil, ep(&yes, nil, "fd00::1")), slice(nil, ep(&yes, nil, "fd00::1"))},
			[]string{"http://[fd00::1]:8000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, rootURLs(tt.slices, tt.app)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A root's pod, when the lifecycle watches it, decides over the
// EndpointSlice, which follows it a controller hop later: a pod that serves
// (Ready, or answering its probes as it starts) is a root before the slice
// lists it, a terminating one is none while the slice still lists it ready.
func TestMergeRoots(t *testing.T) {
	app := App{Port: 8000, PortName: "http"}
	pod := func(ip string, ready, terminating bool) lifecycle.RootPod {
		p := &corev1.Pod{
			Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "sidecar", Ports: []corev1.ContainerPort{{Name: "sidecar", ContainerPort: 9300}}},
				{Name: "engine", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8001}}},
			}},
			Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}},
		}
		if ready {
			p.Status.Conditions[0].Status = corev1.ConditionTrue
		}
		if terminating {
			p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}
		return lifecycle.RootPod{Pod: p, Serves: lifecycle.RootServes(p)}
	}
	answering := func(ip string) lifecycle.RootPod { // not Ready yet, answering its probes
		r := pod(ip, false, false)
		r.Serves = true
		return r
	}
	tests := []struct {
		name  string
		slice []string
		pods  []lifecycle.RootPod // nil: no pod view (an application without a lifecycle)
		want  []string
	}{
		{"no pod view: the slice alone", []string{"http://10.0.0.1:8001"}, nil, []string{"http://10.0.0.1:8001"}},
		{"a Ready pod before the slice lists it", nil, []lifecycle.RootPod{pod("10.0.0.2", true, false)}, []string{"http://10.0.0.2:8001"}},
		{"a terminating pod the slice still lists", []string{"http://10.0.0.1:8001"}, []lifecycle.RootPod{pod("10.0.0.1", true, true)}, nil},
		{"a pod that turned unready", []string{"http://10.0.0.1:8001"}, []lifecycle.RootPod{pod("10.0.0.1", false, false)}, nil},
		{"the old root going, the new one ready", []string{"http://10.0.0.1:8001"},
			[]lifecycle.RootPod{pod("10.0.0.1", true, true), pod("10.0.0.2", true, false)}, []string{"http://10.0.0.2:8001"}},
		{"a pod without an address yet", []string{"http://10.0.0.1:8001"}, []lifecycle.RootPod{pod("", false, false), pod("10.0.0.1", true, false)}, []string{"http://10.0.0.1:8001"}},
		{"an endpoint no pod stands for stays", []string{"http://10.0.0.9:8001"}, []lifecycle.RootPod{pod("10.0.0.1", true, false)}, []string{"http://10.0.0.1:8001", "http://10.0.0.9:8001"}},
		{"a starting pod that answers its probes before the kubelet says Ready", nil, []lifecycle.RootPod{answering("10.0.0.2")}, []string{"http://10.0.0.2:8001"}},
		{"one root from both", []string{"http://10.0.0.1:8001"}, []lifecycle.RootPod{pod("10.0.0.1", true, false)}, []string{"http://10.0.0.1:8001"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pods map[string]bool
			if tt.pods != nil {
				pods = podRoots(tt.pods, app)
			}
			if diff := cmp.Diff(tt.want, mergeRoots(tt.slice, pods)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
