package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Event reasons recorded by the lifecycle leader.
const (
	EventWaking         = "Waking"
	EventAwake          = "Awake"
	EventScaledToZero   = "ScaledToZero"
	EventScaled         = "Scaled"
	EventWakeFailing    = "WakeFailing"
	EventDrainCancelled = "DrainCancelled"
)

// appState is one application's lifecycle. The fields below the atomics
// are owned by the application's goroutine on the leader.
type appState struct {
	App
	kick chan struct{}
	// parkedWake: the copies a parked application had when a wake from
	// zero began (park.go); nil: not a wake from park.
	parkedWake []v1alpha1.NodeCopy
	// lastRequest is when a request for the application was last seen
	// published (unix nanoseconds), while it was not awake.
	lastRequest atomic.Int64
	// lastDirect is when a gateway last reported a request on a lease of
	// the application (unix nanoseconds; leaseuse.go).
	lastDirect atomic.Int64
	// firstToken is the start (unix nanoseconds) of the last wake whose
	// first_token stage this dispatcher observed.
	firstToken atomic.Int64
	// firstTokenSent is the start (unix nanoseconds) of the last wake whose
	// first token this dispatcher handed to the leader.
	firstTokenSent atomic.Int64
	// firstTokens holds a first token reported to the leader (firsttoken.go).
	firstTokens firstTokenBox
	// rootServingSeen is when this dispatcher's cache first showed a root
	// pod that serves (unix nanoseconds) since the last wake started; 0:
	// not yet.
	rootServingSeen atomic.Int64

	// statusRecord is the application's status and where it is published
	// (persist); consumerGate its consumer's gate (gate.go).
	statusRecord
	consumerGate
	sub         *nats.Subscription
	zeroAt      time.Time // when the drain to zero was decided
	wakeStart   time.Time // first request of the current wake
	wakeScaled  time.Time // when the wake's replicas were written
	wakeTrigger string
	belowSince  time.Time // since when the backlog asked for fewer replicas
	use         usage     // the consumer's use, reading by reading (demand.go)
	// dirty: the step changed the status in a way that is written at
	// once (writeStatus); after runs once it is written.
	dirty bool
	after []func(context.Context)
	// drainDecided is when the current drain (or sleep) was decided;
	// drainForSleep: it ends in a sleep, not at zero.
	drainDecided  time.Time
	drainForSleep bool
	// sidecars are the root pods' sidecars as the step last read them, at
	// sidecarsAt (observeStep).
	sidecars   []sidecarResult
	sidecarsAt time.Time
	// wrote is the root replica count last written, at wroteAt: the cache
	// may not show it yet.
	wrote   int32
	wroteAt time.Time
	sl      sleepState // sleeping engines (sleep.go)
}

func newAppState(a App) *appState {
	return &appState{App: a, kick: make(chan struct{}, 1), consumerGate: consumerGate{app: a.Name},
		statusRecord: statusRecord{app: a.Name, set: a.RootStatefulSet, annotation: v1alpha1.AnnotationLifecycleStatus}}
}

// kickNow makes the application's goroutine look again, at once.
func (a *appState) kickNow() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// cacheLag is how long a replica count just written is trusted over the
// informer's cache, which shows it a watch event later.
const cacheLag = 5 * time.Second

// observation is what one step decides on.
type observation struct {
	now          time.Time
	root         *appsv1.StatefulSet
	specReplicas int32
	serving      int32           // replicas whose root and workers are ready
	roots        []*corev1.Pod   // the serving root pods (servingRoots)
	demand       consumerReading // read when info is asked for
	pending      uint64
	ackPending   uint64
	delivered    uint64
	paused       bool // the consumer is paused on the server
	infoOK       bool
}

// runApp decides for one application until ctx ends.
func (c *Controller) runApp(ctx context.Context, a *appState) {
	defer c.unsubscribe(a)
	if err := errors.Join(c.initApp(ctx, a), c.writeStatus(ctx, a)); err != nil {
		if ctx.Err() == nil {
			c.log.Error("starting lifecycle", "app", a.Name, "err", err)
		}
	}
	t := time.NewTicker(c.cfg.Tick.Duration)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-t.C:
		}
		if err := c.runStep(ctx, a); err != nil && ctx.Err() == nil {
			c.log.Warn("lifecycle step failed; retrying", "app", a.Name, "state", a.status.State, "err", err)
		}
	}
}

