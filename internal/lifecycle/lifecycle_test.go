package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/lifecyclestate"
)

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
