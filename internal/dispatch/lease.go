package dispatch

// Leases: engine slots lent to gateways for their direct lane (protocol in
// internal/natsqueue/lease.go). A lease is a slot of the pool like the one
// a queued request takes, so a root's maxConcurrency holds across both
// lanes, and its request stays unacknowledged on the lease consumer while
// the gateway holds it, so the lifecycle leader counts it as in flight.

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/natsqueue"
)

// grantTimeout bounds the wait for a gateway to take a grant.
const grantTimeout = time.Second

// leaseCheck paces the checks of a held lease: its root, queued requests
// waiting for a slot, and its use reports.
const leaseCheck = 50 * time.Millisecond

// leaseEndGrace is how long a lease taken back (at its maxAge or for
// queued requests) that no fresh use report says busy keeps its slot while
// the dispatcher waits for the gateway to give it back. A gateway reports a
// request within 0.1 s of its start and gives back a revoked idle lease
// within 0.1 s: the grace covers a request that started just before the
// revoke and is not reported yet, and bounds the wait for a gateway that
// is gone.
const leaseEndGrace = 500 * time.Millisecond

// leases are the leases this dispatcher has lent, by ID.
type leases struct {
	mu   sync.Mutex
	byID map[string]*lent
}

// lent is one lease lent: the channel its return arrives on (true: the
// engine failed on it) and the gateway's latest use report.
type lent struct {
	returns chan bool
	// reported is when the latest use report arrived (zero: none yet);
	// busy what it said.
	reported time.Time
	busy     bool
}

func (l *leases) add(id string) chan bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]*lent{}
	}
	ln := &lent{returns: make(chan bool, 1)}
	l.byID[id] = ln
	return ln.returns
}

func (l *leases) remove(id string) {
	l.mu.Lock()
	delete(l.byID, id)
	l.mu.Unlock()
}

// returned hands a return to the lease's holder; false when this
// dispatcher did not lend it (another one did).
func (l *leases) returned(id string, failed bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, ok := l.byID[id]
	if ok {
		select {
		case ln.returns <- failed:
		default:
		}
	}
	return ok
}

// used records a use report of a lease this dispatcher lent, received at
// now; reports of other dispatchers' leases are ignored.
func (l *leases) used(id string, busy bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln, ok := l.byID[id]; ok {
		ln.reported, ln.busy = now, busy
	}
}

// use returns what the reports say of a lease at now: busy while a report
// still fresh (natsqueue.LeaseUseFresh) says a request runs on it, and
// when the latest report arrived (zero: none).
func (l *leases) use(id string, now time.Time) (busy bool, reported time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, ok := l.byID[id]
	if !ok {
		return false, time.Time{}
	}
	return ln.busy && natsqueue.LeaseUseFresh(ln.reported, now), ln.reported
}

// onLeaseUse takes a gateway's use report of a lease (natsqueue.LeaseUse).
func (d *Dispatcher) onLeaseUse(m *nats.Msg) {
	u, err := natsqueue.ParseLeaseUse(m.Data)
	if err != nil {
		return
	}
	d.leases.used(u.Lease, u.Busy, time.Now())
}

// onLeaseReturn takes a gateway's return of a lease.
func (d *Dispatcher) onLeaseReturn(m *nats.Msg) {
	id, failed, err := natsqueue.ParseLeaseReturn(m.Data)
	if err != nil {
		return
	}
	d.leases.returned(id, failed)
}

// lend serves an application's lease requests until ctx ends, one at a
// time: the next is fetched once the last one was granted or refused.
func (d *Dispatcher) lend(ctx context.Context, a *app) {
	for ctx.Err() == nil {
		err := d.lendFrom(ctx, a)
		if ctx.Err() != nil {
			return
		}
		d.log.Debug("pulling lease requests; looking the consumer up again", "app", a.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (d *Dispatcher) lendFrom(ctx context.Context, a *app) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	cons, err := d.js.Consumer(lctx, d.names.Stream(), d.names.LeaseConsumer(a.Name))
	cancel()
	if err != nil {
		return err
	}
	for {
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return err
		}
		for m := range batch.Messages() {
			d.grant(ctx, a, m)
		}
		cancel()
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return err
		}
		if ctx.Err() != nil {
			return nil //nolint:nilerr // ctx ended: a normal stop
		}
	}
}

