package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/lifecyclestate"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

const (
	ns   = "ns"
	orch = "demo"
	app  = "chat"
	root = "demo-chat"
)

var names = natsqueue.Names{Orchestra: orch}

// cluster is a fake API server with a fake kubelet: a scale of the root
// StatefulSet creates or deletes its pods, which become ready after
// startDelay.
type cluster struct {
	t          *testing.T
	cs         *fake.Clientset
	startDelay time.Duration

	// engine, when set, is host:port of an engine every ready root pod
	// stands for: the root Service's EndpointSlice lists it while a pod is
	// ready, as the endpoint controller would.
	engine string

	// stsMu makes each read-modify-write of the root StatefulSet atomic,
	// as the API server's are and the fake client's are not: a pod
	// counted ready while the leader patched its annotation was lost
	// (the patch wrote back the status it had read), and the wake
	// waited until the leader noticed the lost write.
	stsMu sync.Mutex

	mu sync.Mutex
	// uncounted: pods turn ready, but the StatefulSet controller never
	// counts them (as if it lagged).
	uncounted bool
	scales    []scaleWrite // every replica count written, in order
	onZero    func()       // runs inside the scale-to-zero write, before it returns
	pods      int
	// grace, when set, is the StatefulSet controller of a real cluster: a
	// scale down marks the pods terminating, still Ready and counted in
	// readyReplicas, and deletes them after grace; a pod the count asks
	// for again is created once its old self is gone.
	grace time.Duration
	gone  []string // pods deleted at the end of their grace period
}

type scaleWrite struct {
	name     string
	replicas int32
	at       time.Time
	manager  string
}

func newCluster(t *testing.T, replicas int32) *cluster {
	c := &cluster{t: t, startDelay: 50 * time.Millisecond}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: root, Namespace: ns, Generation: 1, Labels: map[string]string{
			"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "root", "modelorchestra.io/application": app,
		}},
		Spec:   appsv1.StatefulSetSpec{Replicas: &replicas},
		Status: appsv1.StatefulSetStatus{ObservedGeneration: 1, Replicas: replicas, ReadyReplicas: replicas, UpdatedReplicas: replicas},
	}
	c.cs = fake.NewClientset(sts)
	for i := range replicas {
		c.createPod(i, true)
	}
	c.cs.PrependReactor("patch", "statefulsets", c.reactScale)
	c.cs.PrependReactor("patch", "statefulsets", c.reactPatch)
	return c
}

// reactPatch applies a patch of the StatefulSet itself (the leader's
// status annotation) atomically.
func (c *cluster) reactPatch(a k8stesting.Action) (bool, runtime.Object, error) {
	pa := a.(k8stesting.PatchActionImpl)
	if pa.GetSubresource() != "" {
		return false, nil, nil
	}
	c.stsMu.Lock()
	defer c.stsMu.Unlock()
	gvr := appsv1.SchemeGroupVersion.WithResource("statefulsets")
	obj, err := c.cs.Tracker().Get(gvr, ns, pa.GetName())
	if err != nil {
		return true, nil, err
	}
	orig, err := json.Marshal(obj)
	if err != nil {
		return true, nil, err
	}
	patched, err := strategicpatch.StrategicMergePatch(orig, pa.GetPatch(), &appsv1.StatefulSet{})
	if err != nil {
		return true, nil, err
	}
	sts := &appsv1.StatefulSet{}
	if err := json.Unmarshal(patched, sts); err != nil {
		return true, nil, err
	}
	if err := c.cs.Tracker().Update(gvr, sts, ns); err != nil {
		return true, nil, err
	}
	return true, sts, nil
}

