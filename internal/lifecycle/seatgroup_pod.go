package lifecycle

// One pod of a seat group: its sidecars (podSidecar, the seatgroup.Sidecar of one
// application in the pod, called through sidecars.go), its executor's one
// Dispatcher adapter (podDispatcher: the members' demand and gates), and
// the gates, from which the leader writes the SeatServingAnnotation and
// opens or closes each member's consumer.

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// podSidecar is a member's sidecar in one pod of the group, found by the
// pod's current IP. It keeps its last reading for the status and the
// pod's gate. Only the group's goroutine uses it.
type podSidecar struct {
	p    *seatPodRun
	app  string
	port int32

	last   sidecarapi.Status // the last reading
	lastOK bool
}

// pod returns the sidecar's pod, or an error when it does not serve (gone,
// no address, terminating).
func (s *podSidecar) pod() (*corev1.Pod, error) {
	pod, err := s.p.r.c.podLister.Pods(s.p.r.c.deps.Namespace).Get(s.p.name)
	if err != nil {
		return nil, fmt.Errorf("the group's pod %s: %w", s.p.name, err)
	}
	if pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
		return nil, fmt.Errorf("the group's pod %s has no address", s.p.name)
	}
	return pod, nil
}

// call makes one call on the sidecar (callSidecar), within ctx.
func (s *podSidecar) call(ctx context.Context, call sidecarCall) (sidecarapi.Status, error) {
	pod, err := s.pod()
	if err != nil {
		return sidecarapi.Status{}, err
	}
	return s.p.r.c.callSidecar(ctx, sidecarOf(pod, s.port), call)
}

func (s *podSidecar) reading() (sidecarapi.Status, bool) { return s.last, s.lastOK }

func (s *podSidecar) setReading(st sidecarapi.Status, ok bool) { s.last, s.lastOK = st, ok }

// State implements seatgroup.Sidecar; it keeps the reading for the status.
func (s *podSidecar) State(ctx context.Context) (sidecarapi.Status, error) {
	st, err := s.call(ctx, getState)
	s.setReading(st, err == nil)
	return st, err
}

// Sleep implements seatgroup.Sidecar; once the engine sleeps, its pod's gate
// closes (the consumer may open again for the other pods).
func (s *podSidecar) Sleep(ctx context.Context, level int) error {
	if _, err := s.call(ctx, sleepAt(level)); err != nil {
		return err
	}
	s.asleep()
	return nil
}

// asleep records that the engine sleeps and closes its pod's gate.
func (s *podSidecar) asleep() {
	st, _ := s.reading()
	st.State = sidecarapi.Asleep
	s.setReading(st, true)
	s.p.setPodGate(s.app, false)
}

// ReadMemory implements seatgroup.MemoryReader.
func (s *podSidecar) ReadMemory(ctx context.Context) (seatgroup.MemoryReading, error) {
	st, err := s.State(ctx)
	if err != nil {
		return seatgroup.MemoryReading{}, err
	}
	return seatgroup.ReadingOf(st)
}

// Restart implements seatgroup.Restarter.
func (s *podSidecar) Restart(ctx context.Context) error {
	if _, err := s.call(ctx, restart); err != nil {
		return err
	}
	s.asleep()
	return nil
}

// Wake implements seatgroup.Sidecar; it keeps the sidecar's answer, whose
// lastWake and digest the swap's report to the node agent reads
// (reportSwap). An answer without the digest (the engine did not report
// its weights in time) keeps the one of the last reading: the digest is
// the one recorded at load.
func (s *podSidecar) Wake(ctx context.Context) error {
	st, err := s.call(ctx, wake)
	if err != nil {
		return err
	}
	if prev, _ := s.reading(); st.Digest == "" {
		st.Digest = prev.Digest
	}
	s.setReading(st, true)
	return nil
}

// podDispatcher implements seatgroup.Dispatcher for one pod's executor,
// the leader's one adapter for it: its gates are the pod's (and through
// them the member's consumer, applyGates), its demand the application's
// as this pod sees it (seatPodDemand).
type podDispatcher struct{ p *seatPodRun }

// Demand implements seatgroup.Dispatcher.
func (d *podDispatcher) Demand(app string) seatgroup.Demand {
	r := d.p.r
	return seatPodDemand(r.memberDemand(app), r.servedElsewhere(d.p, app), d.p.maxSwapWait)
}

// memberDemand reads the member's consumer (readConsumer): queued
// (pending), in flight (taken by a dispatcher and not acknowledged, which
// counts requests a dispatcher holds for a free slot) and the age of the
// oldest queued request. A consumer that cannot be read counts one request
// in flight, so that nothing is put to sleep on a guess; so does one whose
// gate may not hold (consumerGate.holdFailed: the last close failed, or a
// dispatcher that provisioned the consumer again reset its pause) until a
// close succeeds.
func (r *seatGroupRun) memberDemand(app string) seatgroup.Demand {
	m := r.members[app]
	now := r.c.now()
	cr := r.c.readConsumer(r.ctx, app)
	if !cr.OK {
		m.demand = seatgroup.Demand{InFlight: 1, LastUse: m.use.lastUse}
		return m.demand
	}
	observeGate(&m.consumerGate, cr)
	dm := seatgroup.Demand{InFlight: int(cr.InFlight), Queued: int(cr.Queued)}
	if m.holdFailed {
		dm.InFlight++
	}
	m.use.update(now, cr)
	dm.LastUse = m.use.lastUse
	if dm.Queued > 0 {
		dm.OldestWait = now.Sub(m.use.pendingSince)
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		if stored, ok := r.oldestQueued(ctx, app, cr.Delivered); ok && stored.Before(now) {
			dm.OldestWait = now.Sub(stored)
		}
		cancel()
	}
	m.demand = dm
	return dm
}

// oldestQueued returns when the member's first request not yet delivered
// was stored.
func (r *seatGroupRun) oldestQueued(ctx context.Context, app string, delivered uint64) (time.Time, bool) {
	c := r.c
	if r.stream == nil {
		s, err := c.js.Stream(ctx, c.names.Stream())
		if err != nil {
			return time.Time{}, false
		}
		r.stream = s
	}
	msg, err := r.stream.GetMsg(ctx, delivered+1, jetstream.WithGetMsgSubject(c.names.Request(app)))
	if err != nil {
		return time.Time{}, false
	}
	return msg.Time, true
}

// Hold implements seatgroup.Dispatcher: the pod stops serving app.
func (d *podDispatcher) Hold(app string) { d.p.setPodGate(app, false) }

// Release implements seatgroup.Dispatcher: the pod serves app.
func (d *podDispatcher) Release(app string) { d.p.setPodGate(app, true) }

// seatPodDemand is an application's demand as one pod's executor sees it:
// its queue counts only while no other pod serves the application
// (servedElsewhere false), or once its oldest request waited maxSwapWait
// (the other pods do not keep up), so that pods do not all swap the same
// application in. What is in flight always counts, wherever it runs: the
// consumer does not tell pods apart, and no engine sleeps on a guess.
func seatPodDemand(dm seatgroup.Demand, servedElsewhere bool, maxSwapWait time.Duration) seatgroup.Demand {
	if servedElsewhere && dm.OldestWait < maxSwapWait {
		dm.Queued, dm.OldestWait = 0, 0
	}
	return dm
}

// servedElsewhere reports whether a pod other than p serves app.
func (r *seatGroupRun) servedElsewhere(p *seatPodRun, app string) bool {
	for _, q := range r.pods {
		if q != p && q.gates[app] == GateOpen {
			return true
		}
	}
	return false
}