// grant serves one lease request: it takes a slot before the request's
// deadline, offers it, and when the gateway takes it holds it (hold)
// until it comes back. A request it cannot serve is acknowledged at once.
func (d *Dispatcher) grant(ctx context.Context, a *app, m jetstream.Msg) {
	h := m.Headers()
	reply := h.Get(natsqueue.HeaderReply)
	ms, err := strconv.ParseInt(h.Get(natsqueue.HeaderDeadline), 10, 64)
	deadline := time.UnixMilli(ms)
	outcome := d.m.leaseGrants
	if err != nil || reply == "" || !time.Now().Before(deadline) {
		outcome.WithLabelValues(a.Name, "expired").Inc()
		_ = m.Ack()
		return
	}
	refuse := func(outcomeLabel, refusal, reason string) {
		outcome.WithLabelValues(a.Name, outcomeLabel).Inc()
		_ = d.nc.PublishMsg(&nats.Msg{Subject: reply, Header: nats.Header{
			natsqueue.HeaderKind:    []string{natsqueue.KindRefused},
			natsqueue.HeaderRefusal: []string{refusal},
			natsqueue.HeaderReason:  []string{reason},
		}})
		_ = m.Ack()
	}
	if a.router != nil && len(a.pool.urls()) > 1 {
		// The dispatcher chooses each request's root: no lending.
		refuse("refused", natsqueue.RefusalRouting, "routing policy "+a.Routing.Policy+" chooses among several roots")
		return
	}
	// Only spare capacity is lent: a lease never waits for a slot (nor
	// holds up the lease requests behind it), and queued requests keep
	// the slots they are waiting for.
	rt, ok := a.pool.tryAcquire()
	if !ok {
		refuse("busy", natsqueue.RefusalBusy, "no free engine slot")
		return
	}
	md, _ := m.Metadata()
	id := d.id + "-" + a.Name + "-" + strconv.FormatUint(seqOf(md), 10)
	maxAge := d.cfg.LeaseMaxAge.Duration
	if maxAge <= 0 {
		maxAge = time.Minute
	}
	body, _ := json.Marshal(natsqueue.LeaseGrant{ID: id, Root: rt.url, Roots: len(a.pool.urls()), MaxAgeMillis: maxAge.Milliseconds()})
	returns := d.leases.add(id)
	res, err := d.nc.RequestMsg(&nats.Msg{Subject: reply, Data: body,
		Header: nats.Header{natsqueue.HeaderKind: []string{natsqueue.KindGrant}}}, grantTimeout)
	if err != nil || string(res.Data) != natsqueue.LeaseTaken {
		d.leases.remove(id)
		a.pool.release(rt, true, false)
		outcome.WithLabelValues(a.Name, "unwanted").Inc()
		_ = m.Ack()
		return
	}
	outcome.WithLabelValues(a.Name, "granted").Inc()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.hold(ctx, a, m, rt, id, reply, maxAge, returns)
	}()
}

func seqOf(md *jetstream.MsgMetadata) uint64 {
	if md == nil {
		return 0
	}
	return md.Sequence.Stream
}

// heldState is a lent slot as hold sees it at one check.
type heldState struct {
	// returned: the gateway gave the lease back.
	returned bool
	// stopping: the dispatcher stops; rootGone: the lease's root left
	// the pool or is ejected. The slot is then freed at once, even under a
	// running request (its root is gone, or the process ends).
	stopping, rootGone bool
	// maxAge: the lease reached leaseMaxAge; queueWaits: queued requests
	// wait and no slot is free. Either takes the lease back.
	maxAge, queueWaits bool
	// revoked: the lease is being taken back (the gateway was told).
	revoked bool
	// busy: a fresh use report says a request runs on the lease.
	busy bool
	// quiet is the time since the later of the revoke and the latest use
	// report.
	quiet time.Duration
}

