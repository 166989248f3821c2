package lifecycle_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"
)

// TestEnginesSleepWhenIdleAndWakeOnTheNextRequest: the idle application's
// engine is put to sleep through its sidecar (the pod stays), and the next
// requests, sent through the queue to the dispatcher that runs the
// lifecycle, wake it: every answer arrives, the restored bytes verify, no
// request reached the sleeping engine and none was lost or redelivered.
func TestEnginesSleepWhenIdleAndWakeOnTheNextRequest(t *testing.T) {
	p := newSleepPlane(t, planeOptions{inDispatcher: true})
	p.asleep(1, v1alpha1.TierHot)
	p.wantHistory(0, 1) // the agent learns of the sleep
	if st := p.e.state(); st.Sleeps != 1 || st.Replicas != 1 {
		t.Errorf("asleep: %d sleeps and %d replicas, want 1 sleep and the pod kept", st.Sleeps, st.Replicas)
	}
	if p.e.c.replicas() != 1 {
		t.Fatal("sleeping removed the pod")
	}

	// The leader tells every dispatcher when the engines woke, so that they
	// take the woken roots before the kubelet's next probe (woken.go).
	woken, err := p.e.nc.SubscribeSync(lifecycle.WokenSubject(orch, app))
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	if err := sendBatch(p.client, "asleep", n); err != nil {
		t.Fatalf("requests sent to sleeping engines were lost or failed:\n%v", err)
	}
	p.lastWake(fmt.Sprintf("a wake by a request from the hot tier restoring %d bytes, with its speed", weightsBytes), func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierHot && lw.Bytes == weightsBytes && lw.BytesPerSecond > 0 && lw.Seconds != "" && lw.Trigger == "request"
	})
	if _, err := woken.NextMsg(time.Second); err != nil {
		t.Errorf("the leader did not say on %s that the engines woke: %v", lifecycle.WokenSubject(orch, app), err)
	}
	if m, err := woken.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("the leader said twice that the engines woke (%s)", m.Subject)
	}
	if st := p.e.state(); st.Wakes != 1 {
		t.Errorf("%d wakes, want 1", st.Wakes)
	}
	firstToken(t, p.e, 0)
	if w := p.sim.WeightsStatus(); w.Wakes != 1 || w.Verified != 1 || w.LastWake == nil || w.LastWake.Tier != v1alpha1.TierHot {
		t.Errorf("engine: %d wakes, %d verified, last %+v; want 1 verified wake from the hot tier", w.Wakes, w.Verified, w.LastWake)
	}
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep: the dispatcher sent requests to a sleeping engine", r)
	}
	ci := p.e.consumer()
	if ci.NumRedelivered != 0 || ci.Delivered.Consumer != n {
		t.Errorf("consumer delivered %d times with %d redelivered, want each of the %d requests delivered once", ci.Delivered.Consumer, ci.NumRedelivered, n)
	}
	if f := sum(t, p.dispatcherReg, "orchestra_dispatcher_failed_total"); f != 0 {
		t.Errorf("%v failed deliveries, want 0", f)
	}
	if c := counter(t, p.dispatcherReg, "orchestra_lifecycle_engine_wakes_total", map[string]string{"tier": "Hot", "result": "ok"}); c != 1 {
		t.Errorf("orchestra_lifecycle_engine_wakes_total{tier=Hot,result=ok} = %v, want 1", c)
	}
	if b := counter(t, p.dispatcherReg, "orchestra_lifecycle_restored_bytes_total", map[string]string{"tier": "Hot"}); b != weightsBytes {
		t.Errorf("orchestra_lifecycle_restored_bytes_total{tier=Hot} = %v, want %d", b, weightsBytes)
	}
	// Idle again, it sleeps again.
	p.asleep(1, v1alpha1.TierHot)
	p.wantHistory(1, 2)
}

// TestARequestWhileFallingAsleepCancelsTheSleep: a request that arrives
// while the engines are being put to sleep wins: the sleep is cancelled,
// the request answered, and the engine never refuses one.
func TestARequestWhileFallingAsleepCancelsTheSleep(t *testing.T) {
	p := newSleepPlane(t, planeOptions{inDispatcher: true})
	p.sleepDelay.Store(int64(time.Hour)) // the sidecar sleeps only when the caller waits for it
	// Draining is published just before the consumer pauses: wait for both,
	// so that the requests find the engines falling asleep.
	eventually(t, 10*time.Second, func() error {
		if st, paused := p.e.state().State, p.e.consumer().Paused; st != v1alpha1.LifecycleDraining || !paused {
			return fmt.Errorf("state %s, consumer paused %v; want the decision to sleep (Draining) with the consumer paused", st, paused)
		}
		return nil
	})
	if err := sendBatch(p.client, "falling", 4); err != nil {
		t.Fatalf("requests sent while the engines fell asleep were lost or failed:\n%v", err)
	}
	if c := counter(t, p.dispatcherReg, "orchestra_lifecycle_sleeps_total", map[string]string{"outcome": "cancelled"}); c < 1 {
		t.Errorf("orchestra_lifecycle_sleeps_total{outcome=cancelled} = %v, want the sleep cancelled by the request", c)
	}
	if w := p.sim.WeightsStatus(); w.Wakes != 0 || p.sidecarState().Sleeps != 0 {
		t.Errorf("the engine slept (%d wakes, sidecar %d sleeps): the request did not cancel the sleep", w.Wakes, p.sidecarState().Sleeps)
	}
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests", r)
	}
}

