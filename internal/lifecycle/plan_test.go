package lifecycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// TestActiveLoad: what keeps an application awake and sizes it, and what
// counts as use between two readings (usage.update).
func TestActiveLoad(t *testing.T) {
	for _, tc := range []struct {
		name       string
		r          consumerReading
		load       uint64
		busy, used bool
	}{
		{"nothing", consumerReading{OK: true}, 0, false, false},
		{"queued and in flight", consumerReading{OK: true, Queued: 2, InFlight: 1}, 3, true, true},
		{"an idle lease: no load, still in flight for a drain", consumerReading{OK: true, InFlight: 1, Leases: 1}, 0, true, false},
		{"a busy lease", consumerReading{OK: true, InFlight: 1, Leases: 1, Direct: directUse{Busy: 1}}, 1, true, true},
		{"two leases, one busy", consumerReading{OK: true, InFlight: 3, Leases: 2, Direct: directUse{Busy: 1}}, 2, true, true},
		{"blind: every held lease is busy", consumerReading{OK: true, InFlight: 2, Leases: 2, Direct: directUse{Blind: true}}, 2, true, true},
		{"a report since the last reading is use", consumerReading{OK: true, InFlight: 1, Leases: 1, Direct: directUse{Received: 1}}, 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.ActiveLoad(); got != tc.load {
				t.Errorf("ActiveLoad() = %d, want %d", got, tc.load)
			}
			if got := tc.r.Busy(); got != tc.busy {
				t.Errorf("Busy() = %v, want %v", got, tc.busy)
			}
			var u usage
			if got := u.update(time.Unix(100, 0), tc.r); got != tc.used {
				t.Errorf("usage.update = %v, want %v", got, tc.used)
			}
		})
	}
}

// TestLeaseUses: the leader's view of the gateways' reports: fresh busy
// reports count, stale ones are forgotten, and it is blind for
// LeaseUseStale after it subscribed.
func TestLeaseUses(t *testing.T) {
	t0 := time.Unix(1000, 0)
	u := leaseUses{since: t0}
	if d := u.of("a", t0.Add(time.Second)); !d.Blind {
		t.Error("not blind a second after subscribing")
	}
	u.record("a", natsqueue.LeaseUse{Instance: "gw-1", Lease: "l1", Busy: true}, t0.Add(4*time.Second))
	u.record("a", natsqueue.LeaseUse{Instance: "gw-2", Lease: "l2", Busy: false}, t0.Add(4*time.Second))
	u.record("b", natsqueue.LeaseUse{Instance: "gw-1", Lease: "l3", Busy: true}, t0.Add(4*time.Second))
	if d := u.of("a", t0.Add(5*time.Second)); d.Blind || d.Busy != 1 || d.Received != 2 {
		t.Errorf("of(a) = %+v; want 1 busy, 2 received, not blind", d)
	}
	u.record("a", natsqueue.LeaseUse{Instance: "gw-1", Lease: "l1", Busy: false}, t0.Add(6*time.Second))
	if d := u.of("a", t0.Add(6*time.Second)); d.Busy != 0 || d.Received != 3 {
		t.Errorf("after the end report: %+v; want none busy", d)
	}
	if d := u.of("b", t0.Add(4*time.Second).Add(natsqueue.LeaseUseStale)); d.Busy != 0 {
		t.Errorf("a report %v old still counts: %+v", natsqueue.LeaseUseStale, d)
	}
}

