package lifecycle

// One step of an application: observe, Decide (plan.go), execute, and the
// status written once (writeStatus).

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// runStep runs one step of the application and writes its status once,
// then runs what waits for the status to be out (after).
func (c *Controller) runStep(ctx context.Context, a *appState) error {
	err := c.step(ctx, a)
	return errors.Join(err, c.writeStatus(ctx, a))
}

// step looks at the application once and acts.
func (c *Controller) step(ctx context.Context, a *appState) error {
	root, err := c.rootSet(a)
	if apierrors.IsNotFound(err) {
		return nil // not rendered yet, or being uninstalled
	}
	if err != nil {
		return err
	}
	c.applyFirstToken(a)
	o, obs := c.observeStep(ctx, a, root)
	return c.execute(ctx, a, root, obs, Decide(o))
}

// observeStep reads what a step of the application decides on, each read
// only when its state needs it and in the order that keeps a wake fast: a
// request seen wakes without a read of JetStream, and a root that serves
// opens the gate before anything else is read.
func (c *Controller) observeStep(ctx context.Context, a *appState, root *appsv1.StatefulSet) (Observation, observation) {
	st := a.status.State
	o := Observation{State: st, EngineWake: a.sl.waking, DrainForSleep: a.drainForSleep, Message: a.status.Message,
		App: AppPolicy{MinReplicas: a.MinReplicas, ZeroAfter: a.ZeroAfter.Duration}}
	since := a.zeroAt
	if st == v1alpha1.LifecycleAsleep {
		since = a.sl.asleepAt
	}
	o.RequestSeen = (st == v1alpha1.LifecycleZero || st == v1alpha1.LifecycleAsleep) && a.requestSince(since)
	readConsumer := true
	switch {
	case o.RequestSeen, st == v1alpha1.LifecycleDraining, st == v1alpha1.LifecycleWaking && a.sl.waking:
		readConsumer = false
	}
	obs := c.observe(ctx, a, root, false)
	if st == v1alpha1.LifecycleWaking && !a.sl.waking {
		if obs.serving > 0 {
			o.RootsConfirmed = c.rootsConfirmed(ctx, a, obs.roots)
		}
		// The pod's and the StatefulSet's every change kicks this step
		// while the pods start: the consumer (and the sidecars) are read
		// once a tick, so that the step the root's Ready kicks does not
		// wait behind a read started for an earlier change.
		readConsumer = !o.RootsConfirmed && obs.now.Sub(a.consumerAt) >= c.cfg.Tick.Duration
	}
	if readConsumer {
		obs = c.observe(ctx, a, root, true)
	}
	o.Now, o.Replicas, o.Serving = obs.now, obs.specReplicas, obs.serving
	o.Demand = obs.demand
	if obs.demand.OK {
		o.Used = a.use.update(obs.now, obs.demand)
	}
	if a.status.LastActiveTime != nil {
		o.Idle = obs.now.Sub(a.status.LastActiveTime.Time)
	}
	if st == v1alpha1.LifecycleWaking && !a.sl.waking && !o.RootsConfirmed {
		o.Problem = wakeProblem(c.appPods(a))
	}
	if a.Sleep != nil {
		o.Sleep = &SleepPolicy{After: a.Sleep.After.Duration, ParkAfter: a.Sleep.ParkAfter.Duration, Level: a.sl.level,
			AsleepFor: obs.now.Sub(a.sl.asleepAt), SleepHeld: obs.now.Before(a.sl.retryAt), ParkHeld: obs.now.Before(a.sl.parkRetryAt),
			WakeHeld: obs.now.Before(a.sl.nextTry), RefreshDue: obs.now.Sub(a.sl.refreshed) >= refreshEvery,
			ResidentTier: a.status.ResidentTier, ExpectedResume: a.status.ExpectedResumeSeconds,
			Offloads:  a.Sleep.keepsRAM() || !a.Sleep.ModelCopies && (a.Sleep.Level1Tier == "" || a.Sleep.Level1Tier == v1alpha1.TierHot),
			HotCopies: a.Sleep.ModelCopies}
		o.Parked = st == v1alpha1.LifecycleZero && a.status.Parked != nil
		if c.sidecarsNeeded(a, o, obs) {
			o.Sidecars = c.readSidecars(ctx, a, root, obs)
		}
	}
	return o, obs
}

