package lifecycle

// A new leader adopts engines that already sleep (adoptSleep) and asks for
// the copy of their model file the sleep would have asked for
// (adoptsCopies), and restarts a sidecar's engine that failed (restartSidecar).

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// adoptSleep takes over sleeping or waking engines when this replica
// becomes the leader: the sidecars' /state says what the previous leader left
// (asleep, or a wake under way, which it continues). It reports whether it
// decided the application's state.
func (c *Controller) adoptSleep(ctx context.Context, a *appState, root *appsv1.StatefulSet, obs observation) (bool, error) {
	if a.Sleep == nil {
		return false, nil
	}
	prev, known := c.readBucket(ctx, a.Name)
	if known {
		a.status.Sleeps, a.status.ResidentTier, a.status.ExpectedResumeSeconds = prev.Sleeps, prev.ResidentTier, prev.ExpectedResumeSeconds
	}
	if obs.specReplicas == 0 {
		if known && prev.State == v1alpha1.LifecycleZero {
			a.status.Parked = prev.Parked // still parked: its copies stay
		}
		return false, nil
	}
	sidecars, err := c.rootSidecars(a, root)
	if err != nil {
		return false, err
	}
	level, sleeping, waking := int32(0), false, false
	for _, r := range c.readStates(ctx, sidecars) {
		if r.err != nil {
			continue
		}
		switch r.st.State {
		case sidecarapi.Awake, sidecarapi.Unknown:
		case sidecarapi.Waking:
			waking = true
		default:
			sleeping = true
			level = max(level, int32(r.st.Level))
		}
	}
	midWake := known && prev.State == v1alpha1.LifecycleWaking && prev.LastWake != nil && prev.LastWake.FromTier != "" && prev.LastWake.Seconds == ""
	if !sleeping && !waking && !midWake {
		return false, nil
	}
	if err := c.subscribe(a); err != nil {
		return true, err
	}
	if err := c.closeGate(ctx, &a.consumerGate); err != nil {
		return true, err
	}
	now := obs.now
	if level == 0 {
		level = a.Sleep.Level
	}
	a.sl.level, a.sl.asleepAt = level, now
	if known && prev.State == v1alpha1.LifecycleAsleep && prev.Since != nil {
		a.sl.asleepAt = prev.Since.Time // parkAfter counts from the sleep, not the takeover
	}
	if waking || midWake {
		a.sl.waking, a.sl.wakeStart = true, now
		a.status.LastWake = &v1alpha1.WakeStatus{StartTime: &metav1.Time{Time: now}, Trigger: triggerBacklog, FromTier: a.status.ResidentTier}
		if known && prev.LastWake != nil && prev.LastWake.StartTime != nil && prev.LastWake.Seconds == "" {
			a.status.LastWake = prev.LastWake
			a.sl.wakeStart = prev.LastWake.StartTime.Time
		}
		if a.status.LastWake.FromTier == "" || a.status.LastWake.FromTier == v1alpha1.TierAccelerator {
			a.status.LastWake.FromTier = v1alpha1.TierHot
		}
		c.log.Info("continuing the wake of the engines the previous leader began", "app", a.Name)
		c.enter(a, v1alpha1.LifecycleWaking, now)
		a.changed()
		a.kickNow() // the next step makes the first attempt
		return true, nil
	}
	if a.status.ResidentTier == "" || a.status.ResidentTier == v1alpha1.TierAccelerator {
		a.status.ResidentTier = v1alpha1.TierHot
	}
	c.log.Info("the engines sleep; taking them over", "app", a.Name, "level", level, "tier", a.status.ResidentTier)
	c.enter(a, v1alpha1.LifecycleAsleep, now)
	if known && prev.Since != nil && prev.State == v1alpha1.LifecycleAsleep {
		a.status.Since = prev.Since
	}
	a.status.Replicas = obs.specReplicas
	if ob := c.observe(ctx, a, root, true); ob.infoOK && ob.pending+ob.ackPending > 0 {
		return true, c.beginEngineWake(a, ob, triggerBacklog)
	}
	// The previous leader may have gone before it asked the node agents
	// for the copy of the model file (or before the agent placed it, or
	// the agent restarted without it): ask again, as falling asleep does.
	// An agent that holds the copy only marks it used.
	if a.Sleep.adoptsCopies(now.Sub(a.sl.asleepAt)) {
		c.log.Info("asking the node agents for the copy of the model file of the engines taken over", "app", a.Name, "tier", a.Sleep.copyTarget())
		c.placeCopies(ctx, a, sidecars)
	}
	a.changed()
	return true, nil
}

// adoptsCopies tells whether a new leader asks the node agents for the
// copy of the model file of engines it takes over asleep (for asleepFor):
// with model copies (the agent places it from the model cache, mounted
// or through a sidecar), when the application uses a tier for it
// (copyTarget), unless the engines have
// slept parkAfter already: then the previous leader demoted the copy to
// the warm tier, or the next step does, and a hot copy would be evicted
// as soon as it is placed.
func (s *SleepConfig) adoptsCopies(asleepFor time.Duration) bool {
	if !s.ModelCopies || s.copyTarget() == "" {
		return false
	}
	return s.ParkAfter.Duration <= 0 || asleepFor < s.ParkAfter.Duration
}

// restartSidecar deletes a root pod whose sidecar is Failed (the engine is in a
// state the sidecar cannot tell); its StatefulSet starts it again, awake, and
// the application's step puts it back to sleep or takes it into the wake.
func (c *Controller) restartSidecar(ctx context.Context, a *appState, r sidecarResult) {
	uid := string(r.pod.UID)
	if a.sl.restarted == nil {
		a.sl.restarted = map[string]bool{}
	}
	if a.sl.restarted[uid] {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.deps.Kube.CoreV1().Pods(c.deps.Namespace).Delete(dctx, r.pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &r.pod.UID}})
	if err != nil {
		c.log.Warn("restarting the pod of a failed sidecar", "app", a.Name, "pod", r.pod.Name, "err", err)
		return
	}
	a.sl.restarted[uid] = true
	c.sm.restarts.WithLabelValues(a.Name).Inc()
	c.log.Warn("restarted the pod of a failed sidecar", "app", a.Name, "pod", r.pod.Name, "sidecarError", r.st.LastError)
	c.event(a, corev1.EventTypeWarning, EventSidecarRestarted, "deleted pod %s of %s: its sidecar is Failed (%s); its StatefulSet starts it again", r.pod.Name, a.Name, r.st.LastError)
}