// initApp takes an application over: its state from the StatefulSet, its
// history from the bucket, and a fence left by an earlier leader released.
func (c *Controller) initApp(ctx context.Context, a *appState) error {
	now := c.now()
	if prev, ok := c.readBucket(ctx, a.Name); ok {
		a.status.Wakes, a.status.LastWake = prev.Wakes, prev.LastWake
	}
	// Until something else is known, the application counts as active now:
	// a new leader never takes an application to zero sooner than
	// zeroAfter after it took over.
	a.status.LastActiveTime = &metav1.Time{Time: now}
	root, err := c.rootSet(a)
	if err != nil {
		return fmt.Errorf("reading root StatefulSet %s: %w", a.RootStatefulSet, err)
	}
	obs := c.observe(ctx, a, root, true)
	if adopted, err := c.adoptSleep(ctx, a, root, obs); adopted || err != nil {
		return err
	}
	switch {
	case obs.specReplicas == 0:
		a.zeroAt = now // a request seen from here on wakes it
		if err := c.subscribe(a); err != nil {
			return err
		}
		obs = c.observe(ctx, a, root, true) // after subscribing: nothing slips between
		c.enter(a, v1alpha1.LifecycleZero, now)
	case obs.serving > 0:
		c.enter(a, v1alpha1.LifecycleAwake, now)
	default:
		if err := c.subscribe(a); err != nil {
			return err
		}
		a.wakeStart, a.wakeScaled, a.wakeTrigger = now, now, ""
		c.enter(a, v1alpha1.LifecycleWaking, now)
	}
	a.status.Replicas = obs.specReplicas
	// The gate: closed while no root serves (an earlier leader may have
	// left it either way).
	if a.status.State == v1alpha1.LifecycleAwake {
		if err := c.openGate(ctx, &a.consumerGate); err != nil {
			return err
		}
	} else if err := c.closeGate(ctx, &a.consumerGate); err != nil {
		return err
	}
	if err := c.syncWorkers(ctx, a, obs.specReplicas); err != nil {
		return err
	}
	if a.status.State == v1alpha1.LifecycleZero && obs.infoOK && obs.pending > 0 {
		return c.wake(ctx, a, obs, triggerBacklog)
	}
	a.changed()
	return nil
}

// observe reads the application's root StatefulSet and pods from the cache
// and, when info is true, its consumer from JetStream.
func (c *Controller) observe(ctx context.Context, a *appState, root *appsv1.StatefulSet, info bool) observation {
	o := observation{now: c.now(), root: root}
	if root != nil {
		o.specReplicas = 1
		if root.Spec.Replicas != nil {
			o.specReplicas = *root.Spec.Replicas
		}
		if o.specReplicas != a.wrote && o.now.Sub(a.wroteAt) < cacheLag {
			o.specReplicas = a.wrote // our write, not in the cache yet
		}
		// Counted from the pods, not the StatefulSet's readyReplicas: a
		// pod's Ready condition reaches this cache a controller hop (and
		// tens of milliseconds) before the StatefulSet counts it, and the
		// StatefulSet counts a terminating pod that is still Ready
		// (fence.go).
		pods := c.appPods(a)
		o.roots = servingRoots(root, o.specReplicas, pods, c.podServes)
		o.serving = int32(len(o.roots))
		if len(a.WorkerStatefulSets) > 0 {
			// Counted from the pods too, and by the same rule as a root
			// (Ready, or answering its probes before the kubelet says
			// so): a worker's readiness probe asks every 10 s.
			groups := int32(0)
			for i := int32(0); i < o.specReplicas && int(i) < len(a.WorkerStatefulSets); i++ {
				if servingWorkers(a.WorkerStatefulSets[i], pods, c.podServes) >= a.WorkersPerReplica {
					groups++
				}
			}
			o.serving = min(o.serving, groups)
		}
	}
	if info {
		r := c.readConsumer(ctx, a.Name)
		o.demand = r
		if r.OK {
			o.pending, o.ackPending, o.delivered, o.paused, o.infoOK = r.Queued, r.InFlight, r.Delivered, r.Paused, true
			cfg := r.Config
			a.consumer, a.consumerAt = &cfg, o.now
		}
	}
	return o
}

// awaitLeases closes in on a drain or sleep decided at decided: it reads
// the consumer and, while the only thing in flight is leases held by
// gateways' direct lanes (idle: a request on one would have cancelled
// the decision), waits up to leaseReturnWait for them to be given back,
// which the gateways do once they see the application leave serving.
func (c *Controller) awaitLeases(ctx context.Context, a *appState, root *appsv1.StatefulSet, decided time.Time) observation {
	obs := c.observe(ctx, a, root, true)
	for end := time.Now().Add(leaseReturnWait); obs.infoOK && obs.demand.Leases > 0 && a.demandSince(obs, decided) == "" &&
		time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return obs
		case <-time.After(50 * time.Millisecond):
		}
		obs = c.observe(ctx, a, root, true)
	}
	return obs
}

