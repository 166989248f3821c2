package lifecycle

// The decision of one step of an application: a pure function from what
// the step observed to what it does. step (app.go) observes, Decide
// plans, and the executor (execute, app.go) applies the plan in order;
// the status is written once, after it (writeStatus).
//
//	Zero     --request or backlog-->              Waking (pods start)
//	Waking   --a root serves-->                   Awake (the gate opens)
//	Waking   --a root's sidecar reports Asleep--> the sidecar is woken (the pod serves once its engine is awake)
//	Awake    --idle zeroAfter (minReplicas 0)-->  Draining --nothing queued, in flight or arriving--> Zero
//	Awake    --idle sleep.after-->                Draining --the sidecars sleep--> Asleep
//	Draining --a request-->                       Awake (the drain or sleep is cancelled)
//	Asleep   --request or backlog-->              Waking (the sidecars' engines wake) --all Awake--> Awake
//	Asleep   --parkAfter, a level-1 offload-->    Asleep at level 2 (the offload demoted to warm)
//	Asleep   --parkAfter (minReplicas 0)-->       Zero, parked (pods scaled away, the node agents keep the copies)
//	Asleep   --zeroAfter (minReplicas 0)-->       Zero
//	Zero, parked --every refreshEvery-->          the copies and the resident tier read again
//	any      --scaled by someone else-->          Waking or Zero (followed)

