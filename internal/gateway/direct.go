package gateway

// The direct lane: while an application serves and its dispatcher lent
// this gateway an engine slot (a lease, internal/natsqueue/lease.go), a
// chat or legacy completion goes straight to the engine root of the lease:
// one pod, the engine, on the first token's path. Everything else goes
// through the queue: requests beyond the lent slot (overflow), requests
// while the application sleeps, wakes or scales from zero, the Responses,
// embeddings and Batch APIs, and applications whose routing chooses among
// several roots. A lease is asked for in the background when traffic comes
// and none is held (the request that asks takes the queue: nothing waits
// for a lease), and kept while the application serves, across idle gaps,
// up to DirectConfig.LeaseIdle unused. It is given back when the
// application leaves serving (after the request running on it ends), when
// the engine fails on it, when the dispatcher revokes it (after the request
// running on it ends: the dispatcher keeps its slot while the use reports
// say busy), and at its MaxAge (likewise): a lease used within LeaseIdle is
// then asked for again at once, so that the next request finds one.
//
// A held lease holds off no sleep and no scale to zero: the gateway
// reports its use (queue.Lease.Report: within keepTick of a request's
// start, every second while it runs, and at its end) to the lifecycle
// leader, which counts an idle lease as no demand (the sleep or drain then
// waits for the gateway to give the lease back, which it does once the
// application leaves serving), and to the dispatcher, which keeps a busy
// lease's slot lent when it takes the lease back.
//
// Durability differs: a queued request survives restarts of the gateway,
// the dispatcher and NATS; a direct request lives in the gateway only. An
// engine failure before the first byte of the answer (refused connection,
// an overload status) sends the request through the queue instead, so
// nothing is lost; a failure mid-answer ends it with the same error as the
// queue lane (ErrRetriedAfterPartial).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/enginecall"
	"github.com/model-orchestra/operator/internal/queue"
)

// DefaultLeaseIdle is how long an unused lease is kept: long enough that
// a user at concurrency 1 who pauses between requests (a chat's think
// time, a batch script's gaps) still finds the lane open, and short enough
// that a gateway stops renewing the lease of an application nobody uses.
// Keeping one is cheap: it holds off no sleep or scale to zero (the use
// reports), and the dispatcher takes it back as soon as queued requests
// wait for its slot.
const DefaultLeaseIdle = 10 * time.Minute

// HeaderLane names a request's lane: a client may send "queue" to have a
// request queued (durable) although the direct lane is open, and every
// answer says the lane it took ("direct" or "queue").
const HeaderLane = "X-Orchestra-Lane"

// Lanes, the values of the requests metric's lane label and of HeaderLane.
const (
	laneDirect = "direct"
	laneQueue  = "queue"
	// laneNone: refused before taking either (authentication, limits,
	// validation).
	laneNone = "none"
)

// ServingStates tells the direct lane whether an application with a
// lifecycle serves (is awake): internal/lifecyclestate.States implements
// it, with WakeStates.
type ServingStates interface {
	Serving(app string) bool
}

// Back-offs after a lease request that got none.
const (
	leaseRetry   = time.Second
	leaseRefused = 30 * time.Second
)

// keepTick paces the checks of a held lease: the application still
// serves, the heartbeat of a busy one, unused for LeaseIdle.
const keepTick = 100 * time.Millisecond

// reportEvery is the heartbeat of a busy lease's use report (the first
// one goes out at the keeper's next check after the request started).
const reportEvery = time.Second

// laneAction is what a request does about the direct lane.
type laneAction int

const (
	laneTakeQueue laneAction = iota // the queue, nothing more
	laneTakeDirect
	laneAskLease // the queue, and ask for a lease meanwhile
	laneDropLease
)

// laneState is one application's lease as a decision sees it.
type laneState struct {
	enabled, serving   bool
	held, busy, asking bool
	expired, revoked   bool
	now, retryAfter    time.Time
}

