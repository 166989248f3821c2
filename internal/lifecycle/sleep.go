package lifecycle

// Sleeping engines. An application with a sleep section keeps its pods when
// idle and puts their engines to sleep instead, through the sidecar in
// each root pod (sidecars.go): the weights leave the accelerator
// for the node's hot tier (level 1) or are dropped (level 2), and the next
// request wakes them in the time it takes to move the bytes back, not a pod
// start.
//
// The gate is the one going to zero uses: the application's consumer is
// paused on the server before any engine is told to sleep and resumed only
// once every root's sidecar reports Awake again, so no dispatcher ever sends a
// request to an engine that sleeps or is falling asleep. A request that
// arrives while the engines fall asleep cancels the sleep; one that arrives
// while they sleep wakes them.
//
//	Awake --sleep.after idle--> Draining --sidecars asleep--> Asleep
//	Asleep --request--> Waking (sidecars' POST /wake, retried) --sidecars Awake--> Awake
//	Asleep --parkAfter--> Asleep in the warm tier (the node agent copies the hot offload to warm, verified; level 2)
//	Asleep --zeroAfter (minReplicas 0)--> Zero (the pods go; the next wake is a pod start)

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// Event reasons of sleeping engines.
const (
	EventAsleep           = "Asleep"
	EventSleepCancelled   = "SleepCancelled"
	EventSleepFailed      = "SleepFailed"
	EventDemoted          = "Demoted"
	EventCopyDropped      = "CheckpointCopyDropped"
	EventSidecarRestarted = "EngineRestarted"
	EventEnginesAwake     = "EnginesAwake"
	EventEngineWakeRetry  = "EngineWakeFailing"
)

// sleepState is one application's sleeping engines, owned by its goroutine
// on the leader.
type sleepState struct {
	// level the engines sleep at now (1, or 2 once demoted).
	level int32
	// asleepAt is when they were decided asleep: a request seen after it
	// wakes them.
	asleepAt time.Time
	// waking: state Waking is a wake of sleeping engines, not a pod start.
	waking    bool
	wakeStart time.Time
	attempts  int
	nextTry   time.Time
	// retryAt holds off the next sleep or demotion after a failed one.
	retryAt     time.Time
	parkRetryAt time.Time
	// bytes of the weights (per engine), as the engines last reported.
	bytes int64
	// overhead is the engines' measured wake time beyond moving the bytes.
	overhead float64
	// coldBPS is the bandwidth the last wake from the cold tier measured.
	coldBPS float64
	// refreshed is when the resident tier and the ModelCheckpoint were
	// last refreshed from the node agents.
	refreshed time.Time
	// restarted are the pods deleted for a Failed sidecar.
	restarted map[string]bool
	// verifiedCond is the ModelCheckpoint's Verified condition from the
	// last wake.
	verifiedCond *metav1.Condition
	written      string // the ModelCheckpoint status last written
	// copying is closed when the last placement of a model copy
	// (placeCopies) ended; nil: none started.
	copying chan struct{}
}

// wakeBackoff is the delay before retry n (1-based) of a failed wake.
func wakeBackoff(n int) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// refreshEvery paces the refresh of the resident tier and the
// ModelCheckpoint from the node agents while the engines sleep.
var refreshEvery = 5 * time.Second

// requestSince reports whether a request was seen published after t.
func (a *appState) requestSince(t time.Time) bool {
	return time.Unix(0, a.lastRequest.Load()).After(t)
}

// fallAsleep puts every root of an idle application to sleep behind the
// gate: the consumer is paused first, and only if then nothing is queued,
// in flight or arriving are the sidecars told to sleep. A request that arrives
// while they fall asleep cancels the sleep (the sidecars abandon their drain,
// or are woken at once).
func (c *Controller) fallAsleep(ctx context.Context, a *appState, root *appsv1.StatefulSet) error {
	decided := a.drainDecided
	sidecars, err := c.rootSidecars(a, root)
	if err != nil || len(sidecars) == 0 {
		if err == nil {
			err = errors.New("no root pod with an address")
		}
		a.sl.retryAt = c.now().Add(a.Sleep.After.Duration)
		return c.cancelSleep(ctx, a, root, sidecars, "no root sidecar to put to sleep: "+err.Error(), false)
	}
	level := a.Sleep.Level
	if err := c.closeGate(ctx, &a.consumerGate); err != nil {
		return c.cancelSleep(ctx, a, root, sidecars, "pausing its consumer failed: "+err.Error(), false)
	}
	obs := c.awaitLeases(ctx, a, root, decided)
	switch arrived := a.demandSince(obs, decided); {
	case !obs.infoOK:
		return c.cancelSleep(ctx, a, root, sidecars, "its backlog could not be read", false)
	case arrived != "":
		return c.cancelSleep(ctx, a, root, sidecars, arrived, true)
	case obs.demand.Leases > 0:
		return c.leasesHeld(a, obs)
	}

	sctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan []sidecarResult, 1)
	go func() {
		done <- c.onSidecars(sctx, sidecars, sleepAt(int(level)), a.Sleep.SleepTimeout.Duration)
	}()
	var res []sidecarResult
	cancelled := false
