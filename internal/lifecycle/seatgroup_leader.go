package lifecycle

// Seat groups. The applications of a seat group share one accelerator in
// the group's pod (StatefulSet "<release>-seat-<group>", one engine and one
// seat agent per application); activeSeats of them are awake at once. The
// leader runs one seatgroup.Executor per group: it reads each seat
// (GET /state on the group pod's IP at the application's seat port), the
// demand the queue shows for each application (its consumer's queued and
// in-flight counts), decides with seatgroup.Decide, and applies the plan
// through the seats (POST /sleep, POST /wake) and the gate: the
// application's JetStream consumer, paused on the server (closeGate) while
// its engine does not hold a seat and resumed (openGate) once it is awake.
// The executor puts an engine to sleep only after the gate closed and the
// consumer counts nothing in flight (a request a dispatcher took, or holds
// for a free slot, counts until it is acknowledged).
//
// The leader drives pod 0 of the group's StatefulSet and refuses a group
// with more replicas: the gate is per application, not per pod.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/seatgroup"
)

// EventSeatGroupRefused is recorded on a seat group's StatefulSet that the
// leader cannot multiplex.
const EventSeatGroupRefused = "SeatGroupRefused"

// seatGroupRun is one group on the leader.
type seatGroupRun struct {
	c       *Controller
	g       SeatGroup
	members map[string]*seatMember
	exec    *seatgroup.Executor
	// statusKick asks the status loop to write at once (a swap).
	statusKick chan struct{}
}

// seatMember is one application of a group on the leader.
type seatMember struct {
	cfg SeatMember
	// st carries the name and gate of the application for closeGate and
	// openGate, and its status for persist. Its gate fields are the
	// executor goroutine's; its status fields the status loop's.
	st *appState

	mu sync.Mutex
	// gate as last set: "" unknown, "open", "closed".
	gate string
	// holdFailed: a Hold did not get its answer from the server, so a
	// request may still be handed out; Demand counts one in flight.
	holdFailed   bool
	seat         checkpoint.SeatStatus // the last reading
	seatOK       bool
	demand       seatgroup.Demand // the last reading
	delivered    uint64
	lastUse      time.Time
	pendingSince time.Time
	swaps        int64
	lastSwap     float64
}

// runSeatGroups runs one executor per seat group until ctx ends.
func (c *Controller) runSeatGroups(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range c.cfg.SeatGroups {
		wg.Go(func() { c.runSeatGroup(ctx, g) })
	}
	wg.Wait()
}

