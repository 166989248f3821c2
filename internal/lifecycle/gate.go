package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// The gates, and their one owner. An application's gate is its JetStream
// consumer (consumerGate). A seat group adds one gate per pod and member
// (seatPodRun.gates), from which this file writes the group's
// SeatServingAnnotation and opens or closes the member's consumer
// (applyGates; the rules are seatserving.go's).
//
// The consumer gate is an application's JetStream consumer, paused on the server
// while no root serves: requests wait in the stream, counting no delivery,
// and the dispatchers' pull requests wait on the consumer. nats-server
// cannot be relied on to serve the pull requests that wait on a consumer
// when it resumes: mostly only a new message, a new pull request or a
// change of MaxAckPending makes it look at them, sometimes the resume does (and an update of the configuration
// leaves a pause as it is, so the resume cannot ride on one). openGate
// therefore resumes the consumer and, without waiting for an answer,
// sends the consumer one pull request that can take no message: the
// server serves the waiting pull requests in order, and drops this one.
// An update of MaxAckPending by one and back follows, off the path of the
// first request: the safety net for a server that would not serve on a
// pull request, or a pull request that reaches the consumer before the
// resume does.

// gateHold is how long one pause of a consumer lasts. The leader renews
// nothing: it reopens the gate when a root serves, and a new leader closes
// or opens it at once; the bound only matters when no dispatcher with a
// lifecycle runs any more.
const gateHold = 24 * time.Hour

// Gate is the state of a gate, as the leader set it last: an
// application's or a seat-group member's consumer (consumerGate, written
// only in this file), or one pod of a seat group for one application
// (seatserving.go). One type for every gate.
type Gate string

const (
	// GateUnknown: not known (a new leader, or the last change failed).
	GateUnknown Gate = ""
	// GateOpen: requests flow (a pod: awake and serving; listed in
	// SeatServingAnnotation).
	GateOpen Gate = "open"
	// GateDraining, a pod's only: it was serving and is being taken out (a
	// drain or a sleep): still listed, so that the requests dispatchers
	// hold reach its engine, and the application's consumer stays paused
	// until the pod's engine is asleep, so that what is in flight can be
	// counted and nothing new is handed out.
	GateDraining Gate = "draining"
	// GateClosed: held (a consumer paused on the server; a pod not
	// serving: asleep, waking, or gone).
	GateClosed Gate = "closed"
)

// consumerGate is one application's consumer as its gate: an
// application's (appState) or a seat-group member's (seatMember). Only
// this file writes its gate; the step that reads the consumer keeps its
// configuration.
type consumerGate struct {
	// app names the consumer's application.
	app string
	// gate is the gate as last set: GateOpen, GateClosed or GateUnknown.
	gate Gate
	// holdFailed: the last close did not get the server's answer (or a
	// reading found the pause reset), so requests may still be handed out
	// until a close succeeds.
	holdFailed bool
	// consumer is the consumer's configuration as last read, at
	// consumerAt: openGate writes it back resumed.
	consumer   *jetstream.ConsumerConfig
	consumerAt time.Time
}

// observeGate takes a reading of the consumer: a consumer found open where
// the gate was closed had its pause reset (a dispatcher that provisioned
// the consumer again resets it), so the gate is unknown, and the next close
// is not skipped.
func observeGate(g *consumerGate, r consumerReading) {
	if r.OK && g.gate == GateClosed && !r.Paused {
		g.gate, g.holdFailed = GateUnknown, true
	}
}

// setGate brings the gate to want (GateClosed or GateOpen), unless it
// knows the gate is there already.
func (c *Controller) setGate(ctx context.Context, g *consumerGate, want Gate) error {
	if g.gate == want {
		return nil
	}
	if want == GateOpen {
		return c.openGate(ctx, g)
	}
	return c.closeGate(ctx, g)
}

