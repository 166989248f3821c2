package lifecycle

// Seat groups. The applications of a seat group share one accelerator in
// each of the group's pods (StatefulSet "<release>-seat-<group>", replicas
// pods, one engine and one sidecar per application in each); in each
// pod, activeSeats of them are awake at once. The leader runs one
// seatgroup.Executor per pod: it reads the pod's sidecars (GET /state on the
// pod's IP at the application's seat port), the demand the queue shows for
// each application (its consumer's queued and in-flight counts), decides
// with seatgroup.Decide, and applies the plan through the pod's sidecars
// (POST /sleep, POST /wake) and two gates (seatserving.go): the pods
// serving each application (SeatServingAnnotation, which the dispatchers
// follow), and the application's JetStream consumer, paused on the server
// (closeGate) while no pod serves the application or one drains it, and
// resumed (openGate) otherwise. An engine is put to sleep only after its
// pod stopped serving it, the consumer paused, and the consumer counts
// nothing in flight (a request a dispatcher took, or holds for a free
// slot, counts until it is acknowledged).
//
// The executors of a group step one after the other, so that each pod
// decides on what the others did: a pod sees an application's queue only
// while no other pod serves it, or once its oldest request waited
// maxSwapWait (seatPodDemand).

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// EventSeatGroupRefused is recorded on a seat group's StatefulSet that the
// leader cannot multiplex.
const EventSeatGroupRefused = "SeatGroupRefused"

// servingFence bounds how long the leader waits, after it took a pod out
// of an application's SeatServingAnnotation, for its own cache of the
// StatefulSet to show it (the dispatchers' caches follow the same watch)
// before it counts the application's requests in flight.
const servingFence = 2 * time.Second

// seatGroupRun is one group on the leader.
type seatGroupRun struct {
	c       *Controller
	g       SeatGroup
	members map[string]*seatMember
	pods    []*seatPodRun
	disp    *seatDispatcher
	// kick makes the group step at once (a request arrived).
	kick chan struct{}
	// statusKick asks the status loop to write at once (a swap).
	statusKick chan struct{}
	// written is the SeatServingAnnotation last written (the executors'
	// goroutine's).
	written SeatServing
	// reports are the swaps' sleeps and wakes on their way to the node
	// agents (reportLoop).
	reports chan swapReport
}

// swapReport is one sleep or wake of a swap for the node agent on the
// pod's node.
type swapReport struct {
	m    *seatMember
	pod  *corev1.Pod
	kind string // reportWake or reportSleep
	rec  any    // nodeapi.WakeRecord or nodeapi.SleepRecord
}

// maxQueuedReports bounds the swap reports waiting for the node agents; a
// report that finds the queue full is dropped (logged and counted).
const maxQueuedReports = 64

// seatPodRun is one pod of a group on the leader: its executor, its sidecars
// and its gate for each application. Only the group's goroutine touches
// gates.
type seatPodRun struct {
	r        *seatGroupRun
	name     string
	exec     *seatgroup.Executor
	sidecars map[string]*podSidecar
	gates    map[string]Gate
}

// seatMember is one application of a group on the leader.
type seatMember struct {
	cfg SeatMember
	// st carries the name and the consumer's gate (st.gate, as gate.go
	// last set it) of the application for closeGate and openGate, and its
	// status for persist. Its gate is the executors' goroutine's; its
	// status fields the status loop's.
	st *appState

	mu sync.Mutex
	// holdFailed: a Hold did not get its answer from the server, so a
	// request may still be handed out; Demand counts one in flight.
	holdFailed bool
	demand     seatgroup.Demand // the last reading
	use        usage
	swaps      int64
	lastSwap   float64
}

// runSeatGroups runs the executors of every sidecar group until ctx ends.
func (c *Controller) runSeatGroups(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range c.cfg.SeatGroups {
		wg.Go(func() { c.runSeatGroup(ctx, g) })
	}
	wg.Wait()
}

