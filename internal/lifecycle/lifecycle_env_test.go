package lifecycle_test

// The in-process application the scale-to-zero tests run: NATS, a fake
// Kubernetes API whose StatefulSets make and remove pods, and a leader.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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
