package lifecycle

// Demand: the one reader of a consumer's backlog on the leader, for
// applications (observe) and seat-group members (memberDemand).

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// consumerReading is one read of an application's JetStream consumer.
type consumerReading struct {
	// OK is false when the consumer could not be read; the other fields
	// are then zero.
	OK bool
	// Queued requests are stored and not yet handed to a dispatcher;
	// InFlight ones were handed out and not acknowledged (which counts the
	// requests a dispatcher holds for a free slot), and the engine slots
	// lent to gateways' direct lanes (Leases), which are in flight too: a
	// drain or sleep waits until every lease is given back. Lease requests
	// still queued are not demand: they never wake an application (a
	// gateway asks for leases only while the application serves).
	Queued, InFlight uint64
	// Leases is the part of InFlight lent to gateways.
	Leases uint64
	// Direct is what the gateways report of their leases' use
	// (leaseuse.go): a held lease is active demand only while a request
	// runs on it.
	Direct directUse
	// Delivered is the stream sequence last handed out.
	Delivered uint64
	// Paused: the gate is closed on the server.
	Paused bool
	// Config is the consumer's configuration (openGate's nudge writes it
	// back).
	Config jetstream.ConsumerConfig
}

// Busy reports whether anything is queued or in flight, every held lease
// included: what a drain or sleep waits for.
func (r consumerReading) Busy() bool { return r.Queued+r.InFlight > 0 }

// ActiveLeases counts the held leases a request runs on: those a fresh
// report says busy, and every held lease while the leader cannot tell yet
// (Direct.Blind). A busy report counts even when its lease is no longer
// held (its dispatcher freed it while the request runs: the root left,
// or the dispatcher stopped).
func (r consumerReading) ActiveLeases() uint64 {
	if r.Direct.Blind {
		return max(r.Leases, r.Direct.Busy)
	}
	return r.Direct.Busy
}

// ActiveLoad is the demand that keeps an application awake and sizes it:
// queued, in flight through the queue, and the leases a request runs on.
// An idle held lease is no load.
func (r consumerReading) ActiveLoad() uint64 {
	return r.Queued + r.InFlight - r.Leases + r.ActiveLeases()
}

// Active reports whether there is active load (ActiveLoad).
func (r consumerReading) Active() bool { return r.ActiveLoad() > 0 }

// readConsumer reads the consumer of app once, within 5 s.
func (c *Controller) readConsumer(ctx context.Context, app string) consumerReading {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := c.js.Consumer(ictx, c.names.Stream(), c.names.Consumer(app))
	if err != nil {
		return consumerReading{}
	}
	ci := cons.CachedInfo()
	r := consumerReading{OK: true, Queued: ci.NumPending, InFlight: uint64(ci.NumAckPending),
		Delivered: ci.Delivered.Stream, Paused: ci.Paused, Config: ci.Config}
	// The lease consumer is missing only while dispatchers of an older
	// release run, which lend nothing.
	if lc, err := c.js.Consumer(ictx, c.names.Stream(), c.names.LeaseConsumer(app)); err == nil {
		r.Leases = uint64(lc.CachedInfo().NumAckPending)
		r.InFlight += r.Leases
	}
	r.Direct = c.leaseUse.of(app, c.now())
	active := r.ActiveLeases()
	c.m.leases.WithLabelValues(app, "busy").Set(float64(min(active, r.Leases)))
	c.m.leases.WithLabelValues(app, "idle").Set(float64(r.Leases - min(active, r.Leases)))
	return r
}

// usage follows one consumer's readings over time: when it was last used
// (a request handed out or in flight, or a gateway's report of a request
// on its lease) and since when requests queue.
type usage struct {
	delivered    uint64
	reports      uint64
	lastUse      time.Time
	pendingSince time.Time
}

// update takes reading r, made at now, and reports whether the consumer
// was used since the last reading. An idle held lease is no use.
func (u *usage) update(now time.Time, r consumerReading) (used bool) {
	used = r.InFlight-r.Leases+r.ActiveLeases() > 0 || r.Delivered != u.delivered || r.Direct.Received != u.reports
	if used {
		u.lastUse = now
	}
	u.delivered, u.reports = r.Delivered, r.Direct.Received
	if r.Queued > 0 {
		if u.pendingSince.IsZero() {
			u.pendingSince = now
		}
	} else {
		u.pendingSince = time.Time{}
	}
	return used
}