wait:
	for {
		select {
		case res = <-done:
			break wait
		case <-a.kick:
			if (a.requestSince(decided) || a.directSince(decided)) && !cancelled {
				cancelled = true
				stop() // the sidecars abandon their drain; the wake below undoes the rest
			}
		case <-ctx.Done():
			stop()
			<-done
			return ctx.Err()
		}
	}
	a.kickNow() // what the loop consumed
	if cancelled || a.requestSince(decided) || a.directSince(decided) {
		return c.cancelSleep(ctx, a, root, sidecars, "a request arrived while the engines fell asleep", true)
	}
	if failed := failures(res); len(failed) > 0 {
		c.event(a, corev1.EventTypeWarning, EventSleepFailed, "the engines of %s could not be put to sleep: %s", a.Name, joinErrs(failed))
		return c.cancelSleep(ctx, a, root, sidecars, "a sidecar failed to sleep: "+joinErrs(failed), false)
	}

	a.sl.level, a.sl.asleepAt = level, decided
	for _, r := range res {
		if r.st.LastSleep != nil && r.st.LastSleep.Transfer != nil && r.st.LastSleep.Transfer.Bytes > 0 {
			a.sl.bytes = r.st.LastSleep.Transfer.Bytes
		}
	}
	a.status.Sleeps++
	a.status.Message = ""
	c.sm.sleeps.WithLabelValues(a.Name, strconv.Itoa(int(level)), "asleep").Inc()
	idle := decided.Sub(a.status.LastActiveTime.Time).Round(time.Millisecond)
	c.log.Info("engines asleep", "app", a.Name, "level", level, "roots", len(sidecars), "idle", idle, "seconds", c.now().Sub(decided).Seconds())
	c.event(a, corev1.EventTypeNormal, EventAsleep, "the engines of %s sleep at level %d after %v without requests; the next request wakes them", a.Name, level, idle)
	c.enter(a, v1alpha1.LifecycleAsleep, decided)
	c.refreshTier(ctx, a, sidecars)
	c.reportSleep(ctx, a, sidecars, decided, level)
	c.placeCopies(ctx, a, sidecars)
	a.changed()
	a.kickNow() // a request may have been seen meanwhile
	return nil
}

// cancelSleep leaves a sleep that did not happen: every sidecar is woken (a
// sidecar still draining abandons its sleep) and the gate reopened. A request
// resets the idle time; a failure holds off the next attempt for sleep.after.
func (c *Controller) cancelSleep(ctx context.Context, a *appState, root *appsv1.StatefulSet, sidecars []sidecarRef, why string, byRequest bool) error {
	now := c.now()
	outcome := "cancelled"
	if byRequest {
		a.status.LastActiveTime = &metav1.Time{Time: now}
	} else {
		outcome = "failed"
		a.sl.retryAt = now.Add(a.Sleep.After.Duration)
	}
	c.sm.sleeps.WithLabelValues(a.Name, strconv.Itoa(int(a.Sleep.Level)), outcome).Inc()
	c.log.Info("sleep cancelled", "app", a.Name, "reason", why)
	c.event(a, corev1.EventTypeNormal, EventSleepCancelled, "the engines of %s stay awake: %s", a.Name, why)
	if failed := failures(c.onSidecars(ctx, sidecars, wake, a.Sleep.WakeTimeout.Duration)); len(failed) > 0 {
		// An engine did fall asleep and does not wake: wake it like any
		// sleeping engine, with retries, the gate still closed.
		c.log.Warn("waking the engines after a cancelled sleep failed; retrying", "app", a.Name, "err", joinErrs(failed))
		a.sl.level, a.sl.asleepAt = a.Sleep.Level, now
		return c.beginEngineWake(a, c.observe(ctx, a, root, false), triggerRequest)
	}
	if err := c.openGate(ctx, &a.consumerGate); err != nil {
		c.log.Warn("reopening the consumer after a cancelled sleep; retrying", "app", a.Name, "err", err)
	}
	c.unsubscribe(a)
	c.enter(a, v1alpha1.LifecycleAwake, c.now())
	a.changed()
	return nil
}

