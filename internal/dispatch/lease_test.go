package dispatch_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
)

// leaseEnv is an application with one engine slot (maxConcurrency 1), a
// dispatcher lending it with the given leaseMaxAge, and a gateway's queue
// client that asks for leases.
func leaseEnv(t *testing.T, maxAge time.Duration) (*env, *prometheus.Registry, *natsqueue.Client) {
	t.Helper()
	e := newEnv(t, dataplanetest.FastSim())
	e.cfg.Apps[0].MaxConcurrency = 1
	e.cfg.LeaseMaxAge = metav1.Duration{Duration: maxAge}
	reg := prometheus.NewRegistry()
	d, err := dispatch.New(e.cfg, e.connect(), testLogger(t), dispatch.WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, 10*time.Second, holds("dispatcher ready", d.Ready))
	return e, reg, e.client(func(c *natsqueue.ClientConfig) { c.StallTimeout = 10 * time.Second })
}

// takeLease asks for a lease until one is granted.
func takeLease(t *testing.T, c *natsqueue.Client) queue.Lease {
	t.Helper()
	var l queue.Lease
	eventually(t, 10*time.Second, func() error {
		var err error
		l, err = c.Lease(context.Background(), app)
		return err
	})
	return l
}

// metricValue is the value of one series of reg (0 when absent): a
// counter or gauge whose labels include every name=value pair given.
func metricValue(reg *prometheus.Registry, name string, labels ...string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return 0
}

// heartbeat reports l busy now and every natsqueue.LeaseUseEvery after, as
// a gateway does while a request runs on it, until the returned function
// is called.
func heartbeat(l queue.Lease) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(natsqueue.LeaseUseEvery)
		defer t.Stop()
		for {
			l.Report(true)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

func revoked(l queue.Lease) func() bool {
	return func() bool {
		select {
		case <-l.Revoked:
			return true
		default:
			return false
		}
	}
}

// TestABusyLeaseKeepsItsSlotWhenTakenBack: a lease that a request runs on
// (the gateway reports it busy) is revoked at its leaseMaxAge, or when a
// queued request waits for its slot, but its slot stays lent until the
// gateway gives it back after that request: the queued request waits
// rather than run beside it on a root whose maxConcurrency is 1.
func TestABusyLeaseKeepsItsSlotWhenTakenBack(t *testing.T) {
	for _, c := range []struct {
		cause  string
		maxAge time.Duration
	}{
		{"max_age", 500 * time.Millisecond},
		{"queued", time.Minute},
	} {
		t.Run(c.cause, func(t *testing.T) {
			e, reg, client := leaseEnv(t, c.maxAge)
			l := takeLease(t, client)
			stop := heartbeat(l)
			defer stop()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c.cause == "max_age" {
				eventually(t, 5*time.Second, holds("the revoke at leaseMaxAge", revoked(l)))
			}
			r, err := client.Submit(ctx, chatJob("job-after-"+c.cause, "wait for the slot", false))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.Close() }()
			eventually(t, 5*time.Second, holds("the revoke", revoked(l)))
			// The busy reports keep the slot lent, past maxAge and with a
			// request queued, for longer than a report stays fresh.
			consistently(t, natsqueue.LeaseUseStale+time.Second, func() error {
				if n := e.engine.Requests.Load(); n != 0 {
					return fmt.Errorf("the queued request reached the engine while the lease was busy (%d requests)", n)
				}
				if n := metricValue(reg, "orchestra_dispatcher_leases", "app", app); n != 1 {
					return fmt.Errorf("%v leases lent, want the busy one", n)
				}
				return nil
			})
			// The request on the lease ends; the gateway gives it back.
			stop()
			l.Report(false)
			l.Return(false)
			if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
				t.Fatalf("the queued request after the return: %d %v", status, err)
			}
			eventually(t, 5*time.Second, holds("the slot freed", func() bool {
				return metricValue(reg, "orchestra_dispatcher_leases", "app", app) == 0
			}))
			if n := metricValue(reg, "orchestra_dispatcher_lease_busy_takebacks_total", "app", app, "cause", c.cause); n != 1 {
				t.Errorf("lease_busy_takebacks_total{cause=%q} = %v, want 1", c.cause, n)
			}
		})
	}
}

// TestALeaseWhoseReportsStopIsFreed: a busy lease past its leaseMaxAge
// whose gateway stops reporting (it died, or lost its connection) and
// never gives it back keeps its slot until its last busy report is stale
// (natsqueue.LeaseUseStale), then frees it for the queued request.
func TestALeaseWhoseReportsStopIsFreed(t *testing.T) {
	e, reg, client := leaseEnv(t, 500*time.Millisecond)
	l := takeLease(t, client)
	l.Report(true)
	lastReport := time.Now()
	eventually(t, 5*time.Second, holds("the revoke at leaseMaxAge", revoked(l)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := client.Submit(ctx, chatJob("job-after-a-silent-lease", "wait", false))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	consistently(t, time.Until(lastReport.Add(natsqueue.LeaseUseStale-300*time.Millisecond)), func() error {
		if n := e.engine.Requests.Load(); n != 0 {
			return fmt.Errorf("the queued request reached the engine while the busy report was fresh (%d requests)", n)
		}
		return nil
	})
	if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
		t.Fatalf("the queued request after the reports stopped: %d %v", status, err)
	}
	if waited := time.Since(lastReport); waited < natsqueue.LeaseUseStale {
		t.Errorf("the slot was freed %v after the last busy report, before it went stale (%v)", waited, natsqueue.LeaseUseStale)
	}
	eventually(t, 5*time.Second, holds("the slot freed", func() bool {
		return metricValue(reg, "orchestra_dispatcher_leases", "app", app) == 0
	}))
	if n := metricValue(reg, "orchestra_dispatcher_lease_busy_takebacks_total", "app", app, "cause", "max_age"); n != 1 {
		t.Errorf("lease_busy_takebacks_total{cause=\"max_age\"} = %v, want 1", n)
	}
}

// TestAnIdleLeaseIsRevokedAndFreedAtMaxAge: a lease no request runs on is
// revoked at its leaseMaxAge (the gateway drops it at once instead of by
// its own clock) and its slot is freed, even when the gateway does not give
// it back (it is gone): a queued request then runs on it.
func TestAnIdleLeaseIsRevokedAndFreedAtMaxAge(t *testing.T) {
	maxAge := 500 * time.Millisecond
	e, reg, client := leaseEnv(t, maxAge)
	l := takeLease(t, client)
	l.Report(false) // a request came and went
	eventually(t, 5*time.Second, holds("the revoke at leaseMaxAge", revoked(l)))
	if early := time.Until(l.Expires); early > 0 {
		t.Errorf("revoked %v before the lease's MaxAge", early)
	}
	eventually(t, 5*time.Second, holds("the slot freed", func() bool {
		return metricValue(reg, "orchestra_dispatcher_leases", "app", app) == 0
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := client.Submit(ctx, chatJob("job-after-an-idle-lease", "go", false))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
		t.Fatalf("the queued request: %d %v", status, err)
	}
	if n := e.engine.Requests.Load(); n != 1 {
		t.Errorf("the engine saw %d requests, want 1", n)
	}
	if n := metricValue(reg, "orchestra_dispatcher_lease_busy_takebacks_total"); n != 0 {
		t.Errorf("lease_busy_takebacks_total = %v for an idle lease, want 0", n)
	}
}