// TestAFailingWakeIsRetriedAndReported: while the engine cannot wake, the
// requests wait in the queue, the status says why and the leader retries;
// once the engine wakes the requests are answered, none lost, none sent to
// the sleeping engine.
func TestAFailingWakeIsRetriedAndReported(t *testing.T) {
	p := newSleepPlane(t, planeOptions{inDispatcher: true})
	p.asleep(1, v1alpha1.TierHot)
	p.failWake.Store(true)
	errc := make(chan error, 1)
	go func() { errc <- sendBatch(p.client, "failing", 4) }()
	eventually(t, 10*time.Second, func() error {
		st := p.e.state()
		if st.State != v1alpha1.LifecycleWaking || !strings.Contains(st.Message, "waking the engines failed (attempt 2") ||
			!strings.Contains(st.Message, "injected: the engine cannot wake") {
			return fmt.Errorf("state %s, message %q; want the failed wake in the status", st.State, st.Message)
		}
		return nil
	})
	if c := counter(t, p.dispatcherReg, "orchestra_lifecycle_engine_wakes_total", map[string]string{"result": "failed"}); c < 2 {
		t.Errorf("orchestra_lifecycle_engine_wakes_total{result=failed} = %v, want the retries counted", c)
	}
	if p.e.consumer().Paused == false {
		t.Fatal("the gate opened while the engine could not wake")
	}
	p.failWake.Store(false)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("requests waiting through failed wakes were lost or failed:\n%v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the requests were not answered after the engine could wake again")
	}
	// The gate opens first; the status follows.
	eventually(t, 5*time.Second, func() error {
		if st := p.e.state(); st.Message != "" || st.LastWake == nil || st.LastWake.Bytes != weightsBytes {
			return fmt.Errorf("message %q, last wake %+v; want the message cleared and the wake's bytes in the status", st.Message, st.LastWake)
		}
		return nil
	})
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep", r)
	}
}

// TestAFailedSeatsPodIsRestarted: an engine that fails its wake and then
// no longer answers leaves its sidecar Failed; the leader deletes the pod (its
// StatefulSet starts it again), and the wake completes with the new pod.
func TestAFailedSeatsPodIsRestarted(t *testing.T) {
	p := newSleepPlane(t, planeOptions{inDispatcher: true})
	p.asleep(1, v1alpha1.TierHot)
	p.broken.Store(true)
	errc := make(chan error, 1)
	go func() { errc <- sendBatch(p.client, "failed", 2) }()
	podGVR := corev1.SchemeGroupVersion.WithResource("pods")
	eventually(t, 10*time.Second, func() error {
		if _, err := p.e.c.cs.Tracker().Get(podGVR, ns, root+"-0"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the pod of the Failed sidecar is not deleted: %w", err)
		}
		return nil
	})
	if s := p.sidecarState(); s.State != sidecarapi.Failed {
		t.Fatalf("sidecar %s, want Failed", s.State)
	}
	if c := counter(t, p.dispatcherReg, "orchestra_lifecycle_engine_restarts_total", nil); c != 1 {
		t.Errorf("orchestra_lifecycle_engine_restarts_total = %v, want 1", c)
	}
	if !p.e.consumer().Paused {
		t.Fatal("the gate opened with no root running")
	}
	// The StatefulSet starts the pod again; here the same engine answers
	// again and its sidecar learns that it sleeps.
	p.broken.Store(false)
	p.e.c.createPod(0, true)
	p.placeRoot()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("requests waiting through the restart were lost or failed:\n%v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the requests were not answered after the pod was restarted")
	}
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep", r)
	}
}

// TestANewLeaderContinuesAWake: the leader is stopped while the engine
// wakes; the next one reads the sidecar's state, finishes the wake (one engine
// wake, not two) and opens the gate: the request is answered.
func TestANewLeaderContinuesAWake(t *testing.T) {
	p := newSleepPlane(t, planeOptions{sim: func(c *sim.Config) { c.Faults.WakeDelay = 3 * time.Second }})
	cfg := p.config(nil)
	stopA := p.startLeader("leader-a", cfg)
	p.asleep(1, v1alpha1.TierHot)
	p.startLeader("leader-b", cfg) // waits for the Lease

	errc := make(chan error, 1)
	go func() { errc <- sendBatch(p.client, "handover", 2) }()
	eventually(t, 10*time.Second, func() error {
		if st := p.sidecarState().State; st != sidecarapi.Waking {
			return fmt.Errorf("sidecar %s, want the engine waking", st)
		}
		return nil
	})
	stopA() // releases the Lease mid-wake
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("requests waiting through the leader change were lost or failed:\n%v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the requests were not answered after the leader change")
	}
	if w := p.sim.WeightsStatus(); w.Wakes != 1 || w.Verified != 1 {
		t.Errorf("engine: %d wakes, %d verified; want the one wake, verified", w.Wakes, w.Verified)
	}
	p.lastWake("the wake from the hot tier finished by the new leader", func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierHot && lw.Seconds != "" && lw.Bytes == weightsBytes
	})
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep", r)
	}
}