// zeroFromSleep takes a sleeping application to zero pods after zeroAfter
// (minReplicas 0). The gate is already closed; a request seen before the
// replicas are written wakes the engines instead.
func (c *Controller) zeroFromSleep(ctx context.Context, a *appState, obs observation) error {
	decided := obs.now
	if a.requestSince(a.sl.asleepAt) {
		return c.beginEngineWake(a, obs, triggerRequest)
	}
	if err := c.setReplicas(ctx, a, 0); err != nil {
		return err
	}
	a.zeroAt = decided
	c.m.drains.WithLabelValues(a.Name, "zero").Inc()
	c.m.scalings.WithLabelValues(a.Name, "zero").Inc()
	idle := decided.Sub(a.status.LastActiveTime.Time).Round(time.Second)
	c.log.Info("scaled to zero from sleep", "app", a.Name, "idle", idle)
	c.event(a, corev1.EventTypeNormal, EventScaledToZero, "scaled %s to zero pods after %v without requests (its engines slept); the next request wakes it", a.Name, idle)
	a.sl = sleepState{overhead: a.sl.overhead, coldBPS: a.sl.coldBPS, bytes: a.sl.bytes}
	a.status.ResidentTier, a.status.ExpectedResumeSeconds = v1alpha1.TierCold, ""
	c.enter(a, v1alpha1.LifecycleZero, decided)
	a.changed()
	a.afterStatus(func(ctx context.Context) { c.writeCheckpoint(ctx, a, nil, nil) })
	a.kickNow()
	return nil
}

// beginEngineWake starts waking sleeping engines: state Waking (requests
// keep waiting in the queue, the gate closed), published before the first
// attempt, which the next step makes (wakeEngines).
func (c *Controller) beginEngineWake(a *appState, obs observation, trigger string) error {
	start := obs.now
	if r := time.Unix(0, a.lastRequest.Load()); trigger == triggerRequest && r.After(a.sl.asleepAt) && r.Before(start) {
		start = r
	}
	a.sl.waking, a.sl.wakeStart, a.sl.attempts, a.sl.nextTry = true, start, 0, time.Time{}
	from := a.status.ResidentTier
	if from == "" || from == v1alpha1.TierAccelerator {
		from = v1alpha1.TierHot
	}
	a.status.Wakes++
	a.status.LastWake = &v1alpha1.WakeStatus{StartTime: &metav1.Time{Time: start}, Trigger: trigger, FromTier: from}
	a.status.LastActiveTime = &metav1.Time{Time: start}
	a.status.Message = ""
	c.log.Info("waking the engines", "app", a.Name, "trigger", trigger, "from", from)
	c.event(a, corev1.EventTypeNormal, EventWaking, "waking the engines of %s (%s) from the %s tier", a.Name, trigger, from)
	c.enter(a, v1alpha1.LifecycleWaking, c.now())
	a.changed()
	a.kickNow()
	return nil
}

// wakeEngines makes one attempt to wake every root's engine through its
// sidecar; the gate opens only once all report Awake. A failed attempt is retried with backoff,
// with the reason in the status message; a sidecar in state Failed has its pod
// deleted (its StatefulSet starts it again, awake).
func (c *Controller) wakeEngines(ctx context.Context, a *appState, root *appsv1.StatefulSet) error {
	sidecars, err := c.rootSidecars(a, root)
	if err != nil {
		return err
	}
	res := c.onSidecars(ctx, sidecars, wake, a.Sleep.WakeTimeout.Duration)
	if ctx.Err() != nil {
		return ctx.Err() // leadership lost: the next leader reads the sidecars and continues
	}
	failed := failures(res)
	if len(sidecars) == 0 {
		// Every root is (re)starting: wait for one whose sidecar can answer.
		failed = []error{fmt.Errorf("no root pod of %s is running", a.RootStatefulSet)}
	}
	if len(failed) == 0 {
		return c.enginesAwake(ctx, a, root, res)
	}
	for _, r := range c.readStates(ctx, failedRefs(res)) {
		if r.err == nil && r.st.State == sidecarapi.Failed {
			c.restartSidecar(ctx, a, r)
		}
	}
	a.sl.attempts++
	delay := wakeBackoff(a.sl.attempts)
	a.sl.nextTry = c.now().Add(delay)
	tier := string(a.status.LastWake.FromTier)
	c.sm.wakes.WithLabelValues(a.Name, tier, "failed").Inc()
	a.status.Message = fmt.Sprintf("waking the engines failed (attempt %d, retrying in %v): %s", a.sl.attempts, delay, joinErrs(failed))
	c.log.Warn("waking the engines failed; retrying", "app", a.Name, "attempt", a.sl.attempts, "retryIn", delay, "err", joinErrs(failed))
	c.event(a, corev1.EventTypeWarning, EventEngineWakeRetry, "%s: %s", a.Name, a.status.Message)
	a.changed()
	return nil
}

