package lifecycle_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

// TestAWokenRootServesAtTheLeadersWordNotTheKubeletsNextProbe: a root pod
// that turned unready while its engine slept (the kubelet has not probed
// it since the wake) is not taken by a dispatcher while it sleeps, and is,
// once its probes pass, as soon as the leader says on WokenSubject that
// the engines woke: on every replica, not only the leader's.
func TestAWokenRootServesAtTheLeadersWordNotTheKubeletsNextProbe(t *testing.T) {
	e := newEnv(t, 0)
	var awake atomic.Bool
	sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !awake.Load() {
			http.Error(w, "asleep", http.StatusServiceUnavailable)
		}
	}))
	defer sidecar.Close()
	_, port, _ := net.SplitHostPort(sidecar.Listener.Addr().String())
	portN, _ := strconv.Atoi(port)

	// The root ran a minute ago, was Ready, and turned unready when its
	// engine fell asleep.
	started := metav1.NewTime(time.Now().Add(-time.Minute))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: root + "-0", Namespace: ns, UID: "uid-asleep",
			Labels: map[string]string{"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "root", "modelorchestra.io/application": app}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "sidecar", Ports: []corev1.ContainerPort{{Name: "sidecar", ContainerPort: int32(portN)}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("sidecar")}}},
		}}},
		Status: corev1.PodStatus{
			PodIP:      "127.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(started.Add(30 * time.Second))}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "sidecar", Started: ptr(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}},
		},
	}
	if err := e.c.cs.Tracker().Add(pod); err != nil {
		t.Fatal(err)
	}

	var serves atomic.Bool
	nc, err := nats.Connect(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A replica that is not the leader: another holds the Lease.
	cfg := appConfig(nil)
	ctl, err := lifecycle.New(cfg, lifecycle.Deps{NC: nc, Kube: e.c.cs, Namespace: ns, Orchestra: orch, Identity: "replica",
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		RootPods: func(_ string, pods []lifecycle.RootPod) {
			for _, p := range pods {
				if p.Pod.UID == pod.UID {
					serves.Store(p.Serves)
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	holdLease(t, e, cfg.Lease, "the-leader")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ctl.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Asleep: not taken, even with its sidecar answering (the kubelet's
	// word alone counts).
	awake.Store(true)
	consistently(t, 300*time.Millisecond, func() error {
		if serves.Load() {
			return errServesAsleep
		}
		return nil
	})

	woke := time.Now()
	if err := e.nc.Publish(lifecycle.WokenSubject(orch, app), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, func() error {
		if !serves.Load() {
			return errNotServing
		}
		return nil
	})
	t.Logf("the woken root served %v after the leader's word", time.Since(woke).Round(time.Millisecond))
}

var (
	errServesAsleep = errors.New("the sleeping root is taken before any wake")
	errNotServing   = errors.New("the woken root is not taken")
)

// holdLease makes holder the lifecycle leader for the next hour, so that
// the controllers a test starts are replicas that follow it.
func holdLease(t *testing.T, e *env, name, holder string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr(holder), LeaseDurationSeconds: ptr(int32(3600)),
			AcquireTime: &now, RenewTime: &now},
	}
	if _, err := e.c.cs.CoordinationV1().Leases(ns).Create(context.Background(), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