// demandSince tells why a drain or sleep decided at decided is to be
// cancelled, given obs read with the gate closed ("" for no reason):
// requests queued or in flight beyond the leases gateways hold, or a
// request seen since, through the queue or on a direct lane.
func (a *appState) demandSince(obs observation, decided time.Time) string {
	switch {
	case obs.pending+obs.ackPending > obs.demand.Leases:
		return fmt.Sprintf("%d requests queued, %d in flight", obs.pending, obs.ackPending-obs.demand.Leases)
	case a.requestSince(decided):
		return "a request arrived"
	case a.directSince(decided):
		return "a request arrived on a gateway's direct lane"
	}
	return ""
}

// leasesHeld keeps a drain or sleep waiting (state Draining, the gate
// closed) for leases the gateways still hold: the next step looks again.
// A gateway gives its lease back once the application leaves serving,
// after the request it runs ends; the dispatcher takes a lease back at its
// MaxAge and frees it once no use report says busy (a gateway that is
// gone). A request meanwhile,
// queued or on a direct lane, cancels the drain or sleep.
func (c *Controller) leasesHeld(a *appState, obs observation) error {
	c.log.Info("waiting for gateways to give their direct lane leases back", "app", a.Name, "leases", obs.demand.Leases)
	return nil
}

// scaleWithBacklog runs ceil(load / target) replicas within
// [max(min, 1), max]: more at once, fewer once the backlog has asked for
// fewer for the stabilization window. With the KEDA scaler it only keeps
// the workers in step with the root.
func (c *Controller) scaleWithBacklog(ctx context.Context, a *appState, obs observation) error {
	cur := obs.specReplicas
	if a.Scaler == v1alpha1.ScalerKEDA {
		a.status.Replicas = cur
		return c.syncWorkers(ctx, a, cur)
	}
	load := obs.demand.ActiveLoad() // an idle lease is no load
	target := uint64(a.TargetQueuePerReplica)
	want := int32(min((load+target-1)/target, uint64(a.MaxReplicas)))
	want = max(want, a.MinReplicas, 1)
	switch {
	case want > cur:
		a.belowSince = time.Time{}
		c.log.Info("scaling out on backlog", "app", a.Name, "from", cur, "to", want, "queued", obs.pending, "inFlight", obs.ackPending)
		c.m.scalings.WithLabelValues(a.Name, "up").Inc()
		c.event(a, corev1.EventTypeNormal, EventScaled, "scaled %s from %d to %d replicas: %d requests queued, %d in flight", a.Name, cur, want, obs.pending, obs.ackPending)
		return c.setReplicas(ctx, a, want)
	case want < cur:
		if a.belowSince.IsZero() {
			a.belowSince = obs.now
		}
		if obs.now.Sub(a.belowSince) < a.scaleDownStabilization() {
			return c.syncWorkers(ctx, a, cur)
		}
		a.belowSince = time.Time{}
		c.log.Info("scaling in: backlog dropped", "app", a.Name, "from", cur, "to", want)
		c.m.scalings.WithLabelValues(a.Name, "down").Inc()
		c.event(a, corev1.EventTypeNormal, EventScaled, "scaled %s from %d to %d replicas: the backlog dropped", a.Name, cur, want)
		return c.setReplicas(ctx, a, want)
	default:
		a.belowSince = time.Time{}
		a.status.Replicas = cur
		return c.syncWorkers(ctx, a, cur)
	}
}

// beginDrain enters Draining: an idle application goes to zero, or its
// engines to sleep (forSleep), in the next step (drain, fallAsleep), once
// its state is out. Requests are seen from here on: one cancels it.
func (c *Controller) beginDrain(ctx context.Context, a *appState, root *appsv1.StatefulSet, forSleep bool) error {
	decided := c.now()
	if forSleep {
		if refs, err := c.rootSidecars(a, root); err != nil || len(refs) == 0 {
			if err == nil {
				err = errors.New("no root pod with an address")
			}
			a.sl.retryAt = decided.Add(a.Sleep.After.Duration)
			c.log.Warn("cannot put the engines to sleep; retrying later", "app", a.Name, "retryIn", a.Sleep.After.Duration, "err", err)
			return nil
		}
	}
	if err := c.subscribe(a); err != nil {
		return err
	}
	a.drainDecided, a.drainForSleep = decided, forSleep
	c.enter(a, v1alpha1.LifecycleDraining, decided)
	a.changed()
	a.kickNow()
	return nil
}