// enginesAwake ends a wake: every sidecar reports Awake, so the gate opens; the
// wake's numbers are worked out after that, off the requests' path.
func (c *Controller) enginesAwake(ctx context.Context, a *appState, root *appsv1.StatefulSet, res []sidecarResult) error {
	now := c.now()
	if err := c.openGate(ctx, &a.consumerGate); err != nil {
		return err // retried on the next step (the sidecars answer at once)
	}
	c.publishWoken(a.Name)
	obs := c.observe(ctx, a, root, true)
	lw := a.status.LastWake
	if lw == nil {
		lw = &v1alpha1.WakeStatus{StartTime: &metav1.Time{Time: a.sl.wakeStart}, Trigger: triggerBacklog, FromTier: v1alpha1.TierHot}
		a.status.LastWake = lw
	}
	var bytes int64
	var engineSecs float64
	verified := true
	for _, r := range res {
		w := r.st.LastWake
		if w == nil || w.At.Before(a.sl.wakeStart.Add(-5*time.Second)) {
			continue // awake already (a root that started), nothing restored
		}
		engineSecs = max(engineSecs, w.Seconds)
		if w.Transfer != nil {
			bytes += w.Transfer.Bytes
			verified = verified && (w.Transfer.Verified || w.Transfer.Bytes == 0)
			if t := w.Transfer.Tier; t != "" {
				lw.FromTier = t
			}
			if w.Transfer.Bytes > 0 {
				a.sl.bytes = w.Transfer.Bytes
			}
		}
	}
	secs := now.Sub(a.sl.wakeStart)
	lw.Seconds = strconv.FormatFloat(secs.Seconds(), 'f', 3, 64)
	lw.RequestsWaiting = int64(obs.pending + obs.ackPending) // read just after the gate opened
	lw.Bytes = bytes
	lw.BytesPerSecond = 0
	if engineSecs > 0 && bytes > 0 {
		lw.BytesPerSecond = int64(float64(bytes) / engineSecs)
		per := float64(bytes) / float64(max(len(res), 1))
		if bw := c.tierBandwidth(ctx, a, res, lw.FromTier); bw > 0 {
			a.sl.overhead = max(engineSecs-per/bw, 0)
		}
		if lw.FromTier == v1alpha1.TierCold {
			a.sl.coldBPS = per / engineSecs
		}
	}
	tier := string(lw.FromTier)
	c.sm.wakes.WithLabelValues(a.Name, tier, "ok").Inc()
	c.sm.wakeSeconds.WithLabelValues(a.Name, tier).Observe(secs.Seconds())
	c.sm.restoredBytes.WithLabelValues(a.Name, tier).Add(float64(bytes))
	c.log.Info("engines awake", "app", a.Name, "from", tier, "seconds", secs.Seconds(), "engineSeconds", engineSecs,
		"bytes", bytes, "bytesPerSecond", lw.BytesPerSecond, "verified", verified, "requestsWaiting", obs.pending)
	c.event(a, corev1.EventTypeNormal, EventEnginesAwake, "the engines of %s are awake after %.2fs from the %s tier (%d bytes restored); %d requests were waiting",
		a.Name, secs.Seconds(), tier, bytes, obs.pending)
	a.sl.waking, a.sl.attempts, a.sl.nextTry, a.sl.retryAt, a.sl.parkRetryAt = false, 0, time.Time{}, time.Time{}, time.Time{}
	a.status.Message = ""
	a.status.LastActiveTime = &metav1.Time{Time: now}
	a.status.ResidentTier, a.status.ExpectedResumeSeconds = v1alpha1.TierAccelerator, ""
	c.unsubscribe(a)
	c.m.waiting.WithLabelValues(a.Name).Set(0)
	c.enter(a, v1alpha1.LifecycleAwake, now)
	a.changed()
	a.afterStatus(func(ctx context.Context) {
		c.writeCheckpoint(ctx, a, refsOf(res), &verified)
		c.reportWake(ctx, a, res, lw)
	})
	return nil
}