// heldAction is what hold does about a lent slot (decideHeld).
type heldAction int

const (
	heldKeep          heldAction = iota // nothing now
	heldRevoke                          // tell the gateway; keep the slot until it is given back
	heldRelease                         // free the slot (the gateway knows)
	heldRevokeRelease                   // tell the gateway and free the slot
)

// decideHeld is the pure choice of what to do about a lent slot. A lease
// is taken back at its maxAge and when queued requests wait for a slot
// (queued requests come first); either way the slot stays the lease's
// while its use reports say a request runs on it, because that request
// runs on the engine until it ends: freeing the slot would let the root
// serve maxConcurrency+1. The slot is freed when the gateway gives the
// lease back (after its request), or once no fresh report says busy for
// leaseEndGrace (the request ended and the return was lost, or the gateway
// is gone: its reports stop, and a busy one goes stale after
// natsqueue.LeaseUseStale).
func decideHeld(s heldState) heldAction {
	switch {
	case s.returned:
		return heldRelease
	case s.stopping || s.rootGone:
		if s.revoked {
			return heldRelease
		}
		return heldRevokeRelease
	case !s.revoked && (s.maxAge || s.queueWaits):
		return heldRevoke
	case s.revoked && !s.busy && s.quiet >= leaseEndGrace:
		return heldRelease
	}
	return heldKeep
}

// hold keeps a lent slot until decideHeld frees it, and meanwhile the
// lease request unacknowledged, reported in progress every AckWait/3.
func (d *Dispatcher) hold(ctx context.Context, a *app, m jetstream.Msg, rt lease, id, reply string, maxAge time.Duration, returns chan bool) {
	defer d.leases.remove(id)
	gauge := d.m.leases.WithLabelValues(a.Name)
	gauge.Inc()
	defer gauge.Dec()
	end := time.NewTimer(maxAge)
	defer end.Stop()
	progress := time.NewTicker(max(d.cfg.AckWait.Duration/3, 10*time.Millisecond))
	defer progress.Stop()
	check := time.NewTicker(leaseCheck)
	defer check.Stop()
	var (
		s         heldState
		failed    bool
		revokedAt time.Time
		// cause is why the lease is taken back (a label of
		// lease_busy_takebacks_total), counted once when found busy.
		cause   string
		counted bool
	)
	for {
		select {
		case failed = <-returns:
			s.returned = true
		case <-ctx.Done():
			s.stopping = true
		case <-end.C:
			s.maxAge = true
		case <-check.C:
		case <-progress.C:
			_ = m.InProgress()
			continue
		}
		now := time.Now()
		// Queued requests come first: a lease is taken back when they
		// wait for a slot (the gateway's requests then queue too).
		s.rootGone = !a.pool.usable(rt)
		s.queueWaits = a.held.len() > 0 && a.pool.free() == 0
		var reported time.Time
		s.busy, reported = d.leases.use(id, now)
		s.quiet = now.Sub(later(revokedAt, reported))
		act := decideHeld(s)
		if act == heldRevoke || act == heldRevokeRelease {
			_ = d.nc.PublishMsg(&nats.Msg{Subject: reply, Header: nats.Header{natsqueue.HeaderKind: []string{natsqueue.KindRevoked}}})
		}
		switch act {
		case heldRevoke:
			s.revoked, revokedAt = true, now
			cause = "queued"
			if s.maxAge {
				cause = "max_age"
			}
		case heldRelease, heldRevokeRelease:
			if failed {
				d.m.failed.WithLabelValues(a.Name, "direct_lane").Inc()
				a.pool.release(rt, false, true)
			} else {
				a.pool.release(rt, true, false)
			}
			_ = m.Ack()
			return
		}
		if s.revoked && s.busy && !counted {
			counted = true
			d.m.leaseBusyTakebacks.WithLabelValues(a.Name, cause).Inc()
		}
	}
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
