package lifecycle

// Parking: after parkAfter asleep, an application with minReplicas 0 has
// its pods scaled away (state Zero, status.parked) while the node agents
// keep their copies of its weights; its next request is a wake from zero,
// whose root pods prefer a node holding a copy (the node labels of
// placement.go and the chart's node affinity). Demoting an engine's own
// level-1 offload first is sleep_park.go's.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// EventParked is recorded when an application is parked.
const (
	EventParked        = "Parked"
	EventWokeFromPark  = "WokeFromPark"
	maxParkedCopies    = 16
	placementCopy      = "copy"
	placementElsewhere = "elsewhere"
)

// parkPods scales a sleeping application's pods away after parkAfter
// (minReplicas 0; Decide checked that no engine keeps an offload of its
// own in the hot tier). The gate is already closed and the application
// subscribed: a request seen before the replicas are written wakes the
// engines instead; one seen after wakes it from zero.
func (c *Controller) parkPods(ctx context.Context, a *appState, obs observation) error {
	if a.requestSince(a.sl.asleepAt) {
		return c.beginEngineWake(a, obs, triggerRequest)
	}
	views := c.viewsOf(ctx, a, c.allAgents(a.Sleep))
	if a.requestSince(a.sl.asleepAt) { // the agents' reads took a moment
		return c.beginEngineWake(a, obs, triggerRequest)
	}
	decided := c.now()
	if err := c.setReplicas(ctx, a, 0); err != nil {
		return err
	}
	asleep := decided.Sub(a.sl.asleepAt).Round(time.Second)
	a.zeroAt = decided
	c.m.scalings.WithLabelValues(a.Name, "zero").Inc()
	c.pm.parks.WithLabelValues(a.Name).Inc()
	a.sl = sleepState{overhead: a.sl.overhead, coldBPS: a.sl.coldBPS, bytes: a.sl.bytes,
		verifiedCond: a.sl.verifiedCond, written: a.sl.written, refreshed: decided}
	a.status.Parked = &v1alpha1.ParkedStatus{Since: &metav1.Time{Time: decided}, NodeLabel: a.Sleep.NodeLabel}
	c.setParkedCopies(a, views)
	c.enter(a, v1alpha1.LifecycleZero, decided)
	c.log.Info("parked", "app", a.Name, "asleep", asleep, "copies", copiesText(a.status.Parked.Copies))
	c.event(a, corev1.EventTypeNormal, EventParked, "parked %s after %v asleep: scaled to zero pods, freeing their accelerators; %s; the next request wakes it from zero",
		a.Name, asleep, copiesSentence(a.status.Parked.Copies))
	a.changed()
	a.afterStatus(func(ctx context.Context) { c.writeCheckpointFrom(ctx, a, nil, views, nil) })
	c.kickLabels()
	a.kickNow()
	return nil
}

// refreshParked reads a parked application's copies again: a copy the
// node agent evicted (its budget) or dropped (a failed re-verification)
// moves the resident tier down.
func (c *Controller) refreshParked(ctx context.Context, a *appState) {
	a.sl.refreshed = c.now()
	views := c.viewsOf(ctx, a, c.allAgents(a.Sleep))
	before := fmt.Sprint(a.status.ResidentTier, a.status.Parked.Copies)
	c.setParkedCopies(a, views)
	if fmt.Sprint(a.status.ResidentTier, a.status.Parked.Copies) != before {
		c.log.Info("a parked application's copies changed", "app", a.Name, "copies", copiesText(a.status.Parked.Copies))
		a.changed()
	}
	c.writeCheckpointFrom(ctx, a, nil, views, nil)
}

// setParkedCopies sets the parked status's copies, hottest first, and the
// resident tier: the hottest tier a node agent holds a copy in, else Cold.
func (c *Controller) setParkedCopies(a *appState, views []nodeView) {
	a.status.Parked.Copies = parkedCopies(views)
	a.status.ResidentTier, a.status.ExpectedResumeSeconds = v1alpha1.TierCold, ""
	if cs := a.status.Parked.Copies; len(cs) > 0 {
		a.status.ResidentTier = cs[0].Tier
	}
}