import (
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// Observation is what one step of an application decides on. observe
// reads it, the informers' cache first, then the consumer, then the root
// pods' sidecars, each only when the state needs it; Decide reads nothing.
type Observation struct {
	Now   time.Time
	State v1alpha1.LifecycleState
	// EngineWake: state Waking is a wake of sleeping engines through
	// their sidecars, not a pod start.
	EngineWake bool
	// DrainForSleep: state Draining ends in a sleep, not at zero.
	DrainForSleep bool
	// RequestSeen: a request was published since the application stopped
	// serving (the decision to go to zero, or to sleep).
	RequestSeen bool

	// Replicas is the root StatefulSet's replica count; Serving the roots
	// (with their workers) that serve; RootsConfirmed: a serving root is
	// not one the last scale to zero deleted.
	Replicas, Serving int32
	RootsConfirmed    bool
	// Demand is the consumer's reading; not read (OK false) in states that
	// decide without it.
	Demand consumerReading
	// Used: the reading shows the consumer used since the last one
	// (something queued, in flight or handed out); Idle is the time since
	// the application was last active before it.
	Used bool
	Idle time.Duration
	// Problem explains why starting pods do not start; Message is the
	// status message now.
	Problem, Message string
	// Parked: state Zero is a parked application's (its pods were scaled
	// away after parkAfter asleep; the node agents keep its copies).
	Parked bool
	// Sidecars are the root pods' sidecars, read while the engines sleep
	// or wake and while a root of an application with sleeping engines
	// does not serve; nil: not read.
	Sidecars []SidecarReading

	App   AppPolicy
	Sleep *SleepPolicy // nil: the engines do not sleep
}

// AppPolicy is the part of an application's configuration Decide uses.
type AppPolicy struct {
	MinReplicas int32
	ZeroAfter   time.Duration
}

// SleepPolicy is what Decide knows of an application's sleeping engines.
type SleepPolicy struct {
	After     time.Duration
	ParkAfter time.Duration
	// Level the engines sleep at now (1, or 2 once demoted).
	Level int32
	// Offloads: the engines' level-1 sleep leaves their weights in an
	// offload of their own (the simulator's file in the hot tier, vLLM's
	// own RAM), which parking demotes before the pods go; engines that
	// unload completely (Ollama, llama.cpp) have none.
	Offloads bool
	// HotCopies: the node agents keep a hot copy of the model file the
	// engines load (Ollama, llama.cpp with model copies): parking with
	// minReplicas above 0 demotes it to warm, parking to zero keeps it
	// hot for the next wake.
	HotCopies bool
	// AsleepFor is the time since the engines were decided asleep.
	AsleepFor time.Duration
	// SleepHeld and ParkHeld: a failed sleep or park holds off the next
	// one; WakeHeld: a failed wake attempt holds off the next one.
	SleepHeld, ParkHeld, WakeHeld bool
	// RefreshDue: the resident tier is due to be worked out again.
	RefreshDue bool
	// ResidentTier and ExpectedResume are the status's.
	ResidentTier   v1alpha1.Tier
	ExpectedResume string
}

// SidecarReading is one root pod's sidecar as a step read it.
type SidecarReading struct {
	Pod string
	// State is the sidecar's; Unknown when it did not answer.
	State sidecarapi.State
	// Serving: the pod takes requests (Ready, or answering its probes).
	Serving bool
}

// ActionKind names what an action does.
type ActionKind string

// The actions of a plan. Each is applied by the executor (execute).
const (
	// ActFail ends the step with an error (Reason): retried next tick.
	ActFail ActionKind = "Fail"
	// ActMarkActive sets lastActiveTime to now.
	ActMarkActive ActionKind = "MarkActive"
	// ActSetTier sets the resident tier of engines that do not sleep.
	ActSetTier ActionKind = "SetTier"
	// ActCloseGate pauses the consumer again (a dispatcher that
	// provisioned it reset the pause).
	ActCloseGate ActionKind = "CloseGate"
	// ActWake scales an application at zero to its awake size (Trigger).
	ActWake ActionKind = "Wake"
	// ActFollowWaking and ActFollowZero follow a scale made by someone
	// else (kubectl scale): up, or to zero.
	ActFollowWaking ActionKind = "FollowWaking"
	ActFollowZero   ActionKind = "FollowZero"
	// ActSyncWorkers keeps the worker StatefulSets in step with Replicas.
	ActSyncWorkers ActionKind = "SyncWorkers"
	// ActAwake opens the gate of a woken application.
	ActAwake ActionKind = "Awake"
	// ActReportProblem sets the status message to Reason (why pods do
	// not start) and records a warning when it is not empty.
	ActReportProblem ActionKind = "ReportProblem"
	// ActScale runs ceil(load / target) replicas (scaleWithBacklog).
	ActScale ActionKind = "Scale"
	// ActBeginDrain and ActBeginSleep enter Draining (its state published
	// first); ActDrain and ActSleep then close the gate and, with nothing
	// queued, in flight or arriving, scale to zero or sleep the engines.
	ActBeginDrain ActionKind = "BeginDrain"
	ActDrain      ActionKind = "Drain"
	ActBeginSleep ActionKind = "BeginSleep"
	ActSleep      ActionKind = "Sleep"
	// ActBeginEngineWake enters Waking to wake sleeping engines
	// (Trigger); ActWakeEngines makes one attempt of that wake.
	ActBeginEngineWake ActionKind = "BeginEngineWake"
	ActWakeEngines     ActionKind = "WakeEngines"
	// ActWakeSidecars wakes the engines of Pods whose sidecar reports
	// Asleep while the application is meant to serve (a root that started,
	// or restarted, with its engine asleep).
	ActWakeSidecars ActionKind = "WakeSidecars"
	// ActRestartSidecar deletes the pod of a Failed sidecar (Pods).
	ActRestartSidecar ActionKind = "RestartSidecar"
	// ActSleepSidecars puts the engines of Pods (roots that started while
	// the others sleep) to sleep at Level.
	ActSleepSidecars ActionKind = "SleepSidecars"
	// ActPark moves sleeping engines' weights out of the hot tier.
	ActPark ActionKind = "Park"
	// ActParkPods scales a sleeping application's pods away after
	// parkAfter (minReplicas 0), the node agents keeping its copies: state
	// Zero, parked.
	ActParkPods ActionKind = "ParkPods"
	// ActRefreshParked reads a parked application's copies again.
	ActRefreshParked ActionKind = "RefreshParked"
	// ActZeroFromSleep takes sleeping engines' pods to zero.
	ActZeroFromSleep ActionKind = "ZeroFromSleep"
	// ActRefreshTier works out where sleeping weights rest.
	ActRefreshTier ActionKind = "RefreshTier"
)

// Action is one step of a plan.
type Action struct {
	Kind    ActionKind
	Trigger string           `json:",omitempty"`
	Reason  string           `json:",omitempty"`
	Pods    []string         `json:",omitempty"`
	Level   int32            `json:",omitempty"`
	Tier    v1alpha1.Tier    `json:",omitempty"`
	State   sidecarapi.State `json:",omitempty"`
}

// Decide plans one step of an application from o. It is pure.
func Decide(o Observation) []Action {
	var plan []Action
	add := func(a ...Action) { plan = append(plan, a...) }
	d := o.Demand
	if o.Sleep != nil && (o.State == v1alpha1.LifecycleAwake || o.State == v1alpha1.LifecycleZero && !o.Parked) {
		tier := v1alpha1.TierAccelerator
		if o.State == v1alpha1.LifecycleZero {
			tier = v1alpha1.TierCold
		}
		if o.Sleep.ResidentTier != tier || o.Sleep.ExpectedResume != "" {
			add(Action{Kind: ActSetTier, Tier: tier})
		}
	}
	switch o.State {
	case v1alpha1.LifecycleZero:
		switch {
		case o.RequestSeen:
			// Woken at once, without asking JetStream.
			return append(plan, Action{Kind: ActWake, Trigger: triggerRequest})
		case o.Replicas > 0:
			return append(plan, Action{Kind: ActFollowWaking})
		}
		if d.OK && !d.Paused {
			add(Action{Kind: ActCloseGate})
		}
		if d.OK && d.Busy() {
			// Queued while this leader watched, or handed to a dispatcher
			// in the instant before the consumer paused: it needs a root.
			return append(plan, Action{Kind: ActWake, Trigger: triggerRequest})
		}
		if o.Parked && o.Sleep != nil && o.Sleep.RefreshDue {
			add(Action{Kind: ActRefreshParked})
		}
		return append(plan, Action{Kind: ActSyncWorkers}) // after a drain that did not write them all

	case v1alpha1.LifecycleWaking:
		if o.EngineWake {
			if o.Sleep == nil || o.Sleep.WakeHeld {
				return plan
			}
			return append(plan, Action{Kind: ActWakeEngines})
		}
		if o.Serving > 0 && o.RootsConfirmed {
			return append(plan, Action{Kind: ActAwake})
		}
		if d.OK && !d.Paused {
			add(Action{Kind: ActCloseGate})
		}
		if o.Replicas == 0 {
			// Scaled to zero behind our back while waking: wake again.
			return append(plan, Action{Kind: ActWake, Trigger: triggerRequest})
		}
		if asleep := asleepNotServing(o.Sidecars); len(asleep) > 0 {
			// A root whose sidecar reports Asleep never turns Ready (its
			// readiness is its engine's): wake its engine.
			add(Action{Kind: ActWakeSidecars, Pods: asleep})
		}
		if o.Problem != o.Message {
			add(Action{Kind: ActReportProblem, Reason: o.Problem})
		}
		return plan

	case v1alpha1.LifecycleDraining:
		if o.DrainForSleep {
			return append(plan, Action{Kind: ActSleep})
		}
		return append(plan, Action{Kind: ActDrain})

	case v1alpha1.LifecycleAsleep:
		if o.Sleep == nil {
			return plan
		}
		if o.RequestSeen {
			return append(plan, Action{Kind: ActBeginEngineWake, Trigger: triggerRequest})
		}
		if o.Replicas == 0 {
			// Scaled to zero by someone else: the next request starts pods.
			return append(plan, Action{Kind: ActFollowZero})
		}
		if d.OK && !d.Paused {
			add(Action{Kind: ActCloseGate})
		}
		if d.OK && d.Busy() {
			return append(plan, Action{Kind: ActBeginEngineWake, Trigger: triggerRequest})
		}
		parkDue := o.Sleep.ParkAfter > 0 && o.Sleep.AsleepFor >= o.Sleep.ParkAfter && !o.Sleep.ParkHeld
		// Parking scales the pods away once nothing of the weights is left
		// in an engine's own hot offload (demoted first, below: a pod
		// deleted with its offload would leave it in the node's RAM).
		parkPods := parkDue && o.App.MinReplicas == 0 && (o.Sleep.Level == 2 || !o.Sleep.Offloads)
		if parkPods || o.App.MinReplicas == 0 && o.Idle >= o.App.ZeroAfter {
			if !d.OK {
				return append(plan, Action{Kind: ActFail, Reason: "reading the consumer's backlog failed"})
			}
			if parkPods {
				return append(plan, Action{Kind: ActParkPods})
			}
			return append(plan, Action{Kind: ActZeroFromSleep})
		}
		var failed, awake []string
		allAsleep := len(o.Sidecars) > 0
		for _, s := range o.Sidecars {
			switch s.State {
			case sidecarapi.Asleep:
			case sidecarapi.Failed:
				failed = append(failed, s.Pod)
				allAsleep = false
			case sidecarapi.Awake:
				// A root that started (again) while the engines sleep: the
				// gate is closed, so it sleeps like the others.
				awake = append(awake, s.Pod)
				allAsleep = false
			default:
				allAsleep = false
			}
		}
		for _, p := range failed {
			add(Action{Kind: ActRestartSidecar, Pods: []string{p}})
		}
		if len(awake) > 0 {
			return append(plan, Action{Kind: ActSleepSidecars, Pods: awake, Level: o.Sleep.Level})
		}
		if allAsleep && parkDue && o.Sleep.Level == 1 && (o.Sleep.Offloads || o.Sleep.HotCopies && o.App.MinReplicas > 0) {
			return append(plan, Action{Kind: ActPark})
		}
		if o.Sleep.RefreshDue {
			add(Action{Kind: ActRefreshTier})
		}
		return plan

	default: // Awake
		if !d.OK {
			return append(plan, Action{Kind: ActFail, Reason: "reading the consumer's backlog failed"})
		}
		// An idle lease held by a gateway's direct lane is no demand here
		// (Active): it holds off neither the sleep nor the drain, which
		// then wait for it to be given back.
		idle := o.Idle
		if o.Used || d.Active() {
			add(Action{Kind: ActMarkActive})
			idle = 0
		}
		if o.Replicas == 0 {
			// Scaled to zero by someone else: requests now wait for a wake.
			return append(plan, Action{Kind: ActFollowZero})
		}
		if o.Sleep != nil && !d.Active() && idle >= o.Sleep.After && !o.Sleep.SleepHeld {
			return append(plan, Action{Kind: ActBeginSleep})
		}
		if o.App.MinReplicas == 0 && !d.Active() && idle >= o.App.ZeroAfter {
			return append(plan, Action{Kind: ActBeginDrain})
		}
		if asleep := asleepNotServing(o.Sidecars); len(asleep) > 0 {
			// A root that restarted with its engine asleep serves nothing
			// until its engine is woken.
			add(Action{Kind: ActWakeSidecars, Pods: asleep})
		}
		return append(plan, Action{Kind: ActScale})
	}
}

// asleepNotServing lists the pods whose sidecar reports Asleep and that
// do not serve.
func asleepNotServing(sidecars []SidecarReading) []string {
	var out []string
	for _, s := range sidecars {
		if s.State == sidecarapi.Asleep && !s.Serving {
			out = append(out, s.Pod)
		}
	}
	return out
}