// reactScale implements the scale subresource's apply, which the fake
// client does not.
func (c *cluster) reactScale(a k8stesting.Action) (bool, runtime.Object, error) {
	pa := a.(k8stesting.PatchActionImpl)
	if pa.GetSubresource() != "scale" {
		return false, nil, nil
	}
	var sc autoscalingv1.Scale
	if err := json.Unmarshal(pa.GetPatch(), &sc); err != nil {
		return true, nil, err
	}
	n := sc.Spec.Replicas
	c.mu.Lock()
	c.scales = append(c.scales, scaleWrite{name: pa.GetName(), replicas: n, at: time.Now(), manager: pa.PatchOptions.FieldManager})
	onZero, grace := c.onZero, c.grace
	c.mu.Unlock()
	if n == 0 && onZero != nil {
		onZero()
	}
	if grace > 0 {
		return c.scaleGracefully(pa.GetName(), n, grace)
	}
	c.stsMu.Lock()
	obj, err := c.cs.Tracker().Get(appsv1.SchemeGroupVersion.WithResource("statefulsets"), ns, pa.GetName())
	if err != nil {
		c.stsMu.Unlock()
		return true, nil, err
	}
	sts := obj.(*appsv1.StatefulSet).DeepCopy()
	sts.Spec.Replicas = &n
	sts.Generation++
	sts.Status.ObservedGeneration = sts.Generation
	have := sts.Status.Replicas
	if n < have {
		sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.UpdatedReplicas = n, min(sts.Status.ReadyReplicas, n), n
	}
	err = c.cs.Tracker().Update(appsv1.SchemeGroupVersion.WithResource("statefulsets"), sts, ns)
	c.stsMu.Unlock()
	if err != nil {
		return true, nil, err
	}
	if n == 0 {
		c.slice(false) // the endpoint controller marks terminating pods first
	}
	for i := n; i < have; i++ {
		_ = c.cs.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ns, fmt.Sprintf("%s-%d", root, i))
	}
	for i := have; i < n; i++ {
		c.createPod(i, false)
		time.AfterFunc(c.startDelay, func() { c.ready(i) })
	}
	return true, &autoscalingv1.Scale{ObjectMeta: sts.ObjectMeta, Spec: autoscalingv1.ScaleSpec{Replicas: n}}, nil
}

// scaleGracefully is reactScale with terminating pods (cluster.grace).
func (c *cluster) scaleGracefully(name string, n int32, grace time.Duration) (bool, runtime.Object, error) {
	stsGVR, podGVR := appsv1.SchemeGroupVersion.WithResource("statefulsets"), corev1.SchemeGroupVersion.WithResource("pods")
	c.stsMu.Lock()
	obj, err := c.cs.Tracker().Get(stsGVR, ns, name)
	if err != nil {
		c.stsMu.Unlock()
		return true, nil, err
	}
	sts := obj.(*appsv1.StatefulSet).DeepCopy()
	sts.Spec.Replicas = &n
	sts.Generation++
	sts.Status.ObservedGeneration = sts.Generation
	err = c.cs.Tracker().Update(stsGVR, sts, ns)
	c.stsMu.Unlock()
	if err != nil {
		return true, nil, err
	}
	for i := range int32(3) {
		obj, err := c.cs.Tracker().Get(podGVR, ns, fmt.Sprintf("%s-%d", root, i))
		switch {
		case err != nil && i < n:
			c.createPod(i, false)
			time.AfterFunc(c.startDelay, func() { c.ready(i) })
		case err == nil && i >= n && obj.(*corev1.Pod).DeletionTimestamp == nil:
			p := obj.(*corev1.Pod).DeepCopy()
			p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			_ = c.cs.Tracker().Update(podGVR, p, ns)
			time.AfterFunc(grace, func() { c.podGone(i) })
		}
	}
	return true, &autoscalingv1.Scale{ObjectMeta: sts.ObjectMeta, Spec: autoscalingv1.ScaleSpec{Replicas: n}}, nil
}