// drain takes an idle application to zero behind a fence: its consumer is
// paused on the server, so that no dispatcher takes a request from now on;
// if after that anything is queued or in flight, the drain is cancelled
// (the wake wins); otherwise the pods are scaled to zero. The consumer is
// resumed once the old pods are gone, so that no request can reach a root
// on its way out.
func (c *Controller) drain(ctx context.Context, a *appState, root *appsv1.StatefulSet) error {
	decided := a.drainDecided
	cancelDrain := func(why string) error {
		if err := c.openGate(ctx, &a.consumerGate); err != nil {
			c.log.Warn("reopening the consumer after a cancelled drain; retrying", "app", a.Name, "err", err)
		}
		c.m.drains.WithLabelValues(a.Name, "cancelled").Inc()
		c.log.Info("drain cancelled", "app", a.Name, "reason", why)
		c.event(a, corev1.EventTypeNormal, EventDrainCancelled, "%s stays awake: %s", a.Name, why)
		a.status.LastActiveTime = &metav1.Time{Time: c.now()}
		c.unsubscribe(a)
		c.enter(a, v1alpha1.LifecycleAwake, c.now())
		a.changed()
		return nil
	}
	if err := c.closeGate(ctx, &a.consumerGate); err != nil {
		_ = cancelDrain("pausing its consumer failed: " + err.Error())
		return err
	}
	obs := c.awaitLeases(ctx, a, root, decided)
	switch arrived := a.demandSince(obs, decided); {
	case !obs.infoOK:
		return cancelDrain("its backlog could not be read")
	case arrived != "":
		return cancelDrain(arrived)
	case obs.demand.Leases > 0:
		return c.leasesHeld(a, obs)
	}
	a.zeroAt = decided
	if err := c.setReplicas(ctx, a, 0); err != nil {
		if a.wrote != 0 || a.wroteAt.Before(decided) {
			// The root still has its replicas: nothing is going away.
			_ = cancelDrain("scaling to zero failed: " + err.Error())
			return err
		}
		// The root is going to zero and a worker StatefulSet was not
		// written: the gate stays closed (the next steps write the
		// workers), so that no request reaches a root on its way out.
		c.log.Warn("scaling the workers to zero; retrying", "app", a.Name, "err", err)
	}
	c.m.drains.WithLabelValues(a.Name, "zero").Inc()
	c.m.scalings.WithLabelValues(a.Name, "zero").Inc()
	idle := decided.Sub(a.status.LastActiveTime.Time).Round(time.Second)
	c.log.Info("scaled to zero", "app", a.Name, "idle", idle)
	c.event(a, corev1.EventTypeNormal, EventScaledToZero, "scaled %s to zero pods after %v without requests; the next request wakes it", a.Name, idle)
	c.enter(a, v1alpha1.LifecycleZero, decided)
	a.changed()
	// A request may have been seen between the check and now.
	a.kickNow()
	return nil
}

// wake scales an application at zero (or draining) to its awake size.
func (c *Controller) wake(ctx context.Context, a *appState, obs observation, trigger string) error {
	start := obs.now
	if r := time.Unix(0, a.lastRequest.Load()); trigger == triggerRequest && r.After(a.zeroAt) && r.Before(start) {
		start = r
	}
	want := max(a.MinReplicas, 1)
	if err := c.setReplicas(ctx, a, want); err != nil {
		return err
	}
	scaled := c.now()
	a.wakeStart, a.wakeScaled, a.wakeTrigger = start, scaled, trigger
	a.status.Wakes++
	a.status.LastWake = &v1alpha1.WakeStatus{StartTime: &metav1.Time{Time: start}, Trigger: trigger}
	a.status.LastActiveTime = &metav1.Time{Time: start}
	a.status.Message = ""
	c.m.wakes.WithLabelValues(a.Name, trigger).Inc()
	c.m.wakeSeconds.WithLabelValues(a.Name, stageDecision).Observe(scaled.Sub(start).Seconds())
	c.m.scalings.WithLabelValues(a.Name, "wake").Inc()
	c.log.Info("waking", "app", a.Name, "trigger", trigger, "replicas", want, "decision", scaled.Sub(start))
	c.event(a, corev1.EventTypeNormal, EventWaking, "waking %s (%s): scaled to %d replicas", a.Name, trigger, want)
	c.enter(a, v1alpha1.LifecycleWaking, scaled)
	a.changed()
	return nil
}

