package lifecycle

// Parking: after parkAfter asleep, the node agents copy the hot offload to
// the warm tier, verified, and the engines go to level 2.

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// demote moves sleeping engines' weights out of the hot tier: the node
// agent on each root's node copies the engine's level-1 offload from its
// hot tier into its warm tier, verified against the digest the engine
// recorded (POST /demote; from the cold tier with POST /promote when that
// fails and coldPath is set), then each engine is woken (from the hot tier,
// the gate closed) and put back to sleep at level 2, which releases the
// hot copy; the next wake reads the warm copy. A request seen meanwhile
// ends the demotion as a wake.
func (c *Controller) demote(ctx context.Context, a *appState, root *appsv1.StatefulSet, sidecars []sidecarRef) error {
	if a.Sleep.ModelCopies && !a.Sleep.keepsRAM() {
		return c.demoteCopies(ctx, a, sidecars)
	}
	start := c.now()
	if a.Sleep.keepsRAM() {
		// vLLM with model copies: the engine frees its own RAM copy by
		// the level-2 sleep below; its copy moves to warm as for the
		// engines that unload, unless the application is parked to zero
		// next, whose wake from zero reads the hot copy.
		if a.MinReplicas > 0 {
			c.demoteCopyToWarm(ctx, a, sidecars)
		}
	} else if agents := c.agentsOf(a.Sleep, sidecars); len(agents) > 0 && a.Sleep.usesWarm() {
		// With tiers.warm None the engines mount no warm tier: a warm
		// copy would only fill the node's disk, so none is asked for.
		digest := ""
		for _, r := range c.readStates(ctx, sidecars) {
			if r.err == nil && r.st.Digest != "" {
				digest = r.st.Digest
				break
			}
		}
		for _, ag := range agents {
			err := c.demoteWarm(ctx, a, ag, digest)
			if err != nil && (a.Sleep.ColdPath != "" || a.Sleep.ColdS3 != "") {
				c.log.Warn("demoting the hot copy failed; placing a warm copy from the cold tier", "app", a.Name, "agent", ag.pod, "err", err)
				err = c.promoteWarm(ctx, a, ag, digest)
			}
			if err != nil {
				c.log.Warn("placing a warm copy failed; demoting anyway (the next wake reads the cold tier)", "app", a.Name, "agent", ag.pod, "err", err)
			}
		}
	}
	retry := func(what string, failed []error) error {
		a.sl.parkRetryAt = c.now().Add(a.Sleep.ParkAfter.Duration)
		a.status.Message = fmt.Sprintf("demoting to the warm tier failed (%s): %s; retrying in %v", what, joinErrs(failed), a.Sleep.ParkAfter.Duration)
		c.log.Warn("demotion failed", "app", a.Name, "step", what, "err", joinErrs(failed))
		c.sm.demotions.WithLabelValues(a.Name, "failed").Inc()
		a.kickNow()
		a.changed()
		return nil
	}
	if failed := failures(c.onSidecars(ctx, sidecars, wake, a.Sleep.WakeTimeout.Duration)); len(failed) > 0 {
		return retry("waking from the hot tier", failed)
	}
	if a.requestSince(a.sl.asleepAt) {
		return c.beginEngineWake(a, c.observe(ctx, a, root, false), triggerRequest)
	}
	a.sl.level = 2 // a sidecar that fails to sleep below is put to sleep at level 2 by the next step
	if failed := failures(c.onSidecars(ctx, sidecars, sleepAt(2), a.Sleep.SleepTimeout.Duration)); len(failed) > 0 {
		return retry("sleeping at level 2", failed)
	}
	return c.demoted(ctx, a, sidecars, start, "the weights")
}

// demoted records a demotion begun at start that succeeded: the resident
// tier read again from the sidecars, the metric, the log line and the
// Demoted event, which names what left the hot tier (what: "the weights",
// or "the model file" of engines that load copies).
func (c *Controller) demoted(ctx context.Context, a *appState, sidecars []sidecarRef, start time.Time, what string) error {
	a.status.Message = ""
	c.refreshTier(ctx, a, sidecars)
	c.sm.demotions.WithLabelValues(a.Name, "ok").Inc()
	c.log.Info("demoted", "app", a.Name, "tier", a.status.ResidentTier, "seconds", c.now().Sub(start).Seconds())
	c.event(a, corev1.EventTypeNormal, EventDemoted, "%s of %s left the hot tier after %v asleep; the next wake reads the %s tier",
		what, a.Name, start.Sub(a.sl.asleepAt).Round(time.Second), a.status.ResidentTier)
	a.changed()
	a.kickNow()
	return nil
}
