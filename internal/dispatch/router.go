package dispatch

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
)

// router chooses an application's root per request (Routing), and for
// RoutePrefix keeps, per root, the prompt blocks recently sent there: by
// this dispatcher, and by the others when sharing is on.
type router struct {
	cfg Routing
	m   routeMetrics
	// publish shares a prefix decision with the other dispatchers; nil
	// when sharing is off.
	publish func(root string, hashes []uint64)

	mu    sync.Mutex
	index map[string]*rootIndex // by root URL
	ring  *ring
	// meanPrefill is the moving mean of the blocks routed requests had to
	// prefill (decidePrefix's load cost); decisions counts them.
	meanPrefill float64
	decisions   int
}

func newRouter(cfg Routing, m routeMetrics) *router {
	return &router{cfg: cfg, m: m, index: map[string]*rootIndex{}}
}

// routeReq is what a decision needs of one request, computed once.
type routeReq struct {
	hashes []uint64 // the prompt's block hashes (prefix)
	bytes  int      // the rendered prompt's length
	key    uint64   // consistent hashing's key
	hasKey bool
	// tie breaks ties between equally good roots, the same way in every
	// dispatcher.
	tie uint64
}

// prepare reads a request's prompt.
func (r *router) prepare(body []byte) routeReq {
	if r.cfg.Policy == RouteRandom {
		return routeReq{}
	}
	p := parsePrompt(body, r.cfg.PrefixChars)
	q := routeReq{bytes: len(p.text), tie: xxh3.HashString(p.text)}
	if p.key != "" {
		q.key, q.hasKey = xxh3.HashString(p.key), true
	}
	if r.cfg.Policy == RoutePrefix {
		q.hashes = blockHashes(p.text, r.cfg.BlockBytes)
		if len(q.hashes) > 0 {
			// Requests that share their first block (a system prompt)
			// break ties alike, so that they gather where it is cached.
			q.tie = q.hashes[0]
		}
	}
	return q
}

// decide picks the root for q among cands (the pool's live roots). It
// runs with the pool's lock held.
func (r *router) decide(q routeReq, cands []candidate) decision {
	switch r.cfg.Policy {
	case RouteRandom:
		var free []string
		for _, c := range cands {
			if c.free {
				free = append(free, c.root)
			}
		}
		if len(free) == 0 {
			return decision{}
		}
		return decision{root: free[rand.IntN(len(free))], outcome: outcomeMiss}
	case RouteConsistentHash:
		if !q.hasKey {
			if c := leastLoaded(cands, q.tie); c != nil {
				return decision{root: c.root, outcome: outcomeMiss}
			}
			return decision{}
		}
		roots := make([]string, len(cands))
		for i, c := range cands {
			roots[i] = c.root
		}
		r.mu.Lock()
		if r.ring == nil || !slices.Equal(r.ring.roots, roots) {
			r.ring = newRing(roots)
		}
		order := r.ring.order(q.key)
		r.mu.Unlock()
		return decideConsistent(cands, order, r.cfg.LoadFactor, q.tie)
	}
	r.mu.Lock()
	for i := range cands {
		if x := r.index[cands[i].root]; x != nil {
			cands[i].match = x.match(q.hashes)
		}
	}
	loadCost := learntLoadCost(r.meanPrefill)
	if r.cfg.LoadCost > 0 {
		loadCost = r.cfg.LoadCost
	}
	r.mu.Unlock()
	return decidePrefix(cands, len(q.hashes), r.cfg.LoadFactor, loadCost, q.tie)
}

// record notes a decision: its metrics, and for RoutePrefix that the
// prompt's blocks went to root (shared with the other dispatchers).
func (r *router) record(q routeReq, d decision) {
	r.m.outcome(d.outcome).Inc()
	r.m.promptBytes.Add(float64(q.bytes))
	if r.cfg.Policy != RoutePrefix {
		return
	}
	r.m.cachedBytes.Add(float64(min(d.match*r.cfg.BlockBytes, q.bytes)))
	r.mu.Lock()
	r.meanPrefill = nextMeanPrefill(r.meanPrefill, r.decisions, len(q.hashes)-d.match)
	r.decisions++
	r.mu.Unlock()
	r.remember(d.root, q.hashes)
	if r.publish != nil && len(q.hashes) > 0 {
		r.publish(d.root, q.hashes)
	}
}

