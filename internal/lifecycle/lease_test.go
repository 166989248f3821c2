package lifecycle_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// publishLeaseRequest queues a gateway's request for an engine slot
// (internal/natsqueue/lease.go).
func (e *env) publishLeaseRequest() {
	e.t.Helper()
	m := nats.NewMsg(names.Lease(app))
	m.Header.Set("Orch-Reply", "_INBOX.test")
	m.Header.Set("Orch-Deadline", fmt.Sprint(time.Now().Add(2*time.Second).UnixMilli()))
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) leaseConsumer() *jetstream.ConsumerInfo {
	e.t.Helper()
	c, err := e.js.Consumer(context.Background(), names.Stream(), names.LeaseConsumer(app))
	if err != nil {
		e.t.Fatal(err)
	}
	return c.CachedInfo()
}

// holdLease has a fake gateway take one engine slot: its lease request is
// delivered and left unacknowledged (held) until the returned message is
// acknowledged (given back).
func (e *env) holdLease() jetstream.Msg {
	e.t.Helper()
	e.publishLeaseRequest()
	cons, err := e.js.Consumer(context.Background(), names.Stream(), names.LeaseConsumer(app))
	if err != nil {
		e.t.Fatal(err)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	var held jetstream.Msg
	for m := range msgs.Messages() {
		held = m
	}
	if held == nil {
		e.t.Fatal("no lease request delivered")
	}
	return held
}

// reportUse sends a gateway's lease use report (natsqueue.LeaseUse).
func (e *env) reportUse(busy bool) {
	e.t.Helper()
	b, _ := json.Marshal(natsqueue.LeaseUse{Instance: "gw-1", Lease: "lease-1", Busy: busy})
	if err := e.nc.Publish(names.LeaseUse(app), b); err != nil {
		e.t.Fatal(err)
	}
}

// TestAnIdleLeaseDoesNotHoldOffTheScaleToZero: an engine slot lent to a
// gateway's direct lane that no request runs on is no demand: the
// application decides to go to zero at its idle limit (once the leader
// can tell, LeaseUseStale after it started), and the drain waits, gate
// closed and pods up, until the lease is given back (acknowledged).
func TestAnIdleLeaseDoesNotHoldOffTheScaleToZero(t *testing.T) {
	e := newEnv(t, 1)
	cfg := appConfig(func(a *lifecycle.App) { a.MaxReplicas = 1 })
	held := e.holdLease()
	started := time.Now()
	e.start(cfg)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	// The leader cannot tell an idle lease from a busy one for three
	// heartbeats after it started: the lease counts as busy meanwhile.
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleDraining))
	if d := time.Since(started); d < natsqueue.LeaseUseStale {
		t.Errorf("draining %v after the leader started, before it could tell the lease is idle (%v)", d, natsqueue.LeaseUseStale)
	}
	consistently(t, time.Second, func() error {
		if n := e.c.replicas(); n != 1 {
			return fmt.Errorf("the root StatefulSet went to %d replicas while a lease was held", n)
		}
		if st := e.state(); st.State != v1alpha1.LifecycleDraining {
			return fmt.Errorf("state %q while the drain waits for the lease, want Draining", st.State)
		}
		return nil
	})
	if err := held.Ack(); err != nil { // returned
		t.Fatal(err)
	}
	returned := time.Now()
	eventually(t, 10*time.Second, e.atReplicas(0))
	for _, w := range e.c.writes() {
		if w.replicas == 0 && w.at.Before(returned) {
			t.Fatalf("scaled to zero at %v while a lease was held (returned at %v)", w.at, returned)
		}
	}
	// The gate closes the lease consumer with the application's: no slot
	// is lent while the application is at zero.
	eventually(t, 5*time.Second, func() error {
		if !e.leaseConsumer().Paused {
			return fmt.Errorf("at zero the lease consumer is not paused")
		}
		return nil
	})
}

// TestABusyLeaseHoldsOffTheScaleToZero: while a gateway reports a request
// running on its lease (every second), the application stays awake
// however long it runs; after the request ends it goes to zero at its
// idle limit, counted from the last report.
func TestABusyLeaseHoldsOffTheScaleToZero(t *testing.T) {
	e := newEnv(t, 1)
	cfg := appConfig(func(a *lifecycle.App) { a.MaxReplicas = 1 })
	held := e.holdLease()
	e.start(cfg)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	e.reportUse(true)
	stop := make(chan struct{})
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		t := time.NewTicker(natsqueue.LeaseUseEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				e.reportUse(true)
			}
		}
	}()
	consistently(t, natsqueue.LeaseUseStale+10*cfg.Apps[0].ZeroAfter.Duration, func() error {
		if st := e.state(); st.State != v1alpha1.LifecycleAwake {
			return fmt.Errorf("state %q while a request runs on the lease, want Awake", st.State)
		}
		return nil
	})
	close(stop)
	<-beats
	e.reportUse(false)
	ended := time.Now()
	if err := held.Ack(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, e.atReplicas(0))
	for _, w := range e.c.writes() {
		if w.replicas == 0 && w.at.Sub(ended) < cfg.Apps[0].ZeroAfter.Duration {
			t.Fatalf("scaled to zero %v after the request on the lease ended, before the idle limit %v", w.at.Sub(ended), cfg.Apps[0].ZeroAfter.Duration)
		}
	}
}

// TestADirectRequestCancelsTheDrain: a request that starts on a held lease
// while the drain waits for it (the race with the decision) cancels the
// drain: the application stays awake, and the request finishes on it.
func TestADirectRequestCancelsTheDrain(t *testing.T) {
	e := newEnv(t, 1)
	cfg := appConfig(func(a *lifecycle.App) { a.MaxReplicas = 1 })
	held := e.holdLease()
	e.start(cfg)
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleDraining))
	e.reportUse(true)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	if n := e.c.replicas(); n != 1 {
		t.Fatalf("%d replicas after a direct request cancelled the drain, want 1", n)
	}
	e.reportUse(false)
	if err := held.Ack(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, e.atReplicas(0))
}

// TestALeaseRequestDoesNotWake: lease requests are not demand; one queued
// while the application is at zero leaves it there.
func TestALeaseRequestDoesNotWake(t *testing.T) {
	e := newEnv(t, 1)
	cfg := appConfig(nil)
	e.start(cfg)
	eventually(t, 10*time.Second, e.atReplicas(0))
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleZero))
	before := len(e.c.writes())
	e.publishLeaseRequest()
	consistently(t, 4*cfg.Apps[0].ZeroAfter.Duration, func() error {
		if n := len(e.c.writes()); n != before {
			return fmt.Errorf("a replica count was written after a lease request at zero: %+v", e.c.writes()[before:])
		}
		if st := e.state(); st.State != v1alpha1.LifecycleZero {
			return fmt.Errorf("state %q after a lease request at zero, want Zero", st.State)
		}
		return nil
	})
}