func (c *Controller) runSeatGroup(ctx context.Context, g SeatGroup) {
	log := c.log.With("seatGroup", g.Name)
	if !c.seatGroupOnOnePod(ctx, g) {
		return
	}
	r := &seatGroupRun{c: c, g: g, members: map[string]*seatMember{}, statusKick: make(chan struct{}, 1)}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	cfg := seatgroup.Default(g.Name)
	cfg.ActiveSeats = int(g.ActiveSeats)
	cfg.Tick = c.cfg.Tick.Duration
	var members []seatgroup.Member
	for _, m := range g.Members {
		st := newAppState(App{Name: m.Name, RootStatefulSet: g.StatefulSet})
		st.annotation = SeatAnnotationStatus(m.Name)
		sm := &seatMember{cfg: m, st: st}
		r.members[m.Name] = sm
		seat := &podSeat{c: c, sts: g.StatefulSet, port: m.SeatPort, client: client, m: sm}
		members = append(members, seatgroup.Member{
			Name: m.Name, Priority: m.Priority, SleepLevel: int(m.SleepLevel), MinResidency: m.MinResidency.Duration,
			SleepAfter: m.SleepAfter.Duration,
			// The memory reading and the restart go through the seat agent:
			// the residentBytes its GET /state reports (the simulator; an
			// engine that reports none is trusted to have slept), and
			// POST /restart, which restarts the engine in place (the
			// simulator run with --restartable; other engines refuse).
			Seat: seat, Memory: seat, Restarter: seat,
		})
	}
	exec, err := seatgroup.NewExecutor(cfg, members, &seatDispatcher{r: r, ctx: ctx}, c.deps.Registry, c.log, seatgroup.WithEvents(r.onEvent))
	if err != nil {
		log.Error("seat group not multiplexed", "err", err)
		return
	}
	r.exec = exec
	// A request published for a member kicks the executor at once.
	for _, m := range g.Members {
		sub, err := c.deps.NC.Subscribe(c.names.Request(m.Name), func(*nats.Msg) { exec.Kick() })
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
	log.Info("seat group: multiplexing", "statefulSet", g.StatefulSet, "activeSeats", cfg.ActiveSeats, "apps", len(members))
	var wg sync.WaitGroup
	wg.Go(func() { r.statusLoop(ctx) })
	exec.Run(ctx)
	wg.Wait()
}

// seatGroupOnOnePod waits for the group's StatefulSet and reports whether
// it runs one replica; it refuses (an event and an error in the log) a
// group with more.
func (c *Controller) seatGroupOnOnePod(ctx context.Context, g SeatGroup) bool {
	t := time.NewTicker(c.cfg.Tick.Duration)
	defer t.Stop()
	for {
		sts, err := c.stsLister.StatefulSets(c.deps.Namespace).Get(g.StatefulSet)
		if err == nil {
			if sts.Spec.Replicas != nil && *sts.Spec.Replicas > 1 {
				msg := fmt.Sprintf("seat group %s runs %d replicas; the lifecycle multiplexes a group on one pod only (every application's gate is shared by its replicas): set the applications' lifecycle.maxReplicas to 1", g.Name, *sts.Spec.Replicas)
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

// podSeat is a member's seat agent in the group's pod 0, found by the
// pod's current IP.
type podSeat struct {
	c      *Controller
	sts    string
	port   int32
	client *http.Client
	m      *seatMember
}

func (s *podSeat) http() (seatgroup.HTTPSeat, error) {
	name := s.sts + "-0"
	pod, err := s.c.podLister.Pods(s.c.deps.Namespace).Get(name)
	if err != nil {
		return seatgroup.HTTPSeat{}, fmt.Errorf("the group's pod %s: %w", name, err)
	}
	if pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
		return seatgroup.HTTPSeat{}, fmt.Errorf("the group's pod %s has no address", name)
	}
	return seatgroup.HTTPSeat{URL: fmt.Sprintf("http://%s:%d", pod.Status.PodIP, s.port), Client: s.client}, nil
}

// State implements seatgroup.Seat; it keeps the reading for the status.
func (s *podSeat) State(ctx context.Context) (checkpoint.SeatStatus, error) {
	h, err := s.http()
	var st checkpoint.SeatStatus
	if err == nil {
		st, err = h.State(ctx)
	}
	s.m.mu.Lock()
	s.m.seat, s.m.seatOK = st, err == nil
	s.m.mu.Unlock()
	return st, err
}

// Sleep implements seatgroup.Seat.
func (s *podSeat) Sleep(ctx context.Context, level int) error {
	h, err := s.http()
	if err != nil {
		return err
	}
	return h.Sleep(ctx, level)
}

// ReadMemory implements seatgroup.MemoryReader.
func (s *podSeat) ReadMemory(ctx context.Context) (seatgroup.MemoryReading, error) {
	st, err := s.State(ctx)
	if err != nil {
		return seatgroup.MemoryReading{}, err
	}
	return seatgroup.ReadingOf(st)
}

// Restart implements seatgroup.Restarter.
func (s *podSeat) Restart(ctx context.Context) error {
	h, err := s.http()
	if err != nil {
		return err
	}
	return h.Restart(ctx)
}

// Wake implements seatgroup.Seat.
func (s *podSeat) Wake(ctx context.Context) error {
	h, err := s.http()
	if err != nil {
		return err
	}
	return h.Wake(ctx)
}

// seatDispatcher implements seatgroup.Dispatcher over the members'
// JetStream consumers. Only the executor's goroutine calls it.
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
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	defer cancel()
	cons, err := c.js.Consumer(ctx, c.names.Stream(), c.names.Consumer(app))
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.demand = seatgroup.Demand{InFlight: 1, LastUse: m.lastUse}
		return m.demand
	}
	ci := cons.CachedInfo()
	if m.gate == "closed" && !ci.Paused {
		// A dispatcher provisioned the consumer again, which resets its
		// pause: the next Hold closes it again, and until then what it
		// hands out counts.
		m.gate, m.holdFailed = "", true
	}
	dm := seatgroup.Demand{InFlight: ci.NumAckPending, Queued: int(ci.NumPending)}
	if m.holdFailed {
		dm.InFlight++
	}
	if ci.NumAckPending > 0 || ci.Delivered.Stream != m.delivered {
		m.lastUse = now
	}
	m.delivered = ci.Delivered.Stream
	dm.LastUse = m.lastUse
	if dm.Queued > 0 {
		if m.pendingSince.IsZero() {
			m.pendingSince = now
		}
		dm.OldestWait = now.Sub(m.pendingSince)
		if stored, ok := d.oldestQueued(ctx, app, ci.Delivered.Stream); ok && stored.Before(now) {
			dm.OldestWait = now.Sub(stored)
		}
	} else {
		m.pendingSince = time.Time{}
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

// Hold implements seatgroup.Dispatcher: it pauses the member's consumer
// (closeGate), unless it knows it paused.
func (d *seatDispatcher) Hold(app string) { d.setGate(app, "closed", d.r.c.closeGate) }

// Release implements seatgroup.Dispatcher: it resumes the member's
// consumer (openGate), unless it knows it open.
func (d *seatDispatcher) Release(app string) { d.setGate(app, "open", d.r.c.openGate) }

// setGate brings the member's gate to want ("closed" or "open") with
// apply, unless it knows the gate is there. After a failure the gate is
// unknown and the next step tries again; a failed hold is remembered
// (holdFailed), so that the member counts as busy until one succeeds.
func (d *seatDispatcher) setGate(app, want string, apply func(context.Context, *appState) error) {
	m := d.r.members[app]
	m.mu.Lock()
	there := m.gate == want
	m.mu.Unlock()
	if there {
		return
	}
	err := apply(d.ctx, m.st)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.gate = ""
		if want == "closed" {
			m.holdFailed = true
		}
		d.r.c.log.Warn("seat group: setting the gate; retrying", "seatGroup", d.r.g.Name, "app", app, "gate", want, "err", err)
		return
	}
	m.gate, m.holdFailed = want, false
}

// onEvent counts swaps for the status and records what a successful wake,
// sleep or restart did to the seat, so that the status written at once
// after it does not show the reading taken before it (from the executor's
// goroutine).
func (r *seatGroupRun) onEvent(ev seatgroup.Event) {
	if ev.Err != "" {
		return
	}
	m := r.members[ev.App]
	m.mu.Lock()
	switch ev.Kind {
	case seatgroup.ActionWake:
		m.swaps++
		if ev.SwapSeconds > 0 {
			m.lastSwap = ev.SwapSeconds
		} else {
			m.lastSwap = ev.End.Sub(ev.Start).Seconds()
		}
		m.seat.State, m.seat.Since, m.seatOK = checkpoint.SeatAwake, ev.End, true
	case seatgroup.ActionSleep, seatgroup.ActionRestart:
		m.seat.State, m.seat.Since, m.seatOK = checkpoint.SeatAsleep, ev.End, true
	default:
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	select {
	case r.statusKick <- struct{}{}:
	default:
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

// memberStatus fills m's status from the last readings; it reports
// whether anything but the waiting time changed.
func (r *seatGroupRun) memberStatus(m *seatMember) bool {
	m.mu.Lock()
	seat, seatOK, dm, swaps, lastSwap := m.seat, m.seatOK, m.demand, m.swaps, m.lastSwap
	m.mu.Unlock()
	st := &m.st.status
	before := *st
	var prevSeat v1alpha1.SeatStatus
	if st.Seat != nil {
		prevSeat = *st.Seat
	}
	now := r.c.now()
	state := v1alpha1.LifecycleState("")
	switch {
	case !seatOK:
	case seat.State == checkpoint.SeatAwake:
		state = v1alpha1.LifecycleAwake
	case seat.State == checkpoint.SeatAsleep:
		state = v1alpha1.LifecycleAsleep
	case seat.State == checkpoint.SeatWaking:
		state = v1alpha1.LifecycleWaking
	case seat.State == checkpoint.SeatDraining || seat.State == checkpoint.SeatFallingAsleep:
		state = v1alpha1.LifecycleDraining
	}
	if state != "" && st.State != state {
		st.State, st.Since = state, &metav1.Time{Time: now}
	}
	st.Replicas = 1
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
	s := v1alpha1.SeatStatus{
		Holding: seatOK && (seat.State == checkpoint.SeatAwake || seat.State == checkpoint.SeatWaking ||
			seat.State == checkpoint.SeatDraining || seat.State == checkpoint.SeatFallingAsleep),
		SwapsIn: swaps,
	}
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
	return before.State != st.State || before.ResidentTier != st.ResidentTier || cmpPrev != cmpNow || waitChanged
}