// remember records that hashes were sent to root.
func (r *router) remember(root string, hashes []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.index[root]
	if x == nil {
		x = newRootIndex(r.cfg.IndexBlocks)
		r.index[root] = x
	}
	x.record(hashes)
}

// forget drops what was sent to root: it left, or was ejected (its engine
// most likely restarted, with an empty cache).
func (r *router) forget(root string) {
	r.mu.Lock()
	delete(r.index, root)
	r.mu.Unlock()
}

// routeMetrics are one application's routing series.
type routeMetrics struct {
	hit, miss, overflow      prometheus.Counter
	promptBytes, cachedBytes prometheus.Counter
	peerUpdates              prometheus.Counter
}

func (m routeMetrics) outcome(o string) prometheus.Counter {
	switch o {
	case outcomeHit:
		return m.hit
	case outcomeOverflow:
		return m.overflow
	}
	return m.miss
}

// routeMetricVecs are the routing series of all applications.
type routeMetricVecs struct {
	routed, promptBytes, cachedBytes, peerUpdates *prometheus.CounterVec
}

func newRouteMetrics(reg prometheus.Registerer) routeMetricVecs {
	const ns = "orchestra_dispatcher"
	m := routeMetricVecs{
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "routed_total",
			Help: "Routing decisions of prefix and consistentHash applications, by outcome: hit (to the root with the request's longest recently sent prefix, or its consistent-hashing root), miss (no root had any of it: least loaded), overflow (another root: prefix, one of less cost, as the queue at that root cost more than its prefix saved, or it was over the load bound or full; consistentHash, that root was over the load bound or full)."}, []string{"app", "outcome"}),
		promptBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "routed_prompt_bytes_total",
			Help: "Bytes of rendered prompt routed."}, []string{"app"}),
		cachedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "routed_cached_bytes_total",
			Help: "Bytes of rendered prompt sent to a root that was recently sent the same prefix (prefix routing): the expected prefix-cache hits."}, []string{"app"}),
		peerUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "route_peer_updates_total",
			Help: "Prefix decisions of other dispatchers applied to this one's index."}, []string{"app"}),
	}
	reg.MustRegister(m.routed, m.promptBytes, m.cachedBytes, m.peerUpdates)
	return m
}

func (v routeMetricVecs) forApp(app string) routeMetrics {
	return routeMetrics{
		hit: v.routed.WithLabelValues(app, outcomeHit), miss: v.routed.WithLabelValues(app, outcomeMiss),
		overflow: v.routed.WithLabelValues(app, outcomeOverflow), promptBytes: v.promptBytes.WithLabelValues(app),
		cachedBytes: v.cachedBytes.WithLabelValues(app), peerUpdates: v.peerUpdates.WithLabelValues(app),
	}
}

// acquireRouted reserves a slot on the root decide picks among the live,
// non-ejected roots (sorted by URL), waiting while it picks none.
func (p *pool) acquireRouted(ctx context.Context, decide func([]candidate) decision) (lease, decision, error) {
	for {
		p.mu.Lock()
		now := p.now()
		var wake time.Time
		cands := make([]candidate, 0, len(p.roots))
		for _, r := range p.roots {
			if r.removed {
				continue
			}
			if now.Before(r.ejectedUntil) {
				if wake.IsZero() || r.ejectedUntil.Before(wake) {
					wake = r.ejectedUntil
				}
				continue
			}
			cands = append(cands, candidate{root: r.url, load: r.inflight, free: r.inflight < p.max})
		}
		slices.SortFunc(cands, func(a, b candidate) int { return strings.Compare(a.root, b.root) })
		if d := decide(cands); d.root != "" {
			r := p.roots[d.root]
			r.inflight++
			l := lease{root: r, gen: r.gen}
			p.mu.Unlock()
			return l, d, nil
		}
		changed := p.changed
		p.mu.Unlock()
		var after time.Duration
		if !wake.IsZero() {
			after = wake.Sub(now)
		}
		if err := waitChange(ctx, changed, after); err != nil {
			return lease{}, decision{}, err
		}
	}
}