// parkedCopies are the copies the node agents report, the hottest per
// node, hot before warm, then by node name; at most maxParkedCopies.
func parkedCopies(views []nodeView) []v1alpha1.NodeCopy {
	var out []v1alpha1.NodeCopy
	for _, v := range views {
		if v.err != nil {
			continue
		}
		for _, t := range v1alpha1.NodeTiers() {
			if _, ok := v.has(t); ok {
				out = append(out, v1alpha1.NodeCopy{Node: v.node, Tier: t})
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tier != out[j].Tier {
			return out[j].Tier.SlowerThan(out[i].Tier)
		}
		return out[i].Node < out[j].Node
	})
	if len(out) > maxParkedCopies {
		out = out[:maxParkedCopies]
	}
	return out
}

// wokeFromPark remembers, for a wake from zero of a parked application,
// where its copies were, and clears the parked status.
func (c *Controller) wokeFromPark(a *appState, parked *v1alpha1.ParkedStatus) {
	a.status.Parked = nil
	a.parkedWake = nil
	if parked != nil {
		a.parkedWake = parked.Copies
		if a.parkedWake == nil {
			a.parkedWake = []v1alpha1.NodeCopy{}
		}
	}
}

// parkedWakeLanded says, once a woken parked application serves, whether
// its root pods landed on nodes holding a copy (event, log, metric).
func (c *Controller) parkedWakeLanded(a *appState) {
	copies := a.parkedWake
	a.parkedWake = nil
	if copies == nil {
		return
	}
	for _, p := range c.appPods(a) {
		if p.Labels[labelComponent] != "root" || p.DeletionTimestamp != nil || p.Spec.NodeName == "" {
			continue
		}
		tier := v1alpha1.Tier("")
		for _, cp := range copies {
			if cp.Node == p.Spec.NodeName {
				tier = cp.Tier
			}
		}
		if tier != "" {
			c.pm.parkedWakes.WithLabelValues(a.Name, placementCopy).Inc()
			c.log.Info("woken from park onto a node holding a copy", "app", a.Name, "pod", p.Name, "node", p.Spec.NodeName, "tier", tier)
			c.event(a, corev1.EventTypeNormal, EventWokeFromPark, "pod %s of %s was woken from zero on node %s, which holds a %s copy of its weights", p.Name, a.Name, p.Spec.NodeName, tier)
			continue
		}
		c.pm.parkedWakes.WithLabelValues(a.Name, placementElsewhere).Inc()
		c.log.Info("woken from park onto a node without a copy", "app", a.Name, "pod", p.Name, "node", p.Spec.NodeName, "copies", copiesText(copies))
		c.event(a, corev1.EventTypeNormal, EventWokeFromPark, "pod %s of %s was woken from zero on node %s, which holds no copy of its weights (%s)", p.Name, a.Name, p.Spec.NodeName, copiesSentence(copies))
	}
}

// podStartTier names, after a wake from zero of engines that load a copy
// of their model file (ModelCopies), the tier the new roots' engines were
// pointed at, as their sidecars report it (the slowest of them), and its
// bytes: lastWake.fromTier is then true for a wake from zero too.
func (c *Controller) podStartTier(ctx context.Context, a *appState, root *appsv1.StatefulSet) {
	if a.Sleep == nil || !a.Sleep.ModelCopies || a.status.LastWake == nil {
		return
	}
	sidecars, err := c.rootSidecars(a, root)
	if err != nil {
		return
	}
	if tier, bytes, ok := c.sidecarsTier(ctx, sidecars); ok {
		a.status.LastWake.FromTier, a.status.LastWake.Bytes = tier, bytes
		c.log.Info("woken from zero: the engines loaded their model file's copy", "app", a.Name, "tier", tier, "bytes", bytes)
		a.changed()
	}
}

func copiesText(cs []v1alpha1.NodeCopy) string {
	parts := make([]string, len(cs))
	for i, cp := range cs {
		parts[i] = string(cp.Tier) + " on " + cp.Node
	}
	return strings.Join(parts, ", ")
}

func copiesSentence(cs []v1alpha1.NodeCopy) string {
	if len(cs) == 0 {
		return "no node agent holds a copy of its weights (the wake reads the cold tier)"
	}
	return "the node agents keep its weights: " + copiesText(cs)
}