// awake marks a waking application awake: a root is ready, the gate
// opens and the dispatchers send it the queued requests. The wake's
// numbers are worked out after that, off the requests' path.
func (c *Controller) awake(ctx context.Context, a *appState, root *appsv1.StatefulSet) error {
	opening := c.now()
	if err := c.openGate(ctx, &a.consumerGate); err != nil {
		return err // retried on the next step, still Waking
	}
	opened := c.now()
	obs := c.observe(ctx, a, root, true)
	now := obs.now
	if !a.wakeStart.IsZero() && a.status.LastWake != nil {
		secs := now.Sub(a.wakeStart)
		waiting := obs.pending + obs.ackPending // read just after the gate opened
		a.status.LastWake.Seconds = strconv.FormatFloat(secs.Seconds(), 'f', 3, 64)
		a.status.LastWake.RequestsWaiting = int64(waiting)
		seen := time.Unix(0, a.rootServingSeen.Load())
		if a.rootServingSeen.Load() == 0 || seen.After(opening) {
			seen = opening
		}
		c.observeStages(a, seen, opened)
		c.log.Info("awake", "app", a.Name, "wake", secs, "requestsWaiting", waiting,
			"rootSeenToGate", opening.Sub(seen), "gateOpen", opened.Sub(opening))
		c.event(a, corev1.EventTypeNormal, EventAwake, "%s is awake after %.1fs; %d requests were waiting", a.Name, secs.Seconds(), waiting)
	}
	a.wakeStart = time.Time{}
	a.status.Message = ""
	a.status.LastActiveTime = &metav1.Time{Time: now}
	c.unsubscribe(a)
	c.m.waiting.WithLabelValues(a.Name).Set(0)
	c.enter(a, v1alpha1.LifecycleAwake, now)
	a.changed()
	return nil
}

// observeStages records the pod stages of the wake that just ended, from
// the first root pod's conditions and container state, and the dispatch
// stage: from the root pod, ready, reaching this cache (seen) to the gate
// open (opened).
func (c *Controller) observeStages(a *appState, seen, opened time.Time) {
	var pod *corev1.Pod
	for _, p := range c.appPods(a) {
		if p.Labels[labelComponent] == "root" && p.DeletionTimestamp == nil && p.CreationTimestamp.After(a.wakeScaled.Add(-time.Second)) {
			if pod == nil || p.CreationTimestamp.Before(&pod.CreationTimestamp) {
				pod = p
			}
		}
	}
	observe := func(stage string, from, to time.Time) time.Time {
		if from.IsZero() || to.IsZero() || to.Before(from) {
			return from
		}
		c.m.wakeSeconds.WithLabelValues(a.Name, stage).Observe(to.Sub(from).Seconds())
		return to
	}
	at := a.wakeScaled
	if pod != nil {
		var scheduled, ready, started time.Time
		for _, cond := range pod.Status.Conditions {
			switch cond.Type {
			case corev1.PodScheduled:
				scheduled = cond.LastTransitionTime.Time
			case corev1.PodReady:
				if cond.Status == corev1.ConditionTrue {
					ready = cond.LastTransitionTime.Time
				}
			}
		}
		if ready.IsZero() {
			ready = c.early.answeredAt(pod) // served before the kubelet said Ready
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Running != nil && (started.IsZero() || cs.State.Running.StartedAt.After(started)) {
				started = cs.State.Running.StartedAt.Time
			}
		}
		at = observe(stageScheduled, at, scheduled)
		at = observe(stageStarted, at, started)
		observe(stageReady, at, ready)
	}
	observe(stageDispatch, seen, opened)
}

// wakeProblem explains why pods of a waking application do not start:
// unschedulable, image pull failures, crash loops, bad configuration.
func wakeProblem(pods []*corev1.Pod) string {
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return fmt.Sprintf("pod %s cannot be scheduled: %s", p.Name, cond.Message)
			}
		}
		statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, cs := range statuses {
			w := cs.State.Waiting
			if w == nil {
				continue
			}
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
				"CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				msg := fmt.Sprintf("pod %s container %s: %s", p.Name, cs.Name, w.Reason)
				if w.Message != "" {
					msg += ": " + w.Message
				}
				return msg
			}
		}
	}
	return ""
}