// decideLane is the pure choice of a request's lane.
func decideLane(s laneState) laneAction {
	switch {
	case !s.enabled:
		return laneTakeQueue
	case s.held && (s.expired || s.revoked || !s.serving):
		return laneDropLease
	case !s.serving:
		return laneTakeQueue
	case s.held && !s.busy:
		return laneTakeDirect
	case !s.held && !s.asking && !s.now.Before(s.retryAfter):
		return laneAskLease
	}
	return laneTakeQueue
}

// keepAction is what the keeper of a held lease does (decideKeep).
type keepAction int

const (
	keepHold   keepAction = iota // nothing now
	keepReport                   // the heartbeat of a busy lease
	keepReturn                   // give the lease back
	keepRenew                    // give it back and ask for a new one at once
)

// keepState is a held lease as the keeper sees it.
type keepState struct {
	serving, busy, expired, revoked bool
	// unused is the time since the lease was last used (a request ended
	// on it, or the request that asked for it); idle the limit.
	unused, idle time.Duration
	// sinceReport is the time since the last use report.
	sinceReport time.Duration
}

// decideKeep is the pure choice of what to do about a held lease between
// requests: a busy one is only reported (what ends it is decided when its
// request ends); an idle one is kept while the application serves, up to
// the idle limit unused, and renewed at its MaxAge, also when the
// dispatcher revoked it then (it revokes a lease at its MaxAge too);
// revoked before, it is given back.
func decideKeep(s keepState) keepAction {
	switch {
	case s.busy && s.sinceReport >= reportEvery:
		return keepReport
	case s.busy:
		return keepHold
	case !s.serving || s.unused >= s.idle:
		return keepReturn
	case s.expired:
		return keepRenew
	case s.revoked:
		return keepReturn
	}
	return keepHold
}

// lane is one application's lease, held by this gateway.
type lane struct {
	mu         sync.Mutex
	model      *ModelConfig // of the request that last took or asked
	lease      *queue.Lease
	busy       bool
	asking     bool
	keeping    bool // a keeper runs (keep)
	lastUsed   time.Time
	reported   time.Time
	retryAfter time.Time
}

// lanes holds the direct lanes of the gateway's applications.
type lanes struct {
	leaser  queue.Leaser
	serving ServingStates
	idle    time.Duration
	engines http.RoundTripper
	now     func() time.Time

	mu     sync.Mutex
	byApp  map[string]*lane
	closed bool
}

func (ls *lanes) get(app string) *lane {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.byApp[app]
	if l == nil {
		l = &lane{}
		ls.byApp[app] = l
	}
	return l
}

// serves reports whether model's application serves: always without a
// lifecycle, else when its lifecycle state says so.
func (ls *lanes) serves(m *ModelConfig) bool {
	if m.MaxWait.Duration <= 0 {
		return true
	}
	return ls.serving != nil && ls.serving.Serving(m.App)
}