// podGone deletes terminating pod i at the end of its grace period, and
// creates it again when the replica count asks for it.
func (c *cluster) podGone(i int32) {
	stsGVR, podGVR := appsv1.SchemeGroupVersion.WithResource("statefulsets"), corev1.SchemeGroupVersion.WithResource("pods")
	c.mu.Lock()
	c.gone = append(c.gone, fmt.Sprintf("%s-%d", root, i))
	c.mu.Unlock()
	_ = c.cs.Tracker().Delete(podGVR, ns, fmt.Sprintf("%s-%d", root, i))
	c.stsMu.Lock()
	obj, err := c.cs.Tracker().Get(stsGVR, ns, root)
	if err != nil {
		c.stsMu.Unlock()
		return
	}
	sts := obj.(*appsv1.StatefulSet).DeepCopy()
	sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.UpdatedReplicas = sts.Status.Replicas-1, max(sts.Status.ReadyReplicas-1, 0), sts.Status.Replicas-1
	_ = c.cs.Tracker().Update(stsGVR, sts, ns)
	c.stsMu.Unlock()
	if i < *sts.Spec.Replicas {
		c.createPod(i, false)
		time.AfterFunc(c.startDelay, func() { c.ready(i) })
	}
}

// terminating reports whether a root pod is on its way out.
func (c *cluster) terminating() bool {
	pods, err := c.cs.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), ns)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, p := range pods.(*corev1.PodList).Items {
		if p.DeletionTimestamp != nil {
			return true
		}
	}
	return false
}

func (c *cluster) createPod(i int32, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	c.mu.Lock()
	c.pods++
	uid := types.UID(fmt.Sprintf("uid-%d", c.pods))
	c.mu.Unlock()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", root, i), Namespace: ns, UID: uid, CreationTimestamp: metav1.Now(),
			Labels: map[string]string{"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "root", "modelorchestra.io/application": app}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
	if err := c.cs.Tracker().Add(p); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Errorf("creating pod: %v", err)
	}
}

// ready marks pod i ready and counts it in the StatefulSet's status.
func (c *cluster) ready(i int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	podGVR := corev1.SchemeGroupVersion.WithResource("pods")
	obj, err := c.cs.Tracker().Get(podGVR, ns, fmt.Sprintf("%s-%d", root, i))
	if err != nil {
		return // scaled down meanwhile
	}
	p := obj.(*corev1.Pod).DeepCopy()
	now := metav1.Now()
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}, {Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	_ = c.cs.Tracker().Update(podGVR, p, ns)
	if c.uncounted {
		c.slice(true)
		return
	}
	stsGVR := appsv1.SchemeGroupVersion.WithResource("statefulsets")
	c.stsMu.Lock()
	obj, err = c.cs.Tracker().Get(stsGVR, ns, root)
	if err != nil {
		c.stsMu.Unlock()
		return
	}
	sts := obj.(*appsv1.StatefulSet).DeepCopy()
	counted := i < *sts.Spec.Replicas
	if counted {
		sts.Status.Replicas = max(sts.Status.Replicas, i+1)
		sts.Status.ReadyReplicas = min(sts.Status.ReadyReplicas+1, *sts.Spec.Replicas)
		sts.Status.UpdatedReplicas = sts.Status.Replicas
		if err := c.cs.Tracker().Update(stsGVR, sts, ns); err != nil {
			c.t.Errorf("counting pod %d ready: %v", i, err)
		}
	}
	c.stsMu.Unlock()
	if counted {
		c.slice(true)
	}
}

// slice writes the root Service's EndpointSlice: the engine, ready or
// terminating.
func (c *cluster) slice(ready bool) {
	if c.engine == "" {
		return
	}
	host, port, _ := strings.Cut(c.engine, ":")
	p, _ := strconv.Atoi(port)
	terminating := !ready
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: root + "-x", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: root}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(p))}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Terminating: &terminating}}},
	}
	gvr := discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	if err := c.cs.Tracker().Update(gvr, es, ns); err != nil {
		_ = c.cs.Tracker().Add(es)
	}
}

func ptr[T any](v T) *T { return &v }

