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

func TestDecideKeep(t *testing.T) {
	idle := 10 * time.Minute
	on := keepState{serving: true, idle: idle, unused: time.Second}
	with := func(f func(*keepState)) keepState { s := on; f(&s); return s }
	for _, c := range []struct {
		name string
		s    keepState
		want keepAction
	}{
		{"idle, serving, within leaseIdle: kept", on, keepHold},
		{"unused for leaseIdle: given back", with(func(s *keepState) { s.unused = idle }), keepReturn},
		{"application left serving: given back", with(func(s *keepState) { s.serving = false }), keepReturn},
		{"revoked: given back", with(func(s *keepState) { s.revoked = true }), keepReturn},
		{"MaxAge, used within leaseIdle: renewed", with(func(s *keepState) { s.expired = true }), keepRenew},
		{"MaxAge, unused for leaseIdle: given back", with(func(s *keepState) { s.expired, s.unused = true, idle }), keepReturn},
		{"revoked at MaxAge (a busy lease's request ended): renewed", with(func(s *keepState) { s.expired, s.revoked = true, true }), keepRenew},
		{"revoked at MaxAge, not serving: given back", with(func(s *keepState) { s.expired, s.revoked, s.serving = true, true, false }), keepReturn},
		{"busy, reported just now: held", with(func(s *keepState) { s.busy, s.sinceReport = true, 10*time.Millisecond }), keepHold},
		{"busy, a second since the report: heartbeat", with(func(s *keepState) { s.busy, s.sinceReport = true, reportEvery }), keepReport},
		{"busy while the application leaves serving: the request finishes", with(func(s *keepState) { s.busy, s.serving = true, false }), keepHold},
		{"busy at MaxAge: decided when the request ends", with(func(s *keepState) { s.busy, s.expired = true, true }), keepHold},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decideKeep(c.s); got != c.want {
				t.Errorf("decideKeep(%+v) = %v, want %v", c.s, got, c.want)
			}
		})
	}
}

// TestLeaseKeptAcrossGaps: an unused lease is kept across gaps while the
// application serves, its use is reported (start, heartbeat, end), a
// lease at its MaxAge that was used is renewed at once without a request,
// and one left serving is given back only after its running request ends.
func TestLeaseKeptAcrossGaps(t *testing.T) {
	f := &fakeLeaser{maxAge: 600 * time.Millisecond}
	serving := &servingFlag{on: true}
	ls := &lanes{leaser: f, serving: serving, idle: time.Minute, now: time.Now, byApp: map[string]*lane{}}
	defer ls.close()
	m := &ModelConfig{Name: "m", App: "a", DirectLane: true, MaxWait: metav1.Duration{Duration: time.Minute}}
	held := func() string {
		ln := ls.get("a")
		ln.mu.Lock()
		defer ln.mu.Unlock()
		if ln.lease == nil {
			return ""
		}
		return ln.lease.ID
	}
	if _, _, ask := ls.take(m); ask != nil {
		ask()
	}
	waitFor(t, "the lease", func() bool { return held() == "1" })
	ln, lease, _ := ls.take(m)
	if lease == nil {
		t.Fatal("a free lease was not used")
	}
	ls.done(ln, false)
	// In the gap the lease reaches its MaxAge (600 ms): it is given back
	// and renewed at once, without a request.
	waitFor(t, "the renewed lease", func() bool { return held() == "2" })
	if _, r := f.state(); len(r) != 1 || r[0] {
		t.Fatalf("returns %v; want the expired lease given back once, not failed", r)
	}
	// A request that ended before the keeper's next check is reported
	// at its end only.
	if got := f.reported(); !slices.Equal(got, []string{"1 idle"}) {
		t.Errorf("reports %v; want the end of the request", got)
	}
	// A request running on it is reported busy at the keeper's next check,
	// then every second.
	ln, lease, _ = ls.take(m)
	if lease == nil || lease.ID != "2" {
		t.Fatal("the renewed lease was not used")
	}
	waitFor(t, "the busy report", func() bool { return len(f.reported()) == 2 })
	waitFor(t, "a heartbeat", func() bool { return len(f.reported()) >= 3 })
	// The application leaves serving while the request runs: the lease
	// stays until the request ends, then is given back, and not renewed.
	serving.set(false)
	time.Sleep(3 * keepTick)
	if held() != "2" {
		t.Fatal("a lease a request runs on was given back when the application left serving")
	}
	ls.done(ln, false)
	if held() != "" {
		t.Error("the lease was kept after its request ended while the application does not serve")
	}
	if got := f.reported(); got[1] != "2 busy" || got[2] != "2 busy" || got[len(got)-1] != "2 idle" {
		t.Errorf("reports %v; want start, heartbeat and end of the second request", got)
	}
	time.Sleep(f.maxAge)
	if a, _ := f.state(); a != 2 {
		t.Errorf("%d asks; want none after the application left serving", a)
	}
}

