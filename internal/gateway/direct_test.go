package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/polltest"
	"github.com/model-orchestra/operator/internal/queue"
)

func TestDecideLane(t *testing.T) {
	now := time.Unix(1000, 0)
	on := laneState{enabled: true, serving: true, now: now}
	with := func(f func(*laneState)) laneState { s := on; f(&s); return s }
	for _, c := range []struct {
		name string
		s    laneState
		want laneAction
	}{
		{"off by the field", laneState{serving: true, held: true, now: now}, laneTakeQueue},
		{"no lease: ask, take the queue", on, laneAskLease},
		{"no lease, already asking", with(func(s *laneState) { s.asking = true }), laneTakeQueue},
		{"no lease, backing off", with(func(s *laneState) { s.retryAfter = now.Add(time.Second) }), laneTakeQueue},
		{"backing off ended", with(func(s *laneState) { s.retryAfter = now }), laneAskLease},
		{"free lease", with(func(s *laneState) { s.held = true }), laneTakeDirect},
		{"lease busy: overflow takes the queue", with(func(s *laneState) { s.held, s.busy = true, true }), laneTakeQueue},
		{"lease expired", with(func(s *laneState) { s.held, s.expired = true, true }), laneDropLease},
		{"lease revoked", with(func(s *laneState) { s.held, s.revoked = true, true }), laneDropLease},
		{"not serving: give the lease back", with(func(s *laneState) { s.held, s.serving = true, false }), laneDropLease},
		{"not serving, no lease: no ask", with(func(s *laneState) { s.serving = false }), laneTakeQueue},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decideLane(c.s); got != c.want {
				t.Errorf("decideLane(%+v) = %v, want %v", c.s, got, c.want)
			}
		})
	}
}

// fakeLeaser grants leases and records their returns.
type fakeLeaser struct {
	mu       sync.Mutex
	asked    int
	returned []bool // failed flags, in order
	refuse   error
	revoke   chan struct{}
}

func (f *fakeLeaser) Lease(_ context.Context, app string) (queue.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if f.refuse != nil {
		return queue.Lease{}, f.refuse
	}
	f.revoke = make(chan struct{})
	var once sync.Once
	return queue.Lease{ID: fmt.Sprint(f.asked), Root: "http://engine", Roots: 1, Expires: time.Now().Add(time.Hour), Revoked: f.revoke,
		Return: func(failed bool) {
			once.Do(func() {
				f.mu.Lock()
				f.returned = append(f.returned, failed)
				f.mu.Unlock()
			})
		}}, nil
}

func (f *fakeLeaser) state() (asked int, returned []bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked, slices.Clone(f.returned)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	polltest.Eventually(t, 5*time.Second, 5*time.Millisecond, func() error {
		if !cond() {
			return fmt.Errorf("no %s yet", what)
		}
		return nil
	})
}

// TestLeaseLifecycle: asked in the background by the first request (which
// takes the queue), used one request at a time, given back unused after
// the idle time, given back as failed when the engine failed on it, and
// dropped when revoked or when the application leaves serving.
func TestLeaseLifecycle(t *testing.T) {
	f := &fakeLeaser{}
	serving := &servingFlag{on: true}
	ls := &lanes{leaser: f, serving: serving, idle: 50 * time.Millisecond, now: time.Now, byApp: map[string]*lane{}}
	m := &ModelConfig{Name: "m", App: "a", DirectLane: true, MaxWait: metav1.Duration{Duration: time.Minute}}
	got := func() (*lane, *queue.Lease) {
		l, lease, ask := ls.take(m)
		if ask != nil {
			ask()
		}
		return l, lease
	}

	if _, l := got(); l != nil {
		t.Fatal("the first request took a lease nobody had granted yet")
	}
	waitFor(t, "the lease", func() bool { ln := ls.get("a"); ln.mu.Lock(); defer ln.mu.Unlock(); return ln.lease != nil })
	ln, l := got()
	if l == nil {
		t.Fatal("a free lease was not used")
	}
	if _, l2 := got(); l2 != nil {
		t.Fatal("a busy lease was used by a second request")
	}
	ls.done(ln, false)
	// Unused for the idle time: given back, not failed.
	waitFor(t, "the idle return", func() bool { _, r := f.state(); return len(r) == 1 })
	if _, r := f.state(); r[0] {
		t.Error("an idle lease was returned as failed")
	}
	// The next request asks again; the engine fails on the new lease.
	got()
	waitFor(t, "a second lease", func() bool { ln := ls.get("a"); ln.mu.Lock(); defer ln.mu.Unlock(); return ln.lease != nil })
	ln, _ = got()
	ls.done(ln, true)
	if _, r := f.state(); len(r) != 2 || !r[1] {
		t.Errorf("returns %v; want the second one failed", r)
	}
	// Backing off after the failure: no ask at once.
	asked, _ := f.state()
	got()
	if a, _ := f.state(); a != asked {
		t.Error("asked again at once after the engine failed on a lease")
	}
	// Revoked: dropped at the next request.
	ls.get("a").mu.Lock()
	ls.get("a").retryAfter = time.Time{}
	ls.get("a").mu.Unlock()
	got()
	waitFor(t, "a third lease", func() bool { ln := ls.get("a"); ln.mu.Lock(); defer ln.mu.Unlock(); return ln.lease != nil })
	f.mu.Lock()
	close(f.revoke)
	f.mu.Unlock()
	if _, l := got(); l != nil {
		t.Error("a revoked lease was used")
	}
	if _, r := f.state(); len(r) != 3 {
		t.Errorf("%d returns; want the revoked lease given back", len(r))
	}
	// Not serving: a held lease is given back, none is asked.
	ls.get("a").mu.Lock()
	ls.get("a").retryAfter = time.Time{}
	ls.get("a").mu.Unlock()
	got()
	waitFor(t, "a fourth lease", func() bool { ln := ls.get("a"); ln.mu.Lock(); defer ln.mu.Unlock(); return ln.lease != nil })
	serving.set(false)
	asked, _ = f.state()
	if _, l := got(); l != nil {
		t.Error("a lease was used while the application does not serve")
	}
	if a, r := f.state(); len(r) != 4 || a != asked {
		t.Errorf("not serving: %d returns, %d asks; want the lease given back and no new ask", len(r), a-asked)
	}
}

type servingFlag struct {
	mu sync.Mutex
	on bool
}

func (s *servingFlag) Serving(string) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.on }
func (s *servingFlag) set(v bool)          { s.mu.Lock(); s.on = v; s.mu.Unlock() }