// TestDecide: every transition of an application's step, from what the
// step observed to what it does.
func TestDecide(t *testing.T) {
	const zeroAfter, sleepAfter = 10 * time.Minute, time.Minute
	read := func(queued, inFlight uint64, paused bool) consumerReading {
		return consumerReading{OK: true, Queued: queued, InFlight: inFlight, Paused: paused}
	}
	obs := func(st v1alpha1.LifecycleState, mut ...func(*Observation)) Observation {
		o := Observation{State: st, Replicas: 1, App: AppPolicy{MinReplicas: 0, ZeroAfter: zeroAfter}}
		if st == v1alpha1.LifecycleAwake {
			o.Serving, o.RootsConfirmed = 1, true
		}
		if st == v1alpha1.LifecycleZero {
			o.Replicas = 0
		}
		o.Demand = read(0, 0, st != v1alpha1.LifecycleAwake)
		for _, m := range mut {
			m(&o)
		}
		return o
	}
	sleeps := func(o *Observation) {
		tier := v1alpha1.TierAccelerator
		switch o.State {
		case v1alpha1.LifecycleZero:
			tier = v1alpha1.TierCold
		case v1alpha1.LifecycleAsleep:
			tier = v1alpha1.TierHot
		}
		// The simulator's: its level-1 sleep offloads to the hot tier.
		o.Sleep = &SleepPolicy{After: sleepAfter, Level: 1, ResidentTier: tier, Offloads: true}
	}
	sidecars := func(states ...sidecarapi.State) func(*Observation) {
		return func(o *Observation) {
			for i, s := range states {
				o.Sidecars = append(o.Sidecars, SidecarReading{Pod: "root-" + string(rune('0'+i)), State: s})
			}
		}
	}
	act := func(k ActionKind) Action { return Action{Kind: k} }
	wake := func(k ActionKind, trigger string) Action { return Action{Kind: k, Trigger: trigger} }

	for _, tc := range []struct {
		name string
		o    Observation
		want []Action
	}{
		// At zero.
		{"zero: a request seen wakes it without reading the queue",
			obs(v1alpha1.LifecycleZero, func(o *Observation) { o.RequestSeen, o.Demand = true, consumerReading{} }),
			[]Action{wake(ActWake, triggerRequest)}},
		{"zero: demand arrives in the queue", obs(v1alpha1.LifecycleZero, func(o *Observation) { o.Demand = read(3, 0, true) }),
			[]Action{wake(ActWake, triggerRequest)}},
		{"zero: a request handed out as the gate closed", obs(v1alpha1.LifecycleZero, func(o *Observation) { o.Demand = read(0, 1, true) }),
			[]Action{wake(ActWake, triggerRequest)}},
		{"zero: a gate a dispatcher reopened is closed again", obs(v1alpha1.LifecycleZero, func(o *Observation) { o.Demand = read(0, 0, false) }),
			[]Action{act(ActCloseGate), act(ActSyncWorkers)}},
		{"zero: idle, the workers follow", obs(v1alpha1.LifecycleZero), []Action{act(ActSyncWorkers)}},
		{"zero: scaled up by someone else", obs(v1alpha1.LifecycleZero, func(o *Observation) { o.Replicas = 1 }),
			[]Action{act(ActFollowWaking)}},
		{"zero with sleeping engines: the resident tier is the cold one", obs(v1alpha1.LifecycleZero, sleeps, func(o *Observation) { o.Sleep.ResidentTier = v1alpha1.TierHot }),
			[]Action{{Kind: ActSetTier, Tier: v1alpha1.TierCold}, act(ActSyncWorkers)}},

		// Waking: pods start.
		{"waking: a confirmed root serves", obs(v1alpha1.LifecycleWaking, func(o *Observation) { o.Serving, o.RootsConfirmed, o.Demand = 1, true, consumerReading{} }),
			[]Action{act(ActAwake)}},
		{"waking: a serving root the scale to zero deleted is not enough", obs(v1alpha1.LifecycleWaking, func(o *Observation) { o.Serving = 1 }),
			nil},
		{"waking: the pods cannot start", obs(v1alpha1.LifecycleWaking, func(o *Observation) { o.Problem = "pod x cannot be scheduled" }),
			[]Action{{Kind: ActReportProblem, Reason: "pod x cannot be scheduled"}}},
		{"waking: the problem is gone", obs(v1alpha1.LifecycleWaking, func(o *Observation) { o.Message = "pod x cannot be scheduled" }),
			[]Action{{Kind: ActReportProblem}}},
		{"waking: pod lost, scaled to zero behind our back", obs(v1alpha1.LifecycleWaking, func(o *Observation) { o.Replicas = 0 }),
			[]Action{wake(ActWake, triggerRequest)}},
		{"waking: a gate a dispatcher reopened is closed again", obs(v1alpha1.LifecycleWaking, func(o *Observation) { o.Demand = read(2, 0, false) }),
			[]Action{act(ActCloseGate)}},
		// Issue 26: a standalone root whose sidecar reports Asleep at pod
		// start (restarted while the application slept, or an engine that
		// starts asleep) never turns Ready: its engine is woken.
		{"waking: a root's sidecar reports Asleep at pod start", obs(v1alpha1.LifecycleWaking, sleeps, sidecars(sidecarapi.Asleep)),
			[]Action{{Kind: ActWakeSidecars, Pods: []string{"root-0"}}}},
		{"waking: a root's sidecar still starting", obs(v1alpha1.LifecycleWaking, sleeps, sidecars(sidecarapi.Unknown)), nil},

		// Waking: sleeping engines wake through their sidecars.
		{"engine wake: an attempt", obs(v1alpha1.LifecycleWaking, sleeps, func(o *Observation) { o.EngineWake = true }),
			[]Action{act(ActWakeEngines)}},
		{"engine wake: held off after a failed attempt (wake timeout, backoff)",
			obs(v1alpha1.LifecycleWaking, sleeps, func(o *Observation) { o.EngineWake, o.Sleep.WakeHeld = true, true }), nil},

		// Awake.
		{"awake: busy, the backlog sets the replicas", obs(v1alpha1.LifecycleAwake, func(o *Observation) { o.Demand, o.Idle = read(4, 1, false), time.Hour }),
			[]Action{act(ActMarkActive), act(ActScale)}},
		{"awake: used since the last look", obs(v1alpha1.LifecycleAwake, func(o *Observation) { o.Used, o.Idle = true, time.Hour }),
			[]Action{act(ActMarkActive), act(ActScale)}},
		{"awake: idle past zeroAfter drains", obs(v1alpha1.LifecycleAwake, func(o *Observation) { o.Idle = zeroAfter }),
			[]Action{act(ActBeginDrain)}},
		{"awake: minReplicas 1 never drains", obs(v1alpha1.LifecycleAwake, func(o *Observation) { o.Idle, o.App.MinReplicas = 2*zeroAfter, 1 }),
			[]Action{act(ActScale)}},
		{"awake: idle past sleep.after sleeps", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) { o.Idle = sleepAfter }),
			[]Action{act(ActBeginSleep)}},
		// Leases of gateways' direct lanes: in flight on the lease consumer,
		// active only while a fresh report says a request runs on one.
		{"awake: an idle held lease does not hold off the sleep", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) {
			o.Idle, o.Demand.InFlight, o.Demand.Leases = sleepAfter, 1, 1
		}), []Action{act(ActBeginSleep)}},
		{"awake: an idle held lease does not hold off the drain", obs(v1alpha1.LifecycleAwake, func(o *Observation) {
			o.Idle, o.Demand.InFlight, o.Demand.Leases = zeroAfter, 1, 1
		}), []Action{act(ActBeginDrain)}},
		{"awake: a lease a request runs on is active", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) {
			o.Idle, o.Demand.InFlight, o.Demand.Leases, o.Demand.Direct.Busy = sleepAfter, 1, 1, 1
		}), []Action{act(ActMarkActive), act(ActScale)}},
		{"awake: a request on a lease the dispatcher ended at its MaxAge is active", obs(v1alpha1.LifecycleAwake, func(o *Observation) {
			o.Idle, o.Demand.Direct.Busy = zeroAfter, 1
		}), []Action{act(ActMarkActive), act(ActScale)}},
		{"awake: just after the leader started, every held lease is active", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) {
			o.Idle, o.Demand.InFlight, o.Demand.Leases, o.Demand.Direct.Blind = sleepAfter, 1, 1, true
		}), []Action{act(ActMarkActive), act(ActScale)}},
		{"awake: a queued request beside an idle lease is active", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) {
			o.Idle, o.Demand.InFlight, o.Demand.Leases, o.Demand.Queued = sleepAfter, 1, 1, 1
		}), []Action{act(ActMarkActive), act(ActScale)}},
		{"awake: a failed sleep holds off the next", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) { o.Idle, o.Sleep.SleepHeld = sleepAfter, true }),
			[]Action{act(ActScale)}},
		{"awake: scaled to zero by someone else", obs(v1alpha1.LifecycleAwake, func(o *Observation) { o.Replicas = 0 }),
			[]Action{act(ActFollowZero)}},
		{"awake: the queue cannot be read", obs(v1alpha1.LifecycleAwake, func(o *Observation) { o.Demand = consumerReading{} }),
			[]Action{{Kind: ActFail, Reason: "reading the consumer's backlog failed"}}},
		{"awake: a root that restarted with its engine asleep is woken",
			obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) { o.Replicas = 2 }, sidecars(sidecarapi.Awake, sidecarapi.Asleep),
				func(o *Observation) { o.Sidecars[0].Serving = true }),
			[]Action{{Kind: ActWakeSidecars, Pods: []string{"root-1"}}, act(ActScale)}},
		{"awake with sleeping engines: the resident tier is the accelerator", obs(v1alpha1.LifecycleAwake, sleeps, func(o *Observation) { o.Sleep.ResidentTier = v1alpha1.TierHot }),
			[]Action{{Kind: ActSetTier, Tier: v1alpha1.TierAccelerator}, act(ActScale)}},

		// Draining (with requests in flight the drain or sleep is
		// cancelled by the executor, which reads the queue behind the
		// closed gate).
		{"draining to zero", obs(v1alpha1.LifecycleDraining), []Action{act(ActDrain)}},
		{"draining to sleep", obs(v1alpha1.LifecycleDraining, sleeps, func(o *Observation) { o.DrainForSleep = true }), []Action{act(ActSleep)}},

		// Asleep.
		{"asleep: a request seen wakes the engines", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) { o.RequestSeen = true }),
			[]Action{wake(ActBeginEngineWake, triggerRequest)}},
		{"asleep: demand arrives in the queue", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) { o.Demand = read(1, 0, true) }),
			[]Action{wake(ActBeginEngineWake, triggerRequest)}},
		{"asleep: every sidecar asleep, nothing due", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep, sidecarapi.Asleep)), nil},
		{"asleep: the resident tier is due a refresh", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) { o.Sleep.RefreshDue = true }),
			[]Action{act(ActRefreshTier)}},
		{"asleep: a root started awake sleeps like the others", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep, sidecarapi.Awake)),
			[]Action{{Kind: ActSleepSidecars, Pods: []string{"root-1"}, Level: 1}}},
		{"asleep: a failed sidecar's pod is restarted", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Failed, sidecarapi.Asleep)),
			[]Action{{Kind: ActRestartSidecar, Pods: []string{"root-0"}}}},
		{"asleep: parkAfter parks", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor = time.Minute, time.Minute
		}), []Action{act(ActPark)}},
		// Parking (issue 27 §4): the pods go away once no engine keeps an
		// offload of its own in the hot tier; the node agents keep the
		// copies.
		{"asleep: parkAfter with the offload demoted (level 2) scales the pods away", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.Sleep.Offloads = time.Minute, time.Hour, 2, true
		}), []Action{act(ActParkPods)}},
		{"asleep: parkAfter demotes an engine's own offload before the pods go", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Offloads = time.Minute, time.Hour, true
		}), []Action{act(ActPark)}},
		{"asleep: parkAfter, an engine that unloads completely (nothing to demote) is parked at once", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Offloads = time.Minute, time.Minute, false
		}), []Action{act(ActParkPods)}},
		{"asleep: parking does not wait for a sidecar that does not answer", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep, sidecarapi.Unknown), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level = time.Minute, time.Hour, 2
		}), []Action{act(ActParkPods)}},
		{"asleep: parkAfter with minReplicas 1 keeps the pods (demoted already)", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.Sleep.Offloads, o.App.MinReplicas = time.Minute, time.Hour, 2, true, 1
		}), nil},
		{"asleep: parkAfter with minReplicas 1 still demotes the offload", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Offloads, o.App.MinReplicas = time.Minute, time.Hour, true, 1
		}), []Action{act(ActPark)}},
		{"asleep: parkAfter with hot copies of the model file (Ollama) scales away, the hot copy kept", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Offloads, o.Sleep.HotCopies = time.Minute, time.Hour, false, true
		}), []Action{act(ActParkPods)}},
		{"asleep: parkAfter with hot copies and minReplicas 1 demotes the copy to warm", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Offloads, o.Sleep.HotCopies, o.App.MinReplicas = time.Minute, time.Hour, false, true, 1
		}), []Action{act(ActPark)}},
		{"asleep: parkAfter, an engine that unloads without copies and minReplicas 1: nothing to do", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Offloads, o.App.MinReplicas = time.Minute, time.Hour, false, 1
		}), nil},
		{"asleep: not parked before parkAfter", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level = time.Minute, time.Minute-time.Second, 2
		}), nil},
		{"asleep: a failed park holds off the next", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.Sleep.ParkHeld = time.Minute, time.Hour, 2, true
		}), nil},
		{"asleep: a request wins over a due park", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.RequestSeen = time.Minute, time.Hour, 2, true
		}), []Action{wake(ActBeginEngineWake, triggerRequest)}},
		{"asleep: demand in the queue wins over a due park", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.Demand = time.Minute, time.Hour, 2, read(1, 0, true)
		}), []Action{wake(ActBeginEngineWake, triggerRequest)}},
		{"asleep: parking waits for a readable queue", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.Demand = time.Minute, time.Hour, 2, consumerReading{}
		}), []Action{{Kind: ActFail, Reason: "reading the consumer's backlog failed"}}},
		{"asleep: parking wins over zeroAfter due at once (the copies stay)", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor, o.Sleep.Level, o.Idle = time.Minute, time.Hour, 2, zeroAfter
		}), []Action{act(ActParkPods)}},
		{"zero, parked: the resident tier is the copies', read again when due", obs(v1alpha1.LifecycleZero, sleeps, func(o *Observation) {
			o.Parked, o.Sleep.ResidentTier, o.Sleep.RefreshDue = true, v1alpha1.TierWarm, true
		}), []Action{act(ActRefreshParked), act(ActSyncWorkers)}},
		{"zero, parked: nothing due", obs(v1alpha1.LifecycleZero, sleeps, func(o *Observation) {
			o.Parked, o.Sleep.ResidentTier = true, v1alpha1.TierHot
		}), []Action{act(ActSyncWorkers)}},
		{"zero, parked: a request wakes it from zero", obs(v1alpha1.LifecycleZero, sleeps, func(o *Observation) {
			o.Parked, o.Sleep.ResidentTier, o.RequestSeen, o.Demand = true, v1alpha1.TierWarm, true, consumerReading{}
		}), []Action{wake(ActWake, triggerRequest)}},
		{"asleep: not parked while a sidecar does not answer", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep, sidecarapi.Unknown), func(o *Observation) {
			o.Sleep.ParkAfter, o.Sleep.AsleepFor = time.Minute, time.Hour
		}), nil},
		{"asleep: zeroAfter takes the pods away", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) { o.Idle = zeroAfter }),
			[]Action{act(ActZeroFromSleep)}},
		{"asleep: zeroAfter waits for a readable queue", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) { o.Idle, o.Demand = zeroAfter, consumerReading{} }),
			[]Action{{Kind: ActFail, Reason: "reading the consumer's backlog failed"}}},
		{"asleep: scaled to zero by someone else", obs(v1alpha1.LifecycleAsleep, sleeps, func(o *Observation) { o.Replicas = 0 }),
			[]Action{act(ActFollowZero)}},
		{"asleep: a gate a dispatcher reopened is closed again", obs(v1alpha1.LifecycleAsleep, sleeps, sidecars(sidecarapi.Asleep), func(o *Observation) { o.Demand = read(0, 0, false) }),
			[]Action{act(ActCloseGate)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Decide(tc.o)); diff != "" {
				t.Errorf("Decide(%+v) (-want +got):\n%s", tc.o, diff)
			}
		})
	}
}