// peek returns the oldest held message without taking it, waiting for one
// until ctx ends.
func (h *held) peek(ctx context.Context) (jetstream.Msg, error) {
	var m jetstream.Msg
	err := h.await(ctx, func() bool {
		if len(h.msgs) == 0 {
			return false
		}
		m = h.msgs[0]
		return true
	})
	return m, err
}

// take removes m from the held messages; false when it is no longer held
// (drained on shutdown).
func (h *held) take(m jetstream.Msg) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := slices.Index(h.msgs, m)
	if i < 0 {
		return false
	}
	h.msgs = slices.Delete(h.msgs, i, i+1)
	h.notifyLocked()
	return true
}

// nextRouted is next for an application with a routing policy: it takes
// the oldest held request, lets the router pick its root among those with
// a free slot (the request stays held, kept alive, until one is free), and
// records the decision.
func (d *Dispatcher) nextRouted(ctx context.Context, a *app) (lease, jetstream.Msg, error) {
	for {
		msg, err := a.held.peek(ctx)
		if err != nil {
			return lease{}, nil, err
		}
		q := a.router.prepare(msg.Data())
		var seen []candidate
		rt, dec, err := a.pool.acquireRouted(ctx, func(c []candidate) decision {
			dec := a.router.decide(q, c)
			if a.router.cfg.Observe != nil && dec.root != "" {
				seen = slices.Clone(c)
			}
			return dec
		})
		if err != nil {
			return lease{}, nil, err
		}
		if !a.held.take(msg) {
			a.pool.release(rt, true, false)
			continue
		}
		a.router.record(q, dec)
		if obs := a.router.cfg.Observe; obs != nil {
			ev := RouteEvent{Dispatcher: d.id, Body: msg.Data(), Root: dec.root, Outcome: dec.outcome, Match: dec.match, Best: dec.best, Bound: dec.bound}
			for _, c := range seen {
				ev.Roots = append(ev.Roots, RouteCandidate{Root: c.root, Load: c.load, Free: c.free, Match: c.match})
			}
			obs(ev)
		}
		return rt, msg, nil
	}
}

// Sharing prefix decisions between dispatchers: core NATS messages on
// natsqueue.Names.Route(app), header headerDispatcher naming the sender,
// body the root URL's length (uvarint), the URL, then the block hashes
// (8 bytes each, little endian). A lost message costs hits, nothing else.
const headerDispatcher = "Orch-Dispatcher"

// encodeRoute builds a shared decision's body.
func encodeRoute(root string, hashes []uint64) []byte {
	b := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(root)+8*len(hashes)), uint64(len(root)))
	b = append(b, root...)
	for _, h := range hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// decodeRoute reads a shared decision's body.
func decodeRoute(b []byte) (string, []uint64, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n || (uint64(len(b)-k)-n)%8 != 0 {
		return "", nil, errors.New("malformed routing update")
	}
	root := string(b[k : k+int(n)])
	rest := b[k+int(n):]
	hashes := make([]uint64, len(rest)/8)
	for i := range hashes {
		hashes[i] = binary.LittleEndian.Uint64(rest[8*i:])
	}
	return root, hashes, nil
}

// shareRoutes publishes this dispatcher's prefix decisions and applies
// the other dispatchers'; the returned function unsubscribes.
func (d *Dispatcher) shareRoutes() (func(), error) {
	var subs []*nats.Subscription
	stop := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, a := range d.apps {
		if a.router == nil || a.router.cfg.Policy != RoutePrefix || !*a.router.cfg.Share {
			continue
		}
		subject := d.names.Route(a.Name)
		rt := a.router
		rt.publish = func(root string, hashes []uint64) {
			m := &nats.Msg{Subject: subject, Header: nats.Header{headerDispatcher: []string{d.id}}, Data: encodeRoute(root, hashes)}
			_ = d.nc.PublishMsg(m)
		}
		s, err := d.nc.Subscribe(subject, func(m *nats.Msg) {
			if m.Header.Get(headerDispatcher) == d.id {
				return
			}
			root, hashes, err := decodeRoute(m.Data)
			if err != nil {
				return
			}
			rt.remember(root, hashes)
			rt.m.peerUpdates.Inc()
		})
		if err != nil {
			stop()
			return nil, err
		}
		subs = append(subs, s)
	}
	return stop, nil
}