// sidecarsNeeded tells whether a step reads the root pods' sidecars:
// while the engines sleep (nothing woke them), and, paced like the
// consumer's reads, while a root of an awake or starting application
// does not serve (its engine may be asleep).
func (c *Controller) sidecarsNeeded(a *appState, o Observation, obs observation) bool {
	switch o.State {
	case v1alpha1.LifecycleAsleep:
		return !o.RequestSeen && o.Replicas > 0 && (!o.Demand.OK || !o.Demand.Busy())
	case v1alpha1.LifecycleWaking:
		return !o.EngineWake && !o.RootsConfirmed && o.Replicas > 0 && o.Demand.OK
	case v1alpha1.LifecycleAwake:
		return o.Replicas > o.Serving && obs.now.Sub(a.sidecarsAt) >= c.cfg.Tick.Duration
	}
	return false
}

// readSidecars reads the state of every root pod's sidecar (GET /state).
func (c *Controller) readSidecars(ctx context.Context, a *appState, root *appsv1.StatefulSet, obs observation) []SidecarReading {
	a.sidecarsAt = obs.now
	refs, err := c.rootSidecars(a, root)
	if err != nil {
		return nil
	}
	serving := map[string]bool{}
	for _, p := range obs.roots {
		serving[p.Name] = true
	}
	res := c.readStates(ctx, refs)
	a.sidecars = res
	out := make([]SidecarReading, len(res))
	for i, r := range res {
		out[i] = SidecarReading{Pod: r.pod.Name, State: r.st.State, Serving: serving[r.pod.Name]}
		if r.err != nil {
			out[i].State = sidecarapi.Unknown
		}
	}
	return out
}

// execute applies a plan in order; the first action that fails ends it.
func (c *Controller) execute(ctx context.Context, a *appState, root *appsv1.StatefulSet, obs observation, plan []Action) error {
	if obs.demand.OK {
		waiting := float64(obs.demand.Queued)
		if a.status.State == v1alpha1.LifecycleAwake {
			waiting = 0
		}
		c.m.waiting.WithLabelValues(a.Name).Set(waiting)
	}
	for _, act := range plan {
		if err := c.apply(ctx, a, root, obs, act); err != nil {
			return err
		}
	}
	return nil
}

