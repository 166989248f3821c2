package lifecycle

// Lease use: the gateways' reports of how they use the engine slots their
// dispatchers lent them (natsqueue.LeaseUse, on core NATS). A gateway
// keeps an unused lease while the application serves; the reports tell the
// leader which held leases a request runs on, so that an idle lease is no
// demand (it holds off no sleep or scale to zero) while a busy one is.

import (
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/model-orchestra/operator/internal/natsqueue"
)

// leaseUseReport is the latest report of one gateway instance for one
// application.
type leaseUseReport struct {
	lease string
	busy  bool
	at    time.Time
}

// leaseUses keeps the latest report per application and gateway instance
// (a gateway holds at most one lease per application).
type leaseUses struct {
	mu sync.Mutex
	// since is when the leader subscribed: reports sent before were lost
	// to it (a leader change), so for LeaseUseStale every held lease
	// counts as busy.
	since    time.Time
	byApp    map[string]map[string]leaseUseReport
	received map[string]uint64 // reports received, by application
}

// directUse is what the reports say of one application at one moment.
type directUse struct {
	// Busy counts the gateway instances whose fresh report (younger than
	// natsqueue.LeaseUseStale) says a request runs on their lease.
	Busy uint64
	// Received counts the reports received so far: a change between two
	// readings is use.
	Received uint64
	// Blind: the leader subscribed less than LeaseUseStale ago; it cannot
	// tell an idle lease from a busy one yet.
	Blind bool
}

// record takes one report, received at now.
func (u *leaseUses) record(app string, r natsqueue.LeaseUse, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.byApp == nil {
		u.byApp, u.received = map[string]map[string]leaseUseReport{}, map[string]uint64{}
	}
	m := u.byApp[app]
	if m == nil {
		m = map[string]leaseUseReport{}
		u.byApp[app] = m
	}
	m[r.Instance] = leaseUseReport{lease: r.Lease, busy: r.Busy, at: now}
	u.received[app]++
}

// of returns app's direct use at now, forgetting stale reports.
func (u *leaseUses) of(app string, now time.Time) directUse {
	u.mu.Lock()
	defer u.mu.Unlock()
	d := directUse{Received: u.received[app], Blind: u.since.IsZero() || natsqueue.LeaseUseFresh(u.since, now)}
	for inst, r := range u.byApp[app] {
		switch {
		case !natsqueue.LeaseUseFresh(r.at, now):
			delete(u.byApp[app], inst)
		case r.busy:
			d.Busy++
		}
	}
	return d
}

// subscribeLeaseUse makes the leader hear the gateways' lease use reports
// until the returned function is called.
func (c *Controller) subscribeLeaseUse() (func(), error) {
	prefix := strings.TrimSuffix(c.names.LeaseUseWildcard(), "*")
	sub, err := c.deps.NC.Subscribe(prefix+"*", func(m *nats.Msg) {
		name := strings.TrimPrefix(m.Subject, prefix)
		a := c.app(name)
		r, err := natsqueue.ParseLeaseUse(m.Data)
		if a == nil || err != nil {
			return
		}
		now := c.now()
		c.leaseUse.record(name, r, now)
		c.m.leaseReports.WithLabelValues(name).Inc()
		a.lastDirect.Store(now.UnixNano())
		a.kickNow()
	})
	if err != nil {
		return nil, err // never subscribed: every held lease stays busy (Blind)
	}
	c.leaseUse.mu.Lock()
	c.leaseUse.since = c.now()
	c.leaseUse.mu.Unlock()
	return func() {
		_ = sub.Unsubscribe()
		c.leaseUse.mu.Lock()
		c.leaseUse.since = time.Time{} // the next leadership starts blind
		c.leaseUse.mu.Unlock()
	}, nil
}

// directSince reports whether a gateway reported a request on a lease of
// the application after t.
func (a *appState) directSince(t time.Time) bool {
	return time.Unix(0, a.lastDirect.Load()).After(t)
}

// leaseReturnWait bounds how long one step of a drain or sleep waits for
// the gateways to give back the leases they hold (they do once the
// application leaves serving); the next step waits again.
const leaseReturnWait = 2 * time.Second
