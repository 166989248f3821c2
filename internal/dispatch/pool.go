package dispatch

import (
	"context"
	"net/url"
	"sort"
	"sync"
	"time"
)

// pool holds an application's engine roots: their concurrency slots and
// their health. A root that fails FailureThreshold times in a row is
// ejected for a back-off that doubles with every further failure; once the
// back-off passes it gets traffic again, and one success heals it. The
// requests that fail together (an engine crash fails everything in flight
// on it at once) count as one failure: a failure counts only for a request
// that started after the last counted failure. While a root is ejected it is
// probed, and it is back in rotation as soon as a probe passes.
type pool struct {
	max    int
	health Health
	now    func() time.Time
	report func(url string, healthy bool)
	// probe reports whether an ejected root is healthy again; nil: no
	// probing, the back-off alone decides.
	probe func(url string) bool

	mu      sync.Mutex
	roots   map[string]*root
	changed chan struct{} // closed and replaced on every change
	// since is when the pool last went from no roots to some.
	since time.Time
}

type root struct {
	url          string
	paths        sync.Map // engine path -> *url.URL of url+path, parsed once
	inflight     int
	failures     int
	ejectedUntil time.Time
	removed      bool
	// gen counts the failures counted so far; see lease.
	gen     uint64
	probing bool
}

// lease is a slot on a root, taken by acquire and given back by release.
type lease struct {
	*root
	// gen is the root's failure generation when the request started: the
	// failure of a request that started before the last counted failure is
	// part of the same burst and is not counted again.
	gen uint64
}

func newPool(maxConcurrency int, h Health, report func(string, bool)) *pool {
	return &pool{max: maxConcurrency, health: h, now: time.Now, report: report,
		roots: map[string]*root{}, changed: make(chan struct{})}
}

func (p *pool) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// set replaces the list of roots. Roots that left keep their in-flight
// requests but get no new ones.
func (p *pool) set(urls []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(urls) > 0 && p.liveLocked() == 0 {
		p.since = p.now()
	}
	keep := map[string]bool{}
	for _, u := range urls {
		keep[u] = true
		if r, ok := p.roots[u]; ok {
			r.removed = false
			continue
		}
		p.roots[u] = &root{url: u}
		p.report(u, true)
	}
	for u, r := range p.roots {
		if !keep[u] {
			r.removed = true
			if r.inflight == 0 {
				delete(p.roots, u)
			}
			p.report(u, false)
		}
	}
	p.notify()
}

// liveLocked counts the roots that take requests or will again; p.mu must
// be held.
func (p *pool) liveLocked() int {
	n := 0
	for _, r := range p.roots {
		if !r.removed {
			n++
		}
	}
	return n
}

// rootsSince returns when the pool last went from no roots to some.
func (p *pool) rootsSince() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.since
}

// urls lists the current roots, sorted.
func (p *pool) urls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for u, r := range p.roots {
		if !r.removed {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out
}

// acquire reserves a slot on the healthy root with the fewest requests in
// flight, waiting until one is free.
func (p *pool) acquire(ctx context.Context) (lease, error) {
	for {
		p.mu.Lock()
		now := p.now()
		var best *root
		var wake time.Time
		for _, r := range p.roots {
			if r.removed || r.inflight >= p.max {
				continue
			}
			if now.Before(r.ejectedUntil) {
				if wake.IsZero() || r.ejectedUntil.Before(wake) {
					wake = r.ejectedUntil
				}
				continue
			}
			if best == nil || r.inflight < best.inflight || (r.inflight == best.inflight && r.url < best.url) {
				best = r
			}
		}
		if best != nil {
			best.inflight++
			l := lease{root: best, gen: best.gen}
			p.mu.Unlock()
			return l, nil
		}
		changed := p.changed
		p.mu.Unlock()
		var after time.Duration
		if !wake.IsZero() {
			after = wake.Sub(now)
		}
		if err := waitChange(ctx, changed, after); err != nil {
			return lease{}, err
		}
	}
}

// tryAcquire reserves a slot as acquire does, without waiting: ok is
// false when no healthy root has a free slot now.
func (p *pool) tryAcquire() (l lease, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var best *root
	for _, r := range p.roots {
		if r.removed || r.inflight >= p.max || now.Before(r.ejectedUntil) {
			continue
		}
		if best == nil || r.inflight < best.inflight || (r.inflight == best.inflight && r.url < best.url) {
			best = r
		}
	}
	if best == nil {
		return lease{}, false
	}
	best.inflight++
	return lease{root: best, gen: best.gen}, true
}

// usable reports whether l's root still takes new requests: it has not
// left the pool and is not ejected.
func (p *pool) usable(l lease) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !l.removed && !p.now().Before(l.ejectedUntil)
}

// free counts the slots free on roots that take requests.
func (p *pool) free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	now, n := p.now(), 0
	for _, r := range p.roots {
		if !r.removed && !now.Before(r.ejectedUntil) && r.inflight < p.max {
			n += p.max - r.inflight
		}
	}
	return n
}

// target returns the URL of path on the root, parsed once per path.
func (r *root) target(path string) (*url.URL, error) {
	if u, ok := r.paths.Load(path); ok {
		return u.(*url.URL), nil
	}
	u, err := url.Parse(r.url + path)
	if err != nil {
		return nil, err
	}
	r.paths.Store(path, u)
	return u, nil
}

// release returns l's slot and records the outcome: ok false counts as a
// failure of the root, unless an earlier failure of the same burst already
// counted; neutral outcomes (client cancels) pass ok true with counted false.
func (p *pool) release(l lease, ok, counted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := l.root
	r.inflight--
	if counted {
		switch {
		case ok:
			if r.failures >= p.health.FailureThreshold {
				p.report(r.url, true)
			}
			r.failures = 0
			r.ejectedUntil = time.Time{}
		case l.gen == r.gen:
			r.gen++
			r.failures++
			if over := r.failures - p.health.FailureThreshold; over >= 0 {
				backoff := p.health.EjectBase.Duration << min(over, 16)
				if backoff > p.health.EjectMax.Duration || backoff <= 0 {
					backoff = p.health.EjectMax.Duration
				}
				r.ejectedUntil = p.now().Add(backoff)
				p.report(r.url, false)
				if p.probe != nil && !r.probing {
					r.probing = true
					go p.probeUntilHealthy(r)
				}
			}
		}
	}
	if r.removed && r.inflight == 0 {
		delete(p.roots, r.url)
	}
	p.notify()
}

// probeUntilHealthy probes an ejected root every health.probeInterval and
// puts it back in rotation as soon as a probe passes. It stops when the
// root is healed, removed, or its ejection ends (it then gets traffic).
func (p *pool) probeUntilHealthy(r *root) {
	t := time.NewTicker(p.health.ProbeInterval.Duration)
	defer t.Stop()
	defer func() {
		p.mu.Lock()
		r.probing = false
		p.mu.Unlock()
	}()
	for range t.C {
		p.mu.Lock()
		ejected := !r.removed && p.now().Before(r.ejectedUntil)
		p.mu.Unlock()
		if !ejected || !p.probe(r.url) {
			if !ejected {
				return
			}
			continue
		}
		p.mu.Lock()
		if r.failures >= p.health.FailureThreshold {
			p.report(r.url, true)
		}
		r.failures = 0
		r.ejectedUntil = time.Time{}
		r.gen++
		p.notify()
		p.mu.Unlock()
		return
	}
}