// apply applies one action of a plan.
func (c *Controller) apply(ctx context.Context, a *appState, root *appsv1.StatefulSet, obs observation, act Action) error {
	switch act.Kind {
	case ActFail:
		return errors.New(act.Reason)
	case ActMarkActive:
		a.status.LastActiveTime = &metav1.Time{Time: obs.now}
	case ActSetTier:
		a.status.ResidentTier, a.status.ExpectedResumeSeconds = act.Tier, ""
		a.changed()
	case ActCloseGate:
		return c.closeGate(ctx, &a.consumerGate)
	case ActWake:
		parked := a.status.Parked
		if err := c.wake(ctx, a, obs, act.Trigger); err != nil {
			return err
		}
		c.wokeFromPark(a, parked)
	case ActFollowWaking:
		c.wokeFromPark(a, a.status.Parked)
		c.enter(a, v1alpha1.LifecycleWaking, obs.now)
		a.wakeStart, a.wakeScaled, a.wakeTrigger = obs.now, obs.now, ""
		a.changed()
	case ActFollowZero:
		return c.followZero(ctx, a, obs)
	case ActSyncWorkers:
		return c.syncWorkers(ctx, a, obs.specReplicas)
	case ActAwake:
		if err := c.awake(ctx, a, root); err != nil {
			return err
		}
		c.parkedWakeLanded(a)
		c.podStartTier(ctx, a, root)
	case ActReportProblem:
		a.status.Message = act.Reason
		if act.Reason != "" {
			c.event(a, corev1.EventTypeWarning, EventWakeFailing, "application %s cannot wake: %s", a.Name, act.Reason)
		}
		a.changed()
	case ActScale:
		return c.scaleWithBacklog(ctx, a, obs)
	case ActBeginDrain, ActBeginSleep:
		return c.beginDrain(ctx, a, root, act.Kind == ActBeginSleep)
	case ActDrain:
		return c.drain(ctx, a, root)
	case ActSleep:
		return c.fallAsleep(ctx, a, root)
	case ActBeginEngineWake:
		return c.beginEngineWake(a, obs, act.Trigger)
	case ActWakeEngines:
		return c.wakeEngines(ctx, a, root)
	case ActWakeSidecars:
		c.wakeSidecars(ctx, a, act.Pods)
	case ActRestartSidecar:
		for _, r := range a.sidecars {
			if r.pod.Name == act.Pods[0] {
				c.restartSidecar(ctx, a, r)
			}
		}
	case ActSleepSidecars:
		refs := sidecarsNamed(a.sidecars, act.Pods)
		if failed := failures(c.onSidecars(ctx, refs, sleepAt(int(act.Level)), a.Sleep.SleepTimeout.Duration)); len(failed) > 0 {
			c.log.Warn("putting a started root to sleep failed; retrying", "app", a.Name, "err", joinErrs(failed))
		} else {
			c.log.Info("a started root sleeps like the others", "app", a.Name, "roots", len(refs), "level", act.Level)
		}
		a.kickNow()
	case ActPark:
		return c.demote(ctx, a, root, refsOf(a.sidecars))
	case ActZeroFromSleep:
		return c.zeroFromSleep(ctx, a, obs)
	case ActParkPods:
		return c.parkPods(ctx, a, obs)
	case ActRefreshParked:
		c.refreshParked(ctx, a)
	case ActRefreshTier:
		before := a.status.ResidentTier
		c.refreshTier(ctx, a, refsOf(a.sidecars))
		if a.status.ResidentTier != before {
			a.changed()
		}
	default:
		return fmt.Errorf("lifecycle: no executor for action %q", act.Kind)
	}
	return nil
}

// followZero follows a scale to zero made by someone else: requests now
// wait for a wake, which starts pods.
func (c *Controller) followZero(ctx context.Context, a *appState, obs observation) error {
	if err := c.subscribe(a); err != nil {
		return err
	}
	if a.status.State != v1alpha1.LifecycleAsleep {
		if err := c.closeGate(ctx, &a.consumerGate); err != nil {
			return err
		}
	} else {
		a.status.ResidentTier, a.status.ExpectedResumeSeconds = v1alpha1.TierCold, ""
	}
	a.zeroAt = obs.now
	c.enter(a, v1alpha1.LifecycleZero, obs.now)
	a.changed()
	return nil
}

// wakeSidecars wakes the engines of the named root pods, whose sidecars
// report Asleep while the application is meant to serve: a root that
// started, or restarted, with its engine asleep is Ready only once its
// engine is awake. A failed wake is logged and retried a tick later.
func (c *Controller) wakeSidecars(ctx context.Context, a *appState, pods []string) {
	refs := sidecarsNamed(a.sidecars, pods)
	if failed := failures(c.onSidecars(ctx, refs, wake, a.Sleep.WakeTimeout.Duration)); len(failed) > 0 {
		c.log.Warn("waking the engine of a root whose sidecar reports Asleep failed; retrying", "app", a.Name, "err", joinErrs(failed))
		return
	}
	c.log.Info("woke the engine of a root whose sidecar reported Asleep", "app", a.Name, "pods", pods)
}