// TestIdleLeaseGivenBackWhenNotServing: an unused lease is given back
// within a few checks once the application leaves serving (the sleep
// waits for it), without a request.
func TestIdleLeaseGivenBackWhenNotServing(t *testing.T) {
	f := &fakeLeaser{}
	serving := &servingFlag{on: true}
	ls := &lanes{leaser: f, serving: serving, idle: time.Minute, now: time.Now, byApp: map[string]*lane{}}
	defer ls.close()
	m := &ModelConfig{Name: "m", App: "a", DirectLane: true, MaxWait: metav1.Duration{Duration: time.Minute}}
	if _, _, ask := ls.take(m); ask != nil {
		ask()
	}
	waitFor(t, "the lease", func() bool { ln := ls.get("a"); ln.mu.Lock(); defer ln.mu.Unlock(); return ln.lease != nil })
	serving.set(false)
	waitFor(t, "the lease given back", func() bool { _, r := f.state(); return len(r) == 1 })
}

// fakeLeaser grants leases and records their returns.
type fakeLeaser struct {
	mu       sync.Mutex
	asked    int
	returned []bool // failed flags, in order
	refuse   error
	revoke   chan struct{}
	maxAge   time.Duration // 0: an hour
	reports  []string      // "<lease> busy" or "<lease> idle", in order
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
	maxAge := f.maxAge
	if maxAge == 0 {
		maxAge = time.Hour
	}
	id := fmt.Sprint(f.asked)
	return queue.Lease{ID: id, Root: "http://engine", Roots: 1, Expires: time.Now().Add(maxAge), Revoked: f.revoke,
		Report: func(busy bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.reports = append(f.reports, id+map[bool]string{true: " busy", false: " idle"}[busy])
		},
		Return: func(failed bool) {
			once.Do(func() {
				f.mu.Lock()
				f.returned = append(f.returned, failed)
				f.mu.Unlock()
			})
		}}, nil
}

func (f *fakeLeaser) reported() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reports)
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

// TestABusyLeaseRevokedAtMaxAgeIsRenewed: the dispatcher revokes a lease
// at its MaxAge and keeps the slot while a request runs on it; once the
// request ends, the gateway gives the lease back and asks for a new one at
// once, without a request (as at a MaxAge without the revoke), rather than
// backing off as after a lease revoked for queued requests.
func TestABusyLeaseRevokedAtMaxAgeIsRenewed(t *testing.T) {
	f := &fakeLeaser{maxAge: 300 * time.Millisecond}
	ls := &lanes{leaser: f, serving: &servingFlag{on: true}, idle: time.Minute, now: time.Now, byApp: map[string]*lane{}}
	defer ls.close()
	m := &ModelConfig{Name: "m", App: "a", DirectLane: true, MaxWait: metav1.Duration{Duration: time.Minute}}
	held := func() string {
		ln := ls.get("a")
		ln.mu.Lock()
		defer ln.mu.Unlock()
		if ln.lease == nil {
			return ""
		}
		return ln.lease.ID
	}
	if _, _, ask := ls.take(m); ask != nil {
		ask()
	}
	waitFor(t, "the lease", func() bool { return held() == "1" })
	ln, lease, _ := ls.take(m)
	if lease == nil {
		t.Fatal("a free lease was not used")
	}
	// The request outlives the lease's MaxAge; the dispatcher revokes it.
	time.Sleep(time.Until(lease.Expires))
	f.mu.Lock()
	close(f.revoke)
	f.mu.Unlock()
	time.Sleep(2 * keepTick)
	if held() != "1" {
		t.Fatal("a lease a request runs on was given back before the request ended")
	}
	ls.done(ln, false)
	waitFor(t, "the renewed lease", func() bool { return held() == "2" })
	if _, r := f.state(); len(r) != 1 || r[0] {
		t.Errorf("returns %v; want the revoked lease given back once, not failed", r)
	}
}
