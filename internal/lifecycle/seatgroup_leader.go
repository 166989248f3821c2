package lifecycle

// Seat groups. The applications of a seat group share one accelerator in
// each of the group's pods (StatefulSet "<release>-seat-<group>", replicas
// pods, one engine and one sidecar per application in each); in each
// pod, activeSeats of them are awake at once. The leader runs one
// seatgroup.Executor per pod: it reads the pod's sidecars (podSidecar,
// through the leader's one sidecar driver, sidecars.go), the demand the
// queue shows for each application (the one reader of its consumer,
// readConsumer), decides with seatgroup.Decide, and applies the plan
// through the pod's sidecars (POST /sleep, POST /wake) and its one
// Dispatcher adapter (podDispatcher), which owns two gates
// (seatserving.go): the pods serving each application
// (SeatServingAnnotation, which the dispatchers follow), and the
// application's JetStream consumer (its consumerGate, gate.go), paused on
// the server while no pod serves the application or one drains it, and
// resumed otherwise. An engine is put to sleep only after its pod stopped
// serving it, the consumer paused, and the consumer counts nothing in
// flight (a request a dispatcher took, or holds for a free slot, counts
// until it is acknowledged).
//
// The executors of a group step one after the other on the group's one
// goroutine, so that each pod decides on what the others did: a pod sees
// an application's queue only while no other pod serves it, or once its
// oldest request waited maxSwapWait (seatPodDemand). After each pod's step
// the members' statuses are written once (writeStatus, seatgroup_status.go).

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// EventSeatGroupRefused is recorded on a seat group's StatefulSet that the
// leader cannot multiplex.
const EventSeatGroupRefused = "SeatGroupRefused"

// seatGroupRun is one group on the leader.
type seatGroupRun struct {
	c *Controller
	// ctx is the group's, until leadership ends.
	ctx     context.Context
	g       SeatGroup
	members map[string]*seatMember
	pods    []*seatPodRun
	// kick makes the group step at once (a request arrived).
	kick chan struct{}
	// written is the SeatServingAnnotation last written.
	written SeatServing
	// stream is the orchestra's stream, looked up once (oldestQueued).
	stream jetstream.Stream
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
// and its gate for each application.
type seatPodRun struct {
	r        *seatGroupRun
	name     string
	exec     *seatgroup.Executor
	sidecars map[string]*podSidecar
	gates    map[string]Gate
	// maxSwapWait is its executor's (seatPodDemand).
	maxSwapWait time.Duration
}

// seatMember is one application of a group on the leader. Everything in
// it is the group goroutine's.
type seatMember struct {
	cfg   SeatMember
	sleep *SleepConfig // resolved (SeatMember.sleep)
	// statusRecord is its status, published under its name on the group's
	// StatefulSet; consumerGate its consumer's gate (gate.go).
	statusRecord
	consumerGate
	demand   seatgroup.Demand // the last reading
	use      usage
	swaps    int64
	lastSwap float64
	// copying is its copy placement under way (placeCopiesOf).
	copying chan struct{}
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
	r := &seatGroupRun{c: c, ctx: ctx, g: g, members: map[string]*seatMember{}, kick: make(chan struct{}, 1),
		reports: make(chan swapReport, maxQueuedReports)}
	for _, m := range g.Members {
		r.members[m.Name] = &seatMember{cfg: m, sleep: m.sleep(), consumerGate: consumerGate{app: m.Name},
			statusRecord: statusRecord{app: m.Name, set: g.StatefulSet, annotation: v1alpha1.LifecycleStatusAnnotation(m.Name, true)}}
	}
	for i := range max(g.Replicas, 1) {
		cfg := seatgroup.Default(g.Name)
		p := &seatPodRun{r: r, name: fmt.Sprintf("%s-%d", g.StatefulSet, i), sidecars: map[string]*podSidecar{}, gates: map[string]Gate{},
			maxSwapWait: cfg.MaxSwapWait}
		if g.Replicas > 1 {
			// The executors of a group's pods share the registry's
			// collectors: each pod has its own series.
			cfg.Name = fmt.Sprintf("%s/%d", g.Name, i)
		}
		cfg.ActiveSeats = int(g.ActiveSeats)
		cfg.Tick = c.cfg.Tick.Duration
		var members []seatgroup.Member
		for _, m := range g.Members {
			sc := &podSidecar{p: p, app: m.Name, port: m.SidecarPort}
			p.sidecars[m.Name] = sc
			members = append(members, seatgroup.Member{
				Name: m.Name, Priority: m.Priority, SleepLevel: int(m.SleepLevel), MinResidency: m.MinResidency.Duration,
				SleepAfter: m.SleepAfter.Duration,
				// The memory reading and the restart go through the
				// sidecar: the residentBytes its GET /state reports (the
				// simulator; an engine that reports none is trusted to
				// have slept), and POST /restart, which restarts the
				// engine in place (the simulator run with --restartable;
				// other engines refuse).
				Sidecar: sc, Memory: sc, Restarter: sc,
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

// run steps the pods' executors one after the other until ctx ends, and
// writes the members' statuses once after each pod's step.
func (r *seatGroupRun) run(ctx context.Context) {
	t := time.NewTicker(r.c.cfg.Tick.Duration)
	defer t.Stop()
	for {
		for _, p := range r.pods {
			if err := p.exec.Step(ctx); err != nil && ctx.Err() == nil {
				r.c.log.Warn("seat group step failed; deciding again", "seatGroup", r.g.Name, "pod", p.name, "err", err)
			}
			r.writeStatus(ctx)
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

// onEvent counts swaps for the status and records what a successful wake,
// sleep or restart did to the member's sidecar in the pod, so that the status written
// after the step does not show the reading taken before it (from the
// group's goroutine).
func (r *seatGroupRun) onEvent(p *seatPodRun, ev seatgroup.Event) {
	if ev.Err != "" {
		return
	}
	m := r.members[ev.App]
	sc := p.sidecars[ev.App]
	st, _ := sc.reading()
	switch ev.Kind {
	case seatgroup.ActionWake:
		m.swaps++
		if ev.SwapSeconds > 0 {
			m.lastSwap = ev.SwapSeconds
		} else {
			m.lastSwap = ev.End.Sub(ev.Start).Seconds()
		}
		st.State, st.Since = sidecarapi.Awake, ev.End
	case seatgroup.ActionSleep, seatgroup.ActionRestart:
		st.State, st.Since = sidecarapi.Asleep, ev.End
	default:
		return
	}
	sc.setReading(st, true)
	r.reportSwap(p, m, ev, st)
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
	sleep := m.sleep
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
			rec.Tier, rec.Bytes = w.Transfer.Tier, w.Transfer.Bytes
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
		// An engine that loads copies of its model finds a copy on the
		// node at its next wake, placed as an application's are.
		r.c.placeCopiesOf(r.ctx, copyPlacement{app: ev.App, sleep: sleep, running: &m.copying, done: r.kickNow},
			[]sidecarRef{sidecarOf(pod, p.sidecars[ev.App].port)})
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
		if st, ok := q.sidecars[app].reading(); ok && holdsAccelerator(st.State) {
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
			r.c.tellAgents(ctx, rep.m.cfg.Name, rep.m.sleep, []sidecarRef{{pod: rep.pod}}, rep.kind, rep.rec)
		}
	}
}