func (c *Controller) runSeatGroup(ctx context.Context, g SeatGroup) {
	log := c.log.With("seatGroup", g.Name)
	if !c.seatGroupReplicasMatch(ctx, g) {
		return
	}
	r := &seatGroupRun{c: c, g: g, members: map[string]*seatMember{}, kick: make(chan struct{}, 1), statusKick: make(chan struct{}, 1),
		reports: make(chan swapReport, maxQueuedReports)}
	r.disp = &seatDispatcher{r: r, ctx: ctx}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, m := range g.Members {
		st := newAppState(App{Name: m.Name, RootStatefulSet: g.StatefulSet, Sleep: m.sleep()})
		st.annotation = v1alpha1.LifecycleStatusAnnotation(m.Name, true)
		r.members[m.Name] = &seatMember{cfg: m, st: st}
	}
	for i := range max(g.Replicas, 1) {
		p := &seatPodRun{r: r, name: fmt.Sprintf("%s-%d", g.StatefulSet, i), sidecars: map[string]*podSidecar{}, gates: map[string]Gate{}}
		cfg := seatgroup.Default(g.Name)
		if g.Replicas > 1 {
			// The executors of a group's pods share the registry's
			// collectors: each pod has its own series.
			cfg.Name = fmt.Sprintf("%s/%d", g.Name, i)
		}
		cfg.ActiveSeats = int(g.ActiveSeats)
		cfg.Tick = c.cfg.Tick.Duration
		var members []seatgroup.Member
		for _, m := range g.Members {
			seat := &podSidecar{p: p, app: m.Name, port: m.SeatPort, client: client}
			p.sidecars[m.Name] = seat
			members = append(members, seatgroup.Member{
				Name: m.Name, Priority: m.Priority, SleepLevel: int(m.SleepLevel), MinResidency: m.MinResidency.Duration,
				SleepAfter: m.SleepAfter.Duration,
				// The memory reading and the restart go through the seat
				// agent: the residentBytes its GET /state reports (the
				// simulator; an engine that reports none is trusted to
				// have slept), and POST /restart, which restarts the
				// engine in place (the simulator run with --restartable;
				// other engines refuse).
				Sidecar: seat, Memory: seat, Restarter: seat,
			})
		}
		exec, err := seatgroup.NewExecutor(cfg, members, &podDispatcher{p: p}, c.deps.Registry, c.log.With("pod", p.name),
			seatgroup.WithEvents(func(ev seatgroup.Event) { r.onEvent(p, ev) }))
		if err != nil {
			log.Error("seat group not multiplexed", "err", err)
			return
		}
		p.exec = exec
		r.pods = append(r.pods, p)
	}
	// A request published for a member makes the group step at once.
	for _, m := range g.Members {
		sub, err := c.deps.NC.Subscribe(c.names.Request(m.Name), func(*nats.Msg) { r.kickNow() })
		if err != nil {
			log.Error("seat group not multiplexed: subscribing to requests", "app", m.Name, "err", err)
			return
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	for _, m := range r.members {
		if prev, ok := c.readBucket(ctx, m.cfg.Name); ok && prev.Seat != nil {
			m.swaps = prev.Seat.SwapsIn
			m.lastSwap, _ = strconv.ParseFloat(prev.Seat.LastSwapSeconds, 64)
		}
	}
	if sts, err := c.stsLister.StatefulSets(c.deps.Namespace).Get(g.StatefulSet); err == nil {
		r.written = ParseSeatServing(sts.Annotations[SeatServingAnnotation])
	}
	log.Info("seat group: multiplexing", "statefulSet", g.StatefulSet, "replicas", len(r.pods), "activeSeats", g.ActiveSeats, "apps", len(g.Members))
	var wg sync.WaitGroup
	wg.Go(func() { r.statusLoop(ctx) })
	wg.Go(func() { r.reportLoop(ctx) })
	r.run(ctx)
	wg.Wait()
}

func (r *seatGroupRun) kickNow() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run steps the pods' executors one after the other until ctx ends.
func (r *seatGroupRun) run(ctx context.Context) {
	t := time.NewTicker(r.c.cfg.Tick.Duration)
	defer t.Stop()
	for {
		for _, p := range r.pods {
			if err := p.exec.Step(ctx); err != nil && ctx.Err() == nil {
				r.c.log.Warn("seat group step failed; deciding again", "seatGroup", r.g.Name, "pod", p.name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
	}
}

// seatGroupReplicasMatch waits for the group's StatefulSet and reports
// whether it runs the replicas the configuration names; it refuses (an
// event and an error in the log) a group with another count, which the
// chart did not write.
func (c *Controller) seatGroupReplicasMatch(ctx context.Context, g SeatGroup) bool {
	t := time.NewTicker(c.cfg.Tick.Duration)
	defer t.Stop()
	want := max(g.Replicas, 1)
	for {
		sts, err := c.stsLister.StatefulSets(c.deps.Namespace).Get(g.StatefulSet)
		if err == nil {
			got := int32(1)
			if sts.Spec.Replicas != nil {
				got = *sts.Spec.Replicas
			}
			if got != want {
				msg := fmt.Sprintf("seat group %s runs %d replicas, and the lifecycle was configured for %d: set spec.seatGroups.%s.replicas, the one owner of the count (the lifecycle does not scale a seat group)", g.Name, got, want, g.Name)
				c.log.Error("seat group not multiplexed", "seatGroup", g.Name, "err", msg)
				if c.rec != nil {
					c.rec.Eventf(&corev1.ObjectReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: g.StatefulSet, Namespace: c.deps.Namespace},
						corev1.EventTypeWarning, EventSeatGroupRefused, "%s", msg)
				}
				return false
			}
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// seatDispatcher is the members' JetStream consumers: their demand and
// their gates. Only the group's goroutine calls it.
type seatDispatcher struct {
	r   *seatGroupRun
	ctx context.Context
	// stream is the orchestra's stream, looked up once (oldestQueued).
	stream jetstream.Stream
}

// Demand reads the member's consumer: queued (pending), in flight (taken
// by a dispatcher and not acknowledged, which counts requests a
// dispatcher holds for a free slot) and the age of the oldest queued
// request. A consumer that cannot be read counts one request in flight,
// so that nothing is put to sleep on a guess.
func (d *seatDispatcher) Demand(app string) seatgroup.Demand {
	m := d.r.members[app]
	c := d.r.c
	now := c.now()
	r := c.readConsumer(d.ctx, app)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !r.OK {
		m.demand = seatgroup.Demand{InFlight: 1, LastUse: m.use.lastUse}
		return m.demand
	}
	if m.st.gate == GateClosed && !r.Paused {
		// A dispatcher provisioned the consumer again, which resets its
		// pause: the next Hold closes it again, and until then what it
		// hands out counts.
		m.st.gateReset()
		m.holdFailed = true
	}
	dm := seatgroup.Demand{InFlight: int(r.InFlight), Queued: int(r.Queued)}
	if m.holdFailed {
		dm.InFlight++
	}
	m.use.update(now, r)
	dm.LastUse = m.use.lastUse
	if dm.Queued > 0 {
		dm.OldestWait = now.Sub(m.use.pendingSince)
		ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
		if stored, ok := d.oldestQueued(ctx, app, r.Delivered); ok && stored.Before(now) {
			dm.OldestWait = now.Sub(stored)
		}
		cancel()
	}
	m.demand = dm
	return dm
}

// oldestQueued returns when the member's first request not yet delivered
// was stored.
func (d *seatDispatcher) oldestQueued(ctx context.Context, app string, delivered uint64) (time.Time, bool) {
	c := d.r.c
	if d.stream == nil {
		s, err := c.js.Stream(ctx, c.names.Stream())
		if err != nil {
			return time.Time{}, false
		}
		d.stream = s
	}
	msg, err := d.stream.GetMsg(ctx, delivered+1, jetstream.WithGetMsgSubject(c.names.Request(app)))
	if err != nil {
		return time.Time{}, false
	}
	return msg.Time, true
}

// Hold pauses the member's consumer (closeGate), unless it knows it
// paused.
func (d *seatDispatcher) Hold(app string) { d.setGate(app, GateClosed, d.r.c.closeGate) }

// Release resumes the member's consumer (openGate), unless it knows it
// open.
func (d *seatDispatcher) Release(app string) { d.setGate(app, GateOpen, d.r.c.openGate) }

// setGate brings the member's gate to want (closed or open) with
// apply, unless it knows the gate is there. After a failure the gate is
// unknown and the next step tries again; a failed hold is remembered
// (holdFailed), so that the member counts as busy until one succeeds.
func (d *seatDispatcher) setGate(app string, want Gate, apply func(context.Context, *appState) error) {
	m := d.r.members[app]
	m.mu.Lock()
	there := m.st.gate == want
	m.mu.Unlock()
	if there {
		return
	}
	err := apply(d.ctx, m.st)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if want == GateClosed {
			m.holdFailed = true
		}
		d.r.c.log.Warn("seat group: setting the gate; retrying", "seatGroup", d.r.g.Name, "app", app, "gate", want, "err", err)
		return
	}
	m.holdFailed = false
}

// onEvent counts swaps for the status and records what a successful wake,
// sleep or restart did to the pod's seat, so that the status written at
// once after it does not show the reading taken before it (from the
// group's goroutine).
func (r *seatGroupRun) onEvent(p *seatPodRun, ev seatgroup.Event) {
	if ev.Err != "" {
		return
	}
	m := r.members[ev.App]
	seat := p.sidecars[ev.App]
	st, _ := seat.reading()
	switch ev.Kind {
	case seatgroup.ActionWake:
		m.mu.Lock()
		m.swaps++
		if ev.SwapSeconds > 0 {
			m.lastSwap = ev.SwapSeconds
		} else {
			m.lastSwap = ev.End.Sub(ev.Start).Seconds()
		}
		m.mu.Unlock()
		st.State, st.Since = sidecarapi.Awake, ev.End
	case seatgroup.ActionSleep, seatgroup.ActionRestart:
		st.State, st.Since = sidecarapi.Asleep, ev.End
	default:
		return
	}
	seat.setReading(st, true)
	r.reportSwap(p, m, ev, st)
	select {
	case r.statusKick <- struct{}{}:
	default:
	}
}

// reportSwap queues a successful wake, sleep or restart of a member's
// engine for the node agent on the pod's node (POST /wakes, POST /sleeps,
// as the leader reports an application's), from which the agent predicts
// the member's next wake and promotes its weights ahead of it. The
// executor's goroutine only queues: reportLoop posts, so that an agent
// that is slow or gone never holds up a swap. st is the sidecar's reading
// after the action (a wake's: the sidecar's answer, with what it restored).
//
// The agent holds the engines of an artifact awake while its last wake
// came after its last sleep. The times are the actions' starts, so a wake
// that follows a sleep (a member swapped out and back in) is always the
// later; and a sleep in one pod is not reported while another pod on the
// same node still holds the member awake.
func (r *seatGroupRun) reportSwap(p *seatPodRun, m *seatMember, ev seatgroup.Event, st sidecarapi.Status) {
	sleep := m.st.Sleep
	if sleep == nil {
		return
	}
	pod, err := p.sidecars[ev.App].pod()
	if err != nil {
		return
	}
	key := nodeapi.Key{Namespace: r.c.deps.Namespace, Name: sleep.ModelCheckpoint}
	rep := swapReport{m: m, pod: pod}
	if ev.Kind == seatgroup.ActionWake {
		rec := sleep.wakeRecord(key, ev.Start)
		rec.Digest = st.Digest
		if w := st.LastWake; w != nil && w.Transfer != nil && w.Error == "" {
			rec.Tier, rec.Bytes = nodeapi.Tier(strings.ToLower(w.Transfer.Tier)), w.Transfer.Bytes
			if w.Seconds > 0 {
				rec.BytesPerSecond = float64(w.Transfer.Bytes) / w.Seconds
			}
		}
		rep.kind, rep.rec = reportWake, rec
	} else {
		if r.awakeOnNode(p, ev.App, pod.Spec.NodeName) {
			return
		}
		// A restarted engine holds nothing: its next wake loads the
		// weights, as after a sleep at level 2.
		level := int(m.cfg.SleepLevel)
		if ev.Kind == seatgroup.ActionRestart {
			level = 2
		}
		rep.kind, rep.rec = reportSleep, nodeapi.SleepRecord{Key: key, Time: ev.Start, Level: level}
	}
	select {
	case r.reports <- rep:
	default:
		r.c.sm.agentReports.WithLabelValues(ev.App, rep.kind, "failed").Inc()
		r.c.log.Info("reporting the "+rep.kind+" to the node agent: too many reports waiting; dropped", "seatGroup", r.g.Name, "app", ev.App, "pod", pod.Name)
	}
}

// awakeOnNode reports whether a pod of the group other than p, on node,
// holds app's engine awake (its last reading).
func (r *seatGroupRun) awakeOnNode(p *seatPodRun, app, node string) bool {
	for _, q := range r.pods {
		if q == p {
			continue
		}
		pod, err := q.sidecars[app].pod()
		if err != nil || pod.Spec.NodeName != node {
			continue
		}
		if st, ok := q.sidecars[app].reading(); ok && seatHolds(st.State) {
			return true
		}
	}
	return false
}

// reportLoop posts the queued swap reports to the node agents, in order,
// until ctx ends (tellAgents: a failure is logged and counted).
func (r *seatGroupRun) reportLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case rep := <-r.reports:
			r.c.tellAgents(ctx, rep.m.st, []sidecarRef{{pod: rep.pod}}, rep.kind, rep.rec)
		}
	}
}

// statusLoop publishes each member's lifecycle status (the bucket and the
// group StatefulSet's SeatAnnotationStatus annotation), at once when its
// seat changes or it starts or stops waiting for one, and its waiting
// time otherwise at most once a minute.
func (r *seatGroupRun) statusLoop(ctx context.Context) {
	t := time.NewTicker(r.c.cfg.Tick.Duration)
	defer t.Stop()
	for {
		for _, m := range r.members {
			force := r.memberStatus(m)
			if err := r.c.persist(ctx, m.st, force); err != nil && ctx.Err() == nil {
				r.c.log.Warn("seat group: publishing status; retrying", "seatGroup", r.g.Name, "app", m.cfg.Name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.statusKick:
		}
	}
}

// seatHolds reports whether a seat in state s holds its sidecar.
func seatHolds(s sidecarapi.State) bool {
	return s == sidecarapi.Awake || s == sidecarapi.Waking || s == sidecarapi.Draining || s == sidecarapi.FallingAsleep
}

// groupSeatState is an application's state across the pods of its group,
// from the sidecars' readings (ok false: not read): Awake when one pod has it
// awake, else Waking, else Draining, else Asleep once every pod was read
// and has it asleep; "" when that cannot be told.
func groupSeatState(readings []sidecarapi.Status, ok []bool) v1alpha1.LifecycleState {
	rank := map[sidecarapi.State]v1alpha1.LifecycleState{
		sidecarapi.Awake: v1alpha1.LifecycleAwake, sidecarapi.Waking: v1alpha1.LifecycleWaking,
		sidecarapi.Draining: v1alpha1.LifecycleDraining, sidecarapi.FallingAsleep: v1alpha1.LifecycleDraining,
	}
	for _, want := range []v1alpha1.LifecycleState{v1alpha1.LifecycleAwake, v1alpha1.LifecycleWaking, v1alpha1.LifecycleDraining} {
		for i, st := range readings {
			if ok[i] && rank[st.State] == want {
				return want
			}
		}
	}
	if len(readings) == 0 {
		return ""
	}
	for i, st := range readings {
		if !ok[i] || st.State != sidecarapi.Asleep {
			return ""
		}
	}
	return v1alpha1.LifecycleAsleep
}

// memberStatus fills m's status from the last readings; it reports
// whether anything but the waiting time changed.
func (r *seatGroupRun) memberStatus(m *seatMember) bool {
	m.mu.Lock()
	dm, swaps, lastSwap := m.demand, m.swaps, m.lastSwap
	m.mu.Unlock()
	var readings []sidecarapi.Status
	var oks []bool
	var holding []string
	for _, p := range r.pods {
		st, ok := p.sidecars[m.cfg.Name].reading()
		readings, oks = append(readings, st), append(oks, ok)
		if ok && seatHolds(st.State) {
			holding = append(holding, p.name)
		}
	}
	st := &m.st.status
	before := *st
	var prevSeat v1alpha1.SeatStatus
	if st.Seat != nil {
		prevSeat = *st.Seat
	}
	now := r.c.now()
	if state := groupSeatState(readings, oks); state != "" && st.State != state {
		st.State, st.Since = state, &metav1.Time{Time: now}
	}
	st.Replicas = int32(len(r.pods))
	st.ResidentTier = ""
	switch st.State {
	case v1alpha1.LifecycleAwake, v1alpha1.LifecycleDraining:
		st.ResidentTier = v1alpha1.TierAccelerator
	case v1alpha1.LifecycleAsleep:
		if m.cfg.SleepLevel <= 1 {
			st.ResidentTier = v1alpha1.TierHot
		}
	}
	if !dm.LastUse.IsZero() {
		st.LastActiveTime = &metav1.Time{Time: dm.LastUse}
	}
	s := v1alpha1.SeatStatus{Holding: len(holding) > 0, Pods: holding, SwapsIn: swaps}
	if lastSwap > 0 {
		s.LastSwapSeconds = strconv.FormatFloat(lastSwap, 'f', 3, 64)
	}
	if dm.Queued > 0 && !s.Holding {
		s.WaitingSeconds = strconv.FormatFloat(dm.OldestWait.Seconds(), 'f', 1, 64)
	}
	st.Seat = &s
	// The wait's seconds alone do not force a write; its start and end do.
	cmpPrev, cmpNow := prevSeat, s
	cmpPrev.WaitingSeconds, cmpNow.WaitingSeconds = "", ""
	waitChanged := (prevSeat.WaitingSeconds == "") != (s.WaitingSeconds == "")
	return before.State != st.State || before.ResidentTier != st.ResidentTier || !equality.Semantic.DeepEqual(cmpPrev, cmpNow) || waitChanged
}