func (c *cluster) replicas() int32 {
	sts, err := c.cs.AppsV1().StatefulSets(ns).Get(context.Background(), root, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return *sts.Spec.Replicas
}

func (c *cluster) writes() []scaleWrite {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]scaleWrite(nil), c.scales...)
}

// env is a NATS server with the orchestra's streams, a fake cluster and a
// lifecycle controller.
type env struct {
	t   *testing.T
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	c   *cluster
	reg *prometheus.Registry
}

func newEnv(t *testing.T, replicas int32) *env {
	t.Helper()
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	err = natsqueue.Provision(context.Background(), js, natsqueue.StreamSpec{Names: names, Replicas: 1, MaxAge: time.Hour, Duplicates: time.Minute, DeadLetterMaxAge: time.Hour},
		[]natsqueue.ConsumerSpec{{App: app, AckWait: 30 * time.Second, MaxAckPending: 100}})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, srv: srv, nc: nc, js: js, c: newCluster(t, replicas), reg: prometheus.NewRegistry()}
}

func appConfig(mut func(*lifecycle.App)) lifecycle.Config {
	a := lifecycle.App{Name: app, RootStatefulSet: root, MinReplicas: 0, MaxReplicas: 3,
		ZeroAfter: metav1.Duration{Duration: 300 * time.Millisecond}, TargetQueuePerReplica: 2, Scaler: v1alpha1.ScalerBuiltin}
	if mut != nil {
		mut(&a)
	}
	return lifecycle.Config{Lease: "demo-lifecycle", Apps: []lifecycle.App{a}, Tick: metav1.Duration{Duration: 50 * time.Millisecond},
		Owner: &lifecycle.Owner{APIVersion: "modelorchestra.io/v1alpha1", Kind: "ModelOrchestra", Name: orch, UID: "u-1"}}
}

