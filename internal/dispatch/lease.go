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

// leaseCheck paces the checks of a held lease: its root, and queued
// requests waiting for a slot.
const leaseCheck = 50 * time.Millisecond

// leases are the leases this dispatcher has lent, by ID: each waits for
// its return on its channel (true: the engine failed on it).
type leases struct {
	mu   sync.Mutex
	byID map[string]chan bool
}

func (l *leases) add(id string) chan bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]chan bool{}
	}
	ch := make(chan bool, 1)
	l.byID[id] = ch
	return ch
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
	ch, ok := l.byID[id]
	if ok {
		select {
		case ch <- failed:
		default:
		}
	}
	return ok
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

// hold keeps a lent slot until the gateway returns it, it reaches maxAge,
// its root leaves the pool or is ejected, queued requests wait for a slot,
// or the dispatcher stops (the last three revoke it; a request the gateway
// has on the engine then finishes there). Meanwhile the lease request stays
// unacknowledged, reported in progress every AckWait/3.
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
	revoke := func() {
		_ = d.nc.PublishMsg(&nats.Msg{Subject: reply, Header: nats.Header{natsqueue.HeaderKind: []string{natsqueue.KindRevoked}}})
	}
	for {
		select {
		case failed := <-returns:
			if failed {
				d.m.failed.WithLabelValues(a.Name, "direct_lane").Inc()
				a.pool.release(rt, false, true)
			} else {
				a.pool.release(rt, true, false)
			}
			_ = m.Ack()
			return
		case <-end.C:
			a.pool.release(rt, true, false)
			_ = m.Ack()
			return
		case <-ctx.Done():
			revoke()
			a.pool.release(rt, true, false)
			_ = m.Ack()
			return
		case <-check.C:
			// Queued requests come first: a lease is taken back when they
			// wait for a slot (the gateway's requests then queue too).
			if !a.pool.usable(rt) || (a.held.len() > 0 && a.pool.free() == 0) {
				revoke()
				a.pool.release(rt, true, false)
				_ = m.Ack()
				return
			}
		case <-progress.C:
			_ = m.InProgress()
		}
	}
}
