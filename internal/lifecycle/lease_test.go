package lifecycle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
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

// TestAHeldLeaseHoldsOffTheScaleToZero: an engine slot lent to a gateway's
// direct lane is a request in flight: the application stays up, however
// long the gateway holds it, and goes to zero once it is returned (acked).
// Sleep decides on the same reading (Busy), so it holds off sleep too.
func TestAHeldLeaseHoldsOffTheScaleToZero(t *testing.T) {
	e := newEnv(t, 1)
	cfg := appConfig(func(a *lifecycle.App) { a.MaxReplicas = 1 })
	e.publishLeaseRequest()
	cons, err := e.js.Consumer(context.Background(), names.Stream(), names.LeaseConsumer(app))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held jetstream.Msg
	for m := range msgs.Messages() {
		held = m // granted: unacknowledged while the gateway holds it
	}
	if held == nil {
		t.Fatal("no lease request delivered")
	}
	e.start(cfg)
	eventually(t, 5*time.Second, e.inState(v1alpha1.LifecycleAwake))
	consistently(t, 4*cfg.Apps[0].ZeroAfter.Duration, func() error {
		if n := e.c.replicas(); n != 1 {
			return fmt.Errorf("the root StatefulSet went to %d replicas while a lease was held", n)
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