// closeGate pauses the application's consumer on the server: from its
// answer on, no dispatcher receives a request of the application (requests
// stay in the stream, counting no delivery, however long the wake takes).
func (c *Controller) closeGate(ctx context.Context, g *consumerGate) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.js.PauseConsumer(pctx, c.names.Stream(), c.names.Consumer(g.app), c.now().Add(gateHold)); err != nil {
		g.gate, g.holdFailed = GateUnknown, true
		return fmt.Errorf("pausing the consumer of %s: %w", g.app, err)
	}
	// The lease consumer closes with it: no engine slot is lent to a
	// gateway's direct lane while the gate is closed. It is missing only
	// while dispatchers of an older release run, which lend nothing.
	if _, err := c.js.PauseConsumer(pctx, c.names.Stream(), c.names.LeaseConsumer(g.app), c.now().Add(gateHold)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		g.gate, g.holdFailed = GateUnknown, true
		return fmt.Errorf("pausing the lease consumer of %s: %w", g.app, err)
	}
	g.gate, g.holdFailed = GateClosed, false
	return nil
}

// openGate resumes the application's consumer and has the server serve
// the pull requests that waited while it was paused (serveWaitingPulls);
// the update of MaxAckPending (nudge) runs after it returns.
func (c *Controller) openGate(ctx context.Context, g *consumerGate) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, consumer := c.names.Stream(), c.names.Consumer(g.app)
	if _, err := c.js.ResumeConsumer(rctx, stream, consumer); err != nil {
		g.gate = GateUnknown
		return fmt.Errorf("resuming the consumer of %s: %w", g.app, err)
	}
	if _, err := c.js.ResumeConsumer(rctx, stream, c.names.LeaseConsumer(g.app)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		g.gate = GateUnknown
		return fmt.Errorf("resuming the lease consumer of %s: %w", g.app, err)
	}
	g.gate, g.holdFailed = GateOpen, false
	if err := serveWaitingPulls(c.deps.NC, stream, consumer); err != nil {
		c.log.Warn("asking the consumer to serve its waiting pull requests", "app", g.app, "err", err)
	}
	var cfg *jetstream.ConsumerConfig
	if g.consumer != nil && c.now().Sub(g.consumerAt) <= consumerFresh {
		read := *g.consumer
		cfg = &read
	}
	go c.nudge(ctx, g.app, cfg)
	return nil
}

// consumerFresh is how long the nudge trusts the consumer's configuration
// as last read.
const consumerFresh = time.Second