// start runs a controller until the test ends; stop ends it earlier.
func (e *env) start(cfg lifecycle.Config) (stop func()) {
	e.t.Helper()
	if err := cfg.Validate([]string{app}); err != nil {
		e.t.Fatal(err)
	}
	nc, err := nats.Connect(e.srv.ClientURL())
	if err != nil {
		e.t.Fatal(err)
	}
	ctl, err := lifecycle.New(cfg, lifecycle.Deps{NC: nc, Kube: e.c.cs, Namespace: ns, Orchestra: orch,
		Log: slog.New(slog.NewTextHandler(testWriter{e.t}, nil)), Registry: e.reg})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ctl.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; nc.Close() }) }
	e.t.Cleanup(stop)
	return stop
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (e *env) publish(n int) {
	e.t.Helper()
	for i := range n {
		m := nats.NewMsg(names.Request(app))
		m.Data = []byte(`{"model":"chat"}`)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%d-%d", e.t.Name(), time.Now().UnixNano(), i))
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) consumer() *jetstream.ConsumerInfo {
	e.t.Helper()
	c, err := e.js.Consumer(context.Background(), names.Stream(), names.Consumer(app))
	if err != nil {
		e.t.Fatal(err)
	}
	return c.CachedInfo()
}

func (e *env) state() v1alpha1.LifecycleStatus {
	kv, err := e.js.KeyValue(context.Background(), lifecyclestate.Bucket(orch))
	if err != nil {
		return v1alpha1.LifecycleStatus{}
	}
	en, err := kv.Get(context.Background(), app)
	if err != nil {
		return v1alpha1.LifecycleStatus{}
	}
	var st v1alpha1.LifecycleStatus
	_ = json.Unmarshal(en.Value(), &st)
	return st
}

// inState is a condition for eventually: the bucket holds state want.
func (e *env) inState(want v1alpha1.LifecycleState) func() error {
	return func() error {
		if st := e.state(); st.State != want {
			return fmt.Errorf("state %q in the bucket (message %q), want %s", st.State, st.Message, want)
		}
		return nil
	}
}

// atReplicas is a condition for eventually: the root StatefulSet asks for
// want replicas.
func (e *env) atReplicas(want int32) func() error {
	return func() error {
		if n := e.c.replicas(); n != want {
			return fmt.Errorf("the root StatefulSet has %d replicas, want %d", n, want)
		}
		return nil
	}
}

func TestIdleApplicationGoesToZeroAndWakesOnARequest(t *testing.T) {
	e := newEnv(t, 1)
	e.start(appConfig(nil))

	eventually(t, 10*time.Second, e.atReplicas(0))
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleZero))
	// The gate: at zero no dispatcher receives the application's requests.
	if !e.consumer().Paused {
		t.Fatal("at zero the consumer is not paused: dispatchers would take requests they cannot serve, and count deliveries")
	}
	sts, _ := e.c.cs.AppsV1().StatefulSets(ns).Get(context.Background(), root, metav1.GetOptions{})
	var ann v1alpha1.LifecycleStatus
	if err := json.Unmarshal([]byte(sts.Annotations[v1alpha1.AnnotationLifecycleStatus]), &ann); err != nil || ann.State != v1alpha1.LifecycleZero {
		t.Fatalf("root StatefulSet annotation %s = %q, want state Zero (%v)", v1alpha1.AnnotationLifecycleStatus, sts.Annotations[v1alpha1.AnnotationLifecycleStatus], err)
	}

	before := len(e.c.writes())
	published := time.Now()
	e.publish(1)
	eventually(t, 5*time.Second, func() error {
		if n := len(e.c.writes()); n == before {
			return fmt.Errorf("no replica count written since the request was published (%d writes)", n)
		}
		return nil
	})
	w := e.c.writes()[before]
	if w.replicas != 1 || w.name != root || w.manager != lifecycle.FieldManager {
		t.Fatalf("wake wrote %+v, want %s to 1 replica by %s", w, root, lifecycle.FieldManager)
	}
	// Event-driven: the wake is written as soon as the request is seen, not
	// on the next tick of a poll (the tick here is 50 ms; production 1 s).
	if d := w.at.Sub(published); d > 100*time.Millisecond {
		t.Errorf("the wake was written %v after the request was published, want under 100ms", d)
	}
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	if e.consumer().Paused {
		t.Error("awake, the consumer is still paused")
	}
	st := e.state()
	if st.Wakes != 1 || st.LastWake == nil || st.LastWake.Trigger != "request" || st.LastWake.Seconds == "" || st.LastWake.RequestsWaiting != 1 {
		t.Errorf("after the wake the state is %+v (last wake %+v), want 1 wake by a request with its duration and 1 request waiting", st, st.LastWake)
	}
	// The request is still queued, never delivered (no dispatcher runs here):
	// waking does not consume deliveries.
	if ci := e.consumer(); ci.NumPending != 1 || ci.Delivered.Consumer != 0 {
		t.Errorf("consumer has %d pending and %d delivered, want the request queued and undelivered", ci.NumPending, ci.Delivered.Consumer)
	}
	// kubectl describe shows the transitions, on the ModelOrchestra.
	want := []string{lifecycle.EventScaledToZero, lifecycle.EventWaking, lifecycle.EventAwake}
	eventually(t, 5*time.Second, func() error {
		evs, err := e.c.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing events: %w", err)
		}
		var got []string
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind != "ModelOrchestra" || ev.InvolvedObject.Name != orch || ev.Type != corev1.EventTypeNormal {
				return fmt.Errorf("event %s %q on %s %s, want Normal events on the ModelOrchestra %s", ev.Type, ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, orch)
			}
			if !strings.Contains(ev.Message, app) {
				return fmt.Errorf("event %s says %q, which does not name the application %s", ev.Reason, ev.Message, app)
			}
			got = append(got, ev.Reason)
		}
		slices.Sort(got)
		sorted := slices.Sorted(slices.Values(want))
		if !slices.Equal(got, sorted) {
			return fmt.Errorf("events %v, want one each of %v", got, want)
		}
		return nil
	})
}

