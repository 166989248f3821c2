package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

// The activator: when the configuration has a lifecycle section, the
// dispatcher also runs the lifecycle controller (internal/lifecycle), which
// wakes applications at zero when their requests arrive, takes idle ones to
// zero and scales them with their backlog. The leader keeps an
// application's consumer paused from the scale to zero until a new root
// serves, so requests waiting for a wake stay in the stream and count no
// delivery. Every replica's controller also watches the root pods of those
// applications: the dispatcher takes a root when it serves (its pod turns
// Ready, or, while it starts, it answers its own probes run by the
// lifecycle) and drops it when its pod terminates, before the
// EndpointSlice says so (rootView, endpoints.go).

// runLifecycle starts the lifecycle controller until ctx ends; it is a
// no-op without a lifecycle section.
func (d *Dispatcher) runLifecycle(ctx context.Context) error {
	if d.cfg.Lifecycle == nil || (len(d.cfg.Lifecycle.Apps) == 0 && len(d.cfg.Lifecycle.SeatGroups) == 0) {
		return nil
	}
	if d.kube == nil {
		return errors.New("the lifecycle needs a Kubernetes client")
	}
	ctl, err := lifecycle.New(*d.cfg.Lifecycle, lifecycle.Deps{
		NC:             d.nc,
		Kube:           d.kube,
		Namespace:      d.cfg.Namespace,
		Orchestra:      d.cfg.Orchestra,
		StreamReplicas: d.cfg.Stream.Replicas,
		Log:            d.log,
		Registry:       d.reg,
		RootPods: func(app string, pods []lifecycle.RootPod) {
			if v := d.views[app]; v != nil && len(v.app.Endpoints) == 0 {
				v.setPods(pods)
			}
			d.sayProgress(app, pods)
		},
		SeatPods: func(app string, pods []lifecycle.SeatPod) {
			if v := d.views[app]; v != nil && v.seat {
				v.setSeatPods(pods)
			}
		},
	})
	if err != nil {
		return err
	}
	d.lifecycle = ctl
	go d.repeatProgress(ctx)
	d.wg.Go(func() {
		if err := ctl.Run(ctx); err != nil {
			d.log.Error("lifecycle stopped", "err", err)
		}
	})
	return nil
}

// observeDelivery tells the lifecycle about a request's first delivery, for
// its queue wait by cold (stored while the application was not awake) and
// warm.
func (d *Dispatcher) observeDelivery(app string, stored time.Time) {
	if d.lifecycle != nil {
		d.lifecycle.ObserveQueueWait(app, stored)
	}
}

// firstTokenHook returns what tells the lifecycle about the first answer
// data of a request first delivered now, for the wake's first_token stage;
// nil without a lifecycle.
func (d *Dispatcher) firstTokenHook(a *app, stored time.Time) func() {
	if d.lifecycle == nil {
		return nil
	}
	delivered := time.Now()
	return func() { d.lifecycle.ObserveFirstToken(a.Name, stored, delivered, a.pool.rootsSince()) }
}

// seatMembers names the applications of the lifecycle's seat groups: their
// roots are the group pods that serve them (rootView.seat).
func seatMembers(cfg *lifecycle.Config) map[string]bool {
	out := map[string]bool{}
	if cfg == nil {
		return out
	}
	for _, g := range cfg.SeatGroups {
		for _, m := range g.Members {
			out[m.Name] = true
		}
	}
	return out
}