// take returns the lease to send model's request on, marked busy, or nil
// for the queue. When none is held, ask (non-nil) asks for one in the
// background: the caller calls it once its request through the queue is
// done, so that the lease does not take the slot that request needs.
func (ls *lanes) take(m *ModelConfig) (l *lane, lease *queue.Lease, ask func()) {
	if ls == nil {
		return nil, nil, nil
	}
	l = ls.get(m.App)
	serving := ls.serves(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.model = m
	for {
		s := laneState{enabled: m.DirectLane, serving: serving, held: l.lease != nil, busy: l.busy,
			asking: l.asking, now: ls.now(), retryAfter: l.retryAfter}
		if l.lease != nil {
			s.expired, s.revoked = l.ended(s.now)
		}
		switch decideLane(s) {
		case laneTakeDirect:
			l.busy = true
			// The busy report goes out from the keeper, within keepTick:
			// nothing but the request itself on the first token's path.
			l.reported = time.Time{}
			return l, l.lease, nil
		case laneAskLease:
			l.asking = true
			asking, app := l, m.App // l, a named result, is nil once returned
			return nil, nil, func() { go ls.ask(app, asking, false) }
		case laneDropLease:
			if !l.busy {
				// Revoked at its MaxAge, a lease is renewed, not backed off.
				l.giveBack(s.now, false, s.revoked && !s.expired)
				continue
			}
			return nil, nil, nil
		default:
			return nil, nil, nil
		}
	}
}

// ended reports whether l's lease reached its MaxAge or was revoked;
// l.mu held, a lease held.
func (l *lane) ended(now time.Time) (expired, revoked bool) {
	select {
	case <-l.lease.Revoked:
		revoked = true
	default:
	}
	return !now.Before(l.lease.Expires), revoked
}

// report sends the lease's use report; l.mu held, a lease held.
func (l *lane) report(now time.Time, busy bool) {
	l.reported = now
	if l.lease.Report != nil {
		l.lease.Report(busy)
	}
}

// giveBack returns l's lease; l.mu held, a lease held, none running on it.
// A lease revoked before its MaxAge was taken back for queued requests (or
// its root left): asking again at once would take the slot back from them.
func (l *lane) giveBack(now time.Time, failed, revoked bool) {
	l.lease.Return(failed)
	l.lease = nil
	if failed || revoked {
		l.retryAfter = now.Add(leaseRetry)
	}
}

// done ends a request on l's lease; failed gives the lease back as failed
// (the engine failed on it), and a new one is asked for after leaseRetry.
// A lease whose application left serving meanwhile is given back now, one
// that reached its MaxAge is renewed.
func (ls *lanes) done(l *lane, failed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := ls.now()
	l.busy = false
	l.lastUsed = now
	if l.lease == nil {
		return
	}
	l.report(now, false)
	if failed {
		l.giveBack(now, true, false)
		return
	}
	ls.keepLocked(l, now)
}

// keepLocked applies decideKeep to l once; l.mu held. It starts the
// keeper of a lease that stays held.
func (ls *lanes) keepLocked(l *lane, now time.Time) {
	if l.lease == nil {
		return
	}
	s := keepState{busy: l.busy, unused: now.Sub(l.lastUsed), idle: ls.idle, sinceReport: now.Sub(l.reported),
		serving: l.model == nil || ls.serves(l.model)}
	s.expired, s.revoked = l.ended(now)
	// Renewed within the last check before its MaxAge, so that a request
	// does not find it expired in the meantime.
	s.expired = s.expired || !now.Before(l.lease.Expires.Add(-keepTick))
	ls.mu.Lock()
	closed := ls.closed
	ls.mu.Unlock()
	switch decideKeep(s) {
	case keepReport:
		l.report(now, true)
	case keepReturn:
		l.giveBack(now, false, s.revoked)
		return
	case keepRenew:
		l.giveBack(now, false, false)
		if !l.asking && !closed && l.model != nil {
			l.asking = true
			go ls.ask(l.model.App, l, true)
		}
		return
	}
	if !l.keeping && !closed {
		l.keeping = true
		go ls.keep(l)
	}
}

// keep checks l's lease every keepTick while one is held.
func (ls *lanes) keep(l *lane) {
	t := time.NewTicker(keepTick)
	defer t.Stop()
	for range t.C {
		l.mu.Lock()
		ls.mu.Lock()
		closed := ls.closed
		ls.mu.Unlock()
		if l.lease == nil || closed {
			l.keeping = false
			l.mu.Unlock()
			return
		}
		ls.keepLocked(l, ls.now())
		l.mu.Unlock()
	}
}

// ask asks app's dispatchers for a lease. A renewal (renew) keeps the
// time the last lease was used: only requests extend a lane's life.
func (ls *lanes) ask(app string, l *lane, renew bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	lease, err := ls.leaser.Lease(ctx, app)
	cancel()
	ls.mu.Lock()
	closed := ls.closed
	ls.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asking = false
	switch {
	case err != nil:
		l.retryAfter = ls.now().Add(leaseRetry)
		if errors.Is(err, queue.ErrLeaseRefused) {
			l.retryAfter = ls.now().Add(leaseRefused)
		}
		return
	case closed || l.lease != nil:
		lease.Return(false)
		return
	}
	l.lease = &lease
	if !renew {
		l.lastUsed = ls.now()
	}
	ls.keepLocked(l, ls.now())
}

// close gives every lease back (the gateway stops).
func (ls *lanes) close() {
	if ls == nil {
		return
	}
	ls.mu.Lock()
	ls.closed = true
	all := make([]*lane, 0, len(ls.byApp))
	for _, l := range ls.byApp {
		all = append(all, l)
	}
	ls.mu.Unlock()
	for _, l := range all {
		l.mu.Lock()
		if l.lease != nil {
			l.lease.Return(false)
			l.lease = nil
		}
		l.mu.Unlock()
	}
}

// direct sends a request on the direct lane when it can: it returns the
// engine's answer as a reply, or nil when the request takes the queue
// (no lease, or the engine failed before answering: the lease is given
// back as failed). ask, when not nil, is to be called once the request is
// done: it asks for a lease (see take).
func (g *Gateway) direct(ctx context.Context, model *ModelConfig, x *exchange, body []byte) (reply queue.Reply, ask func()) {
	if x.endpoint != endpointChat && x.endpoint != endpointCompletions {
		return nil, nil
	}
	l, lease, ask := g.lanes.take(model)
	if lease == nil {
		return nil, ask
	}
	u, err := url.Parse(lease.Root + x.endpoint.path())
	if err != nil {
		g.lanes.done(l, true)
		return nil, nil
	}
	rctx, cancel := context.WithCancel(ctx)
	res, err := g.lanes.engines.RoundTrip(enginecall.NewRequest(rctx, u, body))
	if err != nil {
		cancel()
		// A client gone is not the engine's fault.
		g.lanes.done(l, ctx.Err() == nil)
		if ctx.Err() == nil {
			g.logger.Warn("direct lane: engine unreachable; the request takes the queue", "app", model.App, "root", lease.Root, "err", err)
		}
		return nil, nil
	}
	if enginecall.Overloaded(res.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		_ = res.Body.Close()
		cancel()
		g.lanes.done(l, true)
		g.logger.Warn("direct lane: engine overloaded; the request takes the queue", "app", model.App, "root", lease.Root, "status", res.StatusCode)
		return nil, nil
	}
	x.lane = laneDirect
	return &directReply{res: res, cancel: cancel, done: func(failed bool) { g.lanes.done(l, failed) }}, nil
}

// directReply is an engine's answer on the direct lane, as a queue.Reply.
type directReply struct {
	res    *http.Response
	cancel context.CancelFunc
	done   func(failed bool)
	buf    []byte
	first  bool // the first chunk went out
	eof    bool
	failed bool
	once   sync.Once
}

func (r *directReply) Next(ctx context.Context) (queue.Chunk, error) {
	if r.eof {
		return queue.Chunk{}, io.EOF
	}
	if r.buf == nil {
		r.buf = make([]byte, 32<<10)
	}
	var c queue.Chunk
	if !r.first {
		r.first = true
		c.Status, c.Header = r.res.StatusCode, r.res.Header
	}
	n, err := r.res.Body.Read(r.buf)
	c.Data = r.buf[:n]
	switch {
	case err == io.EOF:
		r.eof = true
		if n == 0 && c.Status == 0 {
			return queue.Chunk{}, io.EOF
		}
		return c, nil
	case err != nil:
		if ctx.Err() != nil {
			return queue.Chunk{}, ctx.Err()
		}
		r.failed = true
		return queue.Chunk{}, fmt.Errorf("%w: the engine broke off its answer: %w", queue.ErrRetriedAfterPartial, err)
	}
	return c, nil
}

// Close ends the answer; an unfinished one is cancelled at the engine.
func (r *directReply) Close() error {
	r.once.Do(func() {
		r.cancel()
		_ = r.res.Body.Close()
		r.done(r.failed)
	})
	return nil
}