// TestAReadyRootPodEndsTheWake: the wake ends when the root pod is ready,
// which the pod cache shows a controller hop before the StatefulSet counts
// it; here the StatefulSet never does.
func TestAReadyRootPodEndsTheWake(t *testing.T) {
	e := newEnv(t, 1)
	e.start(appConfig(nil))
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleZero))
	e.c.mu.Lock()
	e.c.uncounted = true
	e.c.mu.Unlock()
	e.publish(1)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	if e.consumer().Paused {
		t.Error("awake, the consumer is still paused")
	}
	sts, err := e.c.cs.AppsV1().StatefulSets(ns).Get(context.Background(), root, metav1.GetOptions{})
	if err != nil || sts.Status.ReadyReplicas != 0 {
		t.Fatalf("the StatefulSet counts %d ready replicas (%v); the test needs it to count none", sts.Status.ReadyReplicas, err)
	}
}

func TestARequestDuringTheDrainWins(t *testing.T) {
	e := newEnv(t, 1)
	// The request arrives while the replicas are being set to zero: the
	// application must wake again, and the request wait in the queue.
	e.c.mu.Lock()
	e.c.onZero = func() {
		e.c.mu.Lock()
		e.c.onZero = nil
		e.c.mu.Unlock()
		e.publish(1)
	}
	e.c.mu.Unlock()
	e.start(appConfig(nil))
	eventually(t, 10*time.Second, func() error {
		if w := e.c.writes(); len(w) < 2 || w[len(w)-1].replicas != 1 {
			return fmt.Errorf("replica counts written %+v, want a wake to 1 after the scale to zero the request raced", w)
		}
		return nil
	})
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	if ci := e.consumer(); ci.NumPending != 1 {
		t.Errorf("the racing request: %d pending in the consumer, want 1 (it was lost)", ci.NumPending)
	}
}

// A request that arrives as the leader writes zero replicas wakes the
// application while its root is still terminating (Ready, and counted in
// the StatefulSet's readyReplicas, as in a real cluster): the consumer stays
// paused until the new root is ready, so no dispatcher can hand the
// request to the root on its way out.
func TestAWakeThatOvertakesTheScaleToZeroWaitsForTheNewRoot(t *testing.T) {
	e := newEnv(t, 1)
	e.c.mu.Lock()
	e.c.grace = time.Second
	e.c.onZero = func() {
		e.c.mu.Lock()
		e.c.onZero = nil
		e.c.mu.Unlock()
		e.publish(1)
	}
	e.c.mu.Unlock()
	e.start(appConfig(nil))
	eventually(t, 10*time.Second, func() error {
		if !e.c.terminating() {
			return errors.New("the root is not terminating yet")
		}
		return nil
	})
	for e.c.terminating() {
		if !e.consumer().Paused {
			var counts []int32
			for _, w := range e.c.writes() {
				counts = append(counts, w.replicas)
			}
			t.Fatalf("the consumer was resumed while the root was terminating (replica counts written: %v): a dispatcher could send the waiting request to it", counts)
		}
		time.Sleep(5 * time.Millisecond)
	}
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	if ci := e.consumer(); ci.Paused || ci.NumPending != 1 {
		t.Errorf("awake: consumer paused %v with %d pending, want resumed with the racing request", ci.Paused, ci.NumPending)
	}
	e.c.mu.Lock()
	gone := e.c.gone
	e.c.mu.Unlock()
	if len(gone) != 1 {
		t.Errorf("pods deleted: %v, want the old root once (the wake overtook the scale to zero)", gone)
	}
}