// nudge updates the consumer's MaxAckPending by one and back, which makes
// the server serve the pull requests waiting on it; cfg is its
// configuration, nil to read it first.
func (c *Controller) nudge(ctx context.Context, app string, cfg *jetstream.ConsumerConfig) {
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, consumer := c.names.Stream(), c.names.Consumer(app)
	err := func() error {
		if cfg == nil {
			cons, err := c.js.Consumer(nctx, stream, consumer)
			if err != nil {
				return fmt.Errorf("reading the consumer: %w", err)
			}
			read := cons.CachedInfo().Config
			cfg = &read
		}
		want := cfg.MaxAckPending
		for _, n := range []int{want + 1, want} {
			cfg.MaxAckPending = n
			if _, err := c.js.UpdateConsumer(nctx, stream, *cfg); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil && ctx.Err() == nil {
		c.log.Warn("signalling the consumer after opening the gate", "app", app, "err", err)
	}
}

// pullRequest is the body of a JetStream pull request
// ($JS.API.CONSUMER.MSG.NEXT).
type pullRequest struct {
	Batch    int           `json:"batch"`
	MaxBytes int           `json:"max_bytes"`
	Expires  time.Duration `json:"expires"`
}

// serveWaitingPulls sends the consumer a pull request for at most one
// byte, which no message fits: the server looks at its waiting pull
// requests, serves them in order and ends this one (a message larger than
// a request's max_bytes ends the request, and is left for the next one),
// so that no message is ever delivered to it. Its reply subject is an
// inbox nobody listens on. It returns once the request is written to the
// connection.
func serveWaitingPulls(nc *nats.Conn, stream, consumer string) error {
	return pullNothing(nc, stream, consumer, nc.NewInbox())
}

// pullNothing sends the pull request of serveWaitingPulls with reply
// subject reply.
func pullNothing(nc *nats.Conn, stream, consumer, reply string) error {
	body, err := json.Marshal(pullRequest{Batch: 1, MaxBytes: 1, Expires: time.Second})
	if err != nil {
		return err
	}
	subject := fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", stream, consumer)
	if err := nc.PublishRequest(subject, reply, body); err != nil {
		return fmt.Errorf("publishing a pull request to %s: %w", consumer, err)
	}
	return nil
}

// setPodGate sets the pod's gate for app (nextPodGate), then the group's
// SeatServingAnnotation and the application's consumer (seatConsumerOpen).
func (p *seatPodRun) setPodGate(app string, open bool) {
	st, ok := p.sidecars[app].reading()
	pod, err := p.sidecars[app].pod()
	gone := err != nil || !RootServes(pod)
	p.gates[app] = nextPodGate(p.gates[app], open, ok && st.State == sidecarapi.Asleep, gone)
	p.r.applyGates(app)
}

// servingFence bounds how long the leader waits, after it took a pod out
// of an application's SeatServingAnnotation, for its own cache of the
// StatefulSet to show it (the dispatchers' caches follow the same watch)
// before it counts the application's requests in flight.
const servingFence = 2 * time.Second

// applyGates writes the SeatServingAnnotation the pods' gates make, when it
// changed, then opens or closes app's consumer. A draining pod stays in the
// annotation, so that the requests dispatchers already hold reach its
// engine, which is still awake; the paused consumer hands out nothing new.
// A pod leaves the annotation once its engine sleeps, and the leader waits
// for its own cache to show that (servingFence) before the consumer
// resumes for the other pods. While the annotation cannot be written, the
// consumer stays closed for every application whose written pods no
// longer all serve it.
func (r *seatGroupRun) applyGates(app string) {
	want := SeatServing{}
	for _, p := range r.pods {
		for a, g := range p.gates {
			if g == GateOpen || g == GateDraining {
				want[p.name] = append(want[p.name], a)
			}
		}
	}
	if want.String() != r.written.String() {
		removed := false
		for pod := range r.written {
			for _, a := range r.written[pod] {
				removed = removed || !want.Serves(pod, a)
			}
		}
		if err := r.writeServing(want); err != nil {
			r.c.log.Warn("seat group: writing where applications are served; retrying", "seatGroup", r.g.Name, "err", err)
		} else {
			r.written = want
			if removed {
				r.awaitServing(want)
			}
		}
	}
	gates := map[string]Gate{}
	for _, p := range r.pods {
		gates[p.name] = p.gates[app]
	}
	consumer := GateClosed
	if seatConsumerOpen(r.written.Pods(app), gates) {
		consumer = GateOpen
	}
	// After a failure the gate is unknown and the next step tries again.
	if err := r.c.setGate(r.ctx, &r.members[app].consumerGate, consumer); err != nil {
		r.c.log.Warn("seat group: setting the gate; retrying", "seatGroup", r.g.Name, "app", app, "gate", consumer, "err", err)
	}
}

// writeServing patches the group StatefulSet's SeatServingAnnotation.
func (r *seatGroupRun) writeServing(s SeatServing) error {
	ann, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{SeatServingAnnotation: s.String()}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	_, err = r.c.deps.Kube.AppsV1().StatefulSets(r.c.deps.Namespace).Patch(ctx, r.g.StatefulSet, types.MergePatchType, ann,
		metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		return fmt.Errorf("annotating StatefulSet %s: %w", r.g.StatefulSet, err)
	}
	return nil
}

// awaitServing waits, at most servingFence, until the leader's cache of the
// group's StatefulSet shows s.
func (r *seatGroupRun) awaitServing(s SeatServing) {
	want := s.String()
	deadline := time.Now().Add(servingFence)
	for time.Now().Before(deadline) && r.ctx.Err() == nil {
		sts, err := r.c.stsLister.StatefulSets(r.c.deps.Namespace).Get(r.g.StatefulSet)
		if err == nil && ParseSeatServing(sts.Annotations[SeatServingAnnotation]).String() == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.c.log.Warn("seat group: the StatefulSet's cache did not show where applications are served in time", "seatGroup", r.g.Name, "within", servingFence)
}
