package lifecycle

import (
	"strings"

	"github.com/nats-io/nats.go"
)

// A root woken from sleep. While its engine sleeps, a root's sidecar fails
// its readiness probe and the kubelet marks the pod unready; after the
// wake, the kubelet would mark it Ready again only at the sidecar's next
// readiness probe (every 2 s), and the requests the wake let through would
// wait for that. So once every sidecar reports Awake and the gate is open,
// the leader publishes the application's name on WokenSubject, and every
// dispatcher (the leader too) runs the root pods' own probes again, as it
// does for a starting pod (earlyready.go): a root serves as soon as they
// pass, until the kubelet agrees.

// WokenSubject is where the lifecycle leader of orchestra says that the
// engines of app woke from sleep.
func WokenSubject(orchestra, app string) string {
	return wokenPrefix(orchestra) + app
}

func wokenPrefix(orchestra string) string {
	return "orchestra." + strings.ReplaceAll(orchestra, ".", "_") + ".lifecycle.woken."
}

// publishWoken tells every dispatcher that app's engines woke from sleep.
func (c *Controller) publishWoken(app string) {
	if err := c.deps.NC.Publish(WokenSubject(c.deps.Orchestra, app), nil); err != nil {
		c.log.Warn("telling the dispatchers that the engines woke; they wait for the kubelet's probes", "app", app, "err", err)
	}
}

// subscribeWoken makes this replica probe the root pods of every
// application the leader says woke, until the returned function is called.
func (c *Controller) subscribeWoken() (func(), error) {
	prefix := wokenPrefix(c.deps.Orchestra)
	sub, err := c.deps.NC.Subscribe(prefix+"*", func(m *nats.Msg) {
		a := c.app(strings.TrimPrefix(m.Subject, prefix))
		if a == nil {
			return
		}
		now := c.now()
		for _, p := range c.appPods(a) {
			if p.Labels[labelComponent] == "root" {
				c.early.wokeUp(p, now)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