func TestQueuedRequestsHoldOffTheDrain(t *testing.T) {
	e := newEnv(t, 1)
	cfg := appConfig(func(a *lifecycle.App) { a.MaxReplicas = 1 })
	e.publish(1) // queued: the application is not idle while it waits
	e.start(cfg)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	// Several idle periods pass with the request queued: it never goes to zero.
	consistently(t, 3*cfg.Apps[0].ZeroAfter.Duration, func() error {
		if n := e.c.replicas(); n != 1 {
			return fmt.Errorf("the root StatefulSet went to %d replicas while a request was queued", n)
		}
		if st := e.state(); st.State != v1alpha1.LifecycleAwake {
			return fmt.Errorf("state %q while a request was queued, want Awake", st.State)
		}
		return nil
	})

	// Take the request, as a dispatcher would; only then may it go to zero.
	cons, err := e.js.Consumer(context.Background(), names.Stream(), names.Consumer(app))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	taken := time.Now()
	eventually(t, 10*time.Second, e.atReplicas(0))
	for _, w := range e.c.writes() {
		if w.replicas == 0 && w.at.Before(taken) {
			t.Fatalf("scaled to zero at %v while a request was queued (taken at %v)", w.at, taken)
		}
	}
}

func TestBacklogScalesOutAndBackIn(t *testing.T) {
	e := newEnv(t, 1)
	e.start(appConfig(func(a *lifecycle.App) { a.MinReplicas = 1; a.ZeroAfter.Duration = 200 * time.Millisecond }))
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	e.publish(5) // ceil(5/2) = 3 = maxReplicas
	eventually(t, 5*time.Second, e.atReplicas(3))
	e.publish(10)
	s, err := e.js.Stream(context.Background(), names.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, e.atReplicas(1))
	for _, w := range e.c.writes() {
		if w.replicas > 3 || w.replicas < 1 {
			t.Errorf("wrote %d replicas, outside [minReplicas 1, maxReplicas 3]", w.replicas)
		}
	}
}

func TestANewLeaderWakesAnApplicationWithABacklog(t *testing.T) {
	e := newEnv(t, 0)
	e.publish(3)
	e.start(appConfig(nil))
	eventually(t, 5*time.Second, e.atReplicas(1))
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	if st := e.state(); st.LastWake == nil || st.LastWake.Trigger != "backlog" {
		t.Errorf("last wake %+v, want trigger backlog", st.LastWake)
	}
}

func TestWakeProblemsAreReported(t *testing.T) {
	e := newEnv(t, 0)
	e.c.startDelay = time.Hour // never ready
	e.start(appConfig(nil))
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleZero))
	e.publish(1)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleWaking))
	pod, err := e.c.cs.CoreV1().Pods(ns).Get(context.Background(), root+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "engine", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: "ImagePullBackOff", Message: `Back-off pulling image "nope:1"`}}}}
	if _, err := e.c.cs.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if m := e.state().Message; !strings.Contains(m, "ImagePullBackOff") {
			return fmt.Errorf("state message %q does not name the image pull failure", m)
		}
		return nil
	})
	if want := `pod demo-chat-0 container engine: ImagePullBackOff: Back-off pulling image "nope:1"`; e.state().Message != want {
		t.Errorf("message %q, want %q", e.state().Message, want)
	}
}

func TestStatesFollowTheBucket(t *testing.T) {
	e := newEnv(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	states, err := lifecyclestate.Watch(ctx, e.nc, orch, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if waking, _ := states.Waking(app); waking {
		t.Fatal("an unknown application counts as waking")
	}
	e.start(appConfig(nil))
	eventually(t, 10*time.Second, func() error {
		if waking, _ := states.Waking(app); !waking {
			return fmt.Errorf("the watcher does not see the application at zero (waking false)")
		}
		return nil
	})
	e.publish(1)
	eventually(t, 10*time.Second, func() error {
		if st, ok := states.Lookup(app); !ok || st.State != v1alpha1.LifecycleAwake {
			return fmt.Errorf("the watcher sees state %q (known %v), want Awake", st.State, ok)
		}
		return nil
	})
}
