package seatgroup

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// An application's state in its group is its sidecar's (sidecarapi.State,
// as the executor read it) and whether the executor drains it (App.Draining).
// The policy reads them through the predicates below, so that there is no
// second enum mirroring the sidecar's:
//
//   - a holder serves from its seat: Awake, not drained (serving);
//   - a drained holder is Awake with the gate held so that its requests in
//     flight finish before it is put to sleep (drained). This drain is the
//     executor's, not the sidecar's: the sidecar's Draining is the drain
//     inside its own sleep call, which the policy counts as falling asleep;
//   - falling asleep: the sidecar's Draining or FallingAsleep (fallingAsleep);
//   - Asleep: holds no seat once its memory was seen freed; Failed: a sleep
//     or wake left the engine in a state its sidecar cannot tell; it holds
//     no seat the policy can give (it is restarted first);
//   - Waking holds its seat; Unknown (not answered), Restarting or a state
//     this policy does not know holds its seat too, since its engine may
//     hold memory (unanswered).

// serving reports whether a holds a seat and serves from it.
func serving(a App) bool { return a.State == sidecarapi.Awake && !a.Draining }

// drained reports whether a holds a seat the executor drains.
func drained(a App) bool { return a.State == sidecarapi.Awake && a.Draining }

// fallingAsleep reports whether a's sidecar runs a sleep (its drain or the
// engine's sleep call): its seat is being given up.
func fallingAsleep(a App) bool {
	return a.State == sidecarapi.Draining || a.State == sidecarapi.FallingAsleep
}

// unanswered reports whether a's state cannot be told: its sidecar did
// not answer, restarts the engine, or said something this policy does not
// know.
func unanswered(a App) bool {
	switch a.State {
	case sidecarapi.Awake, sidecarapi.Draining, sidecarapi.FallingAsleep, sidecarapi.Asleep, sidecarapi.Waking, sidecarapi.Failed:
		return false
	}
	return true
}

// MemoryCheck is what a reading of an asleep engine's memory showed.
type MemoryCheck string

const (
	// MemoryUnchecked: nobody read the engine's memory since it slept.
	MemoryUnchecked MemoryCheck = ""
	// MemoryFreed: the engine gave its weights' memory back.
	MemoryFreed MemoryCheck = "Freed"
	// MemoryNotFreed: the engine reports that it sleeps but still holds its
	// memory (vllm-project/vllm#47654); waking another application next to
	// it would run out of memory.
	MemoryNotFreed MemoryCheck = "NotFreed"
)

// App is one application of a seat group, as observed for one decision.
type App struct {
	Name string
	// State is its sidecar's, as the executor read it (an engine restarted
	// since its sidecar last changed its mind counts Asleep).
	State sidecarapi.State
	// Draining: the executor holds the gate of this Awake holder so that
	// its requests in flight finish before it sleeps.
	Draining bool
	// Priority: higher values keep their seat and get one first.
	Priority int32
	// LastUse is when the application last received or finished a request.
	LastUse time.Time
	// InFlight counts the requests dispatched to it and not finished,
	// as the dispatcher counts them (sent, or on their way).
	InFlight int
	// Queued counts its requests waiting in the queue.
	Queued int
	// OldestWait is how long its oldest queued request has waited.
	OldestWait time.Duration
	// ResidentSince is when it last became Awake.
	ResidentSince time.Time
	// SwapCost estimates the time to swap it in: its weights' bytes ÷ the
	// hot tier's read bandwidth + the engine's time to first token
	// (EstimateSwapCost).
	SwapCost time.Duration
	// ServiceTime is the mean time the seat spends on one of its requests;
	// 0 when not known yet (then only the wait rule can swap it in ahead
	// of a busy holder).
	ServiceTime time.Duration
	// Memory is the last memory reading since it went to sleep.
	Memory MemoryCheck
	// SleepLevel is the level it sleeps at (1: weights to the hot tier, 2:
	// dropped); 0 means 1.
	SleepLevel int
	// MinResidency is its own anti-thrash time (lifecycle.seat.minResidency);
	// 0 means the group's.
	MinResidency time.Duration
	// SleepAfter is its idle time (lifecycle.sleepAfter): a holder with
	// nothing in flight or queued since max(last use, resident since) for
	// this long is put to sleep, freeing its seat. 0: never for idleness.
	SleepAfter time.Duration
}

// minResidency is how long a keeps its seat at least.
func (a App) minResidency(g Group) time.Duration {
	if a.MinResidency > 0 {
		return a.MinResidency
	}
	return g.MinResidency
}

// Group is one observation of a seat group.
type Group struct {
	// ActiveSeats is how many of its applications may be awake at once.
	ActiveSeats int
	// MinResidency protects a holder from being swapped out before it held
	// its seat this long (anti-thrash). It does not apply when the group is
	// over budget.
	MinResidency time.Duration
	// MaxSwapWait bounds how long a request waits behind a busy holder: a
	// waiting application whose oldest request waited this long gets the
	// holder drained, whatever their priorities.
	MaxSwapWait time.Duration
	Apps        []App
}

// ActionKind is what an action does.
type ActionKind string

const (
	// ActionWake wakes an asleep application into a free seat.
	ActionWake ActionKind = "Wake"
	// ActionDrain stops dispatching to a holder so that its requests in
	// flight finish; it is put to sleep once none is left. New requests
	// for it wait in the queue.
	ActionDrain ActionKind = "Drain"
	// ActionResume reopens dispatching to a draining holder nobody waits
	// for any more.
	ActionResume ActionKind = "Resume"
	// ActionSleep puts a holder with nothing in flight to sleep at Level,
	// then reads its memory.
	ActionSleep ActionKind = "Sleep"
	// ActionCheckMemory reads an asleep engine's memory.
	ActionCheckMemory ActionKind = "CheckMemory"
	// ActionRestart stops an engine that did not free its memory (or whose
	// state is unknown), which returns all of it; its next wake starts it
	// again and loads the weights from the warm or cold tier.
	ActionRestart ActionKind = "Restart"
	// ActionWait does nothing for App now; Reason says why.
	ActionWait ActionKind = "Wait"
)

// Action is one step of a plan.
type Action struct {
	Kind ActionKind
	App  string
	// Level is the sleep level of a Sleep.
	Level int
	// For is the waiting application a Drain, Sleep or Restart makes room
	// for; empty when it brings the group back within its budget or
	// (Idle) its holder was idle for its sleepAfter.
	For string
	// Idle marks a Sleep of a holder idle for its sleepAfter.
	Idle   bool
	Reason string
}

func (a Action) String() string {
	var b strings.Builder
	b.WriteString(string(a.Kind))
	b.WriteString(" ")
	b.WriteString(a.App)
	if a.Kind == ActionSleep {
		fmt.Fprintf(&b, " at level %d", a.Level)
	}
	if a.For != "" {
		fmt.Fprintf(&b, " for %s", a.For)
	}
	if a.Reason != "" {
		b.WriteString(": ")
		b.WriteString(a.Reason)
	}
	return b.String()
}

// EstimateSwapCost is bytes ÷ bytesPerSecond + ttft: the time to bring an
// application's weights back from a tier read at bytesPerSecond and answer
// its first token. A bandwidth of 0 (not measured) counts only the TTFT.
func EstimateSwapCost(bytes int64, bytesPerSecond float64, ttft time.Duration) time.Duration {
	if bytesPerSecond <= 0 {
		return ttft
	}
	return time.Duration(float64(bytes)/bytesPerSecond*float64(time.Second)) + ttft
}

// holdsSeat reports whether a's engine may hold accelerator memory. An
// asleep application about to be restarted or checked is counted free: the
// executor reads its memory before any wake that follows in the same plan.
func holdsSeat(a App) bool {
	switch a.State {
	case sidecarapi.Asleep, sidecarapi.Failed:
		return false
	}
	return true
}

// Decide returns the plan for one observation of the group at now. The
// executor applies the actions in order and decides again after a Wait,
// after a failure, or when a memory reading contradicts the plan. The
// rules, in order:
//
//  1. An asleep application whose memory was not freed is restarted, one
//     whose memory was not read yet is checked, a Failed one is restarted.
//  2. Over budget (more holders than activeSeats, as when every engine of
//     a new group starts awake), the holders with the lowest (priority,
//     last use) are put to sleep, idle ones first, busy ones drained first;
//     minResidency does not apply. Unknown seats count as held, but do not
//     make others sleep.
//  3. Asleep applications with queued requests wait in order: priority
//     (highest first), then oldest wait (longest first). Each takes, in
//     turn: a free seat (Wake); a seat being given up (a Draining holder
//     with nothing in flight is put to sleep, then the waiting one woken);
//     the seat of an idle holder (nothing in flight or queued) resident at
//     least minResidency, lowest (priority, last use) first (Sleep, Wake);
//     or the seat of a busy holder with the lowest (priority, last use),
//     resident at least minResidency, when the swap is justified (see
//     justify): the holder is drained, and put to sleep once nothing of
//     it is in flight. A holder is never put to sleep with requests in
//     flight.
//  4. A Draining holder that nobody waits for any more is resumed.
//  5. A holder with a sleepAfter, nothing in flight or queued, idle (since
//     its last use or its wake, whichever is later) for at least its
//     sleepAfter, and not claimed above, is put to sleep: its seat is free
//     for the next application that asks, which then swaps in with a wake
//     alone.
func Decide(g Group, now time.Time) []Action {
	apps := slices.Clone(g.Apps)
	slices.SortFunc(apps, func(a, b App) int { return cmp.Compare(a.Name, b.Name) })
	var plan []Action

	// 1. Memory first: nothing wakes next to an engine that may hold memory.
	for _, a := range apps {
		switch {
		case a.State == sidecarapi.Failed:
			plan = append(plan, Action{Kind: ActionRestart, App: a.Name, Reason: "its sidecar reports Failed: the engine's state and memory are unknown"})
		case a.State == sidecarapi.Asleep && a.Memory == MemoryNotFreed:
			plan = append(plan, Action{Kind: ActionRestart, App: a.Name, Reason: "it sleeps but did not free its memory (vllm-project/vllm#47654)"})
		case a.State == sidecarapi.Asleep && a.Memory == MemoryUnchecked:
			plan = append(plan, Action{Kind: ActionCheckMemory, App: a.Name, Reason: "it sleeps and nobody has read its memory since"})
		}
	}

	held := 0
	var unknown []string
	var leaving []App // drained or falling asleep: their seats are being given up
	for _, a := range apps {
		if holdsSeat(a) {
			held++
		}
		if unanswered(a) {
			unknown = append(unknown, a.Name)
		}
		if drained(a) || fallingAsleep(a) {
			leaving = append(leaving, a)
		}
	}
	claimed := map[string]bool{}
	// byUse orders candidates to give up a seat: lowest priority, then
	// least recently used, then name.
	byUse := func(a, b App) int {
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		if c := a.LastUse.Compare(b.LastUse); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	}
	slices.SortFunc(leaving, byUse)
	// release plans giving up v's seat for w ("" when over budget); it
	// reports whether the seat is free once the plan's actions ran.
	release := func(v App, w, reason string) bool {
		claimed[v.Name] = true
		switch {
		case fallingAsleep(v):
			return false
		case v.InFlight > 0:
			if !v.Draining {
				plan = append(plan, Action{Kind: ActionDrain, App: v.Name, For: w, Reason: reason})
			}
			return false
		default:
			plan = append(plan, Action{Kind: ActionSleep, App: v.Name, Level: max(v.SleepLevel, 1), For: w, Reason: reason})
			return true
		}
	}

	// 2. Over budget: leaving seats count first, then more holders go. A
	// seat that does not answer keeps anyone from waking into it, but
	// puts nobody to sleep: its agent may only be restarting.
	excess := held - len(unknown) - g.ActiveSeats
	released := 0
	for _, v := range leaving {
		if excess <= 0 {
			break
		}
		release(v, "", fmt.Sprintf("%d applications hold seats, %d allowed", held, g.ActiveSeats))
		excess--
		released++
	}
	if excess > 0 {
		var awake []App
		for _, a := range apps {
			if serving(a) {
				awake = append(awake, a)
			}
		}
		// Idle holders first, then by (priority, last use).
		slices.SortStableFunc(awake, func(a, b App) int {
			if c := cmp.Compare(busy(a), busy(b)); c != 0 {
				return c
			}
			return byUse(a, b)
		})
		for _, v := range awake[:min(excess, len(awake))] {
			release(v, "", fmt.Sprintf("%d applications hold seats, %d allowed", held, g.ActiveSeats))
			released++
		}
	}
	free := max(g.ActiveSeats-held, 0)
	// Seats held beyond the budget once the releases above are done:
	// only unknown seats can be left over, and nobody wakes while they are.
	blocked := held - released - g.ActiveSeats

	// 3. Waiting applications, in order.
	var waiting []App
	for _, a := range apps {
		if (a.State == sidecarapi.Asleep || a.State == sidecarapi.Failed) && a.Queued > 0 {
			waiting = append(waiting, a)
		}
	}
	slices.SortStableFunc(waiting, func(a, b App) int {
		if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
			return c
		}
		return cmp.Compare(b.OldestWait, a.OldestWait)
	})
	wake := func(w App, reason string) {
		plan = append(plan, Action{Kind: ActionWake, App: w.Name, Reason: reason})
	}
	wait := func(w App, reason string) {
		plan = append(plan, Action{Kind: ActionWait, App: w.Name, Reason: reason})
	}
	for _, w := range waiting {
		if blocked > 0 {
			wait(w, fmt.Sprintf("the sidecars of %s do not answer; their engines may hold memory", strings.Join(unknown, ", ")))
			continue
		}
		if free > 0 {
			free--
			wake(w, "a seat is free")
			continue
		}
		if i := slices.IndexFunc(leaving, func(v App) bool { return !claimed[v.Name] }); i >= 0 {
			v := leaving[i]
			if release(v, w.Name, "its seat goes to "+w.Name) {
				wake(w, v.Name+" gave up its seat")
			} else if fallingAsleep(v) {
				wait(w, v.Name+" is going to sleep; "+w.Name+" wakes after it")
			} else {
				wait(w, fmt.Sprintf("%s drains its seat: %d requests in flight", v.Name, v.InFlight))
			}
			continue
		}
		var idle, busyHolders, young []App
		for _, a := range apps {
			if !serving(a) || claimed[a.Name] {
				continue
			}
			switch {
			case now.Sub(a.ResidentSince) < a.minResidency(g):
				young = append(young, a)
			case busy(a) == 1:
				busyHolders = append(busyHolders, a)
			default:
				idle = append(idle, a)
			}
		}
		if len(idle) > 0 {
			v := slices.MinFunc(idle, byUse)
			idle := "never used"
			if !v.LastUse.IsZero() {
				idle = "idle for " + now.Sub(v.LastUse).Round(time.Millisecond).String()
			}
			release(v, w.Name, idle+", lowest (priority, last use) of the idle holders")
			wake(w, v.Name+" gave up its seat")
			continue
		}
		if len(busyHolders) > 0 {
			v := slices.MinFunc(busyHolders, byUse)
			if why, ok := justify(g, w, v); ok {
				if release(v, w.Name, why) {
					wake(w, v.Name+" gave up its seat")
				} else {
					wait(w, fmt.Sprintf("%s drains its seat: %d requests in flight", v.Name, v.InFlight))
				}
			} else {
				wait(w, why)
			}
			continue
		}
		if len(young) > 0 {
			v := slices.MinFunc(young, func(a, b App) int { return a.ResidentSince.Compare(b.ResidentSince) })
			wait(w, fmt.Sprintf("anti-thrash: %s holds its seat for %s of the minimum %s", v.Name, now.Sub(v.ResidentSince).Round(time.Millisecond), v.minResidency(g)))
			continue
		}
		wait(w, fmt.Sprintf("all %d seats are taken by applications waking or ahead of it", g.ActiveSeats))
	}

	// 4. Draining holders nobody waits for go back to serving.
	for _, v := range leaving {
		if drained(v) && !claimed[v.Name] {
			plan = append(plan, Action{Kind: ActionResume, App: v.Name, Reason: "no application waits for its seat any more"})
		}
	}

	// 5. Idle holders past their sleepAfter give their seats up.
	for _, a := range apps {
		if !serving(a) || claimed[a.Name] || a.SleepAfter <= 0 || busy(a) == 1 {
			continue
		}
		idleSince := a.LastUse
		if a.ResidentSince.After(idleSince) {
			idleSince = a.ResidentSince
		}
		if idle := now.Sub(idleSince); idle >= a.SleepAfter {
			plan = append(plan, Action{Kind: ActionSleep, App: a.Name, Level: max(a.SleepLevel, 1), Idle: true,
				Reason: fmt.Sprintf("idle for %s, at least its sleepAfter %s", idle.Round(time.Millisecond), a.SleepAfter)})
		}
	}
	return plan
}

// busy is 1 when a has requests in flight or queued, else 0.
func busy(a App) int {
	if a.InFlight > 0 || a.Queued > 0 {
		return 1
	}
	return 0
}

// justify decides whether waiting application w may take the seat of busy
// holder v (resident at least minResidency), and says why or why not. The
// swap is justified when any of these holds:
//
//   - priority: w's priority is above v's;
//   - wait: w's oldest request has waited at least maxSwapWait (the bound
//     that keeps any application from starving, whatever its priority);
//   - backlog: w's priority equals v's, and w's backlog is worth at least
//     the round trip of the swap: queued × serviceTime ≥ w's swap cost + v's
//     swap cost (v is busy, so it will have to come back). The seat then
//     spends at least as long serving w's backlog as it spends swapping,
//     so swaps between busy applications take at most half of its time.
func justify(g Group, w, v App) (string, bool) {
	if w.Priority > v.Priority {
		return fmt.Sprintf("%s (priority %d) waits, above %s (priority %d)", w.Name, w.Priority, v.Name, v.Priority), true
	}
	if g.MaxSwapWait > 0 && w.OldestWait >= g.MaxSwapWait {
		return fmt.Sprintf("%s's oldest request waited %s, at least maxSwapWait %s", w.Name, w.OldestWait.Round(time.Millisecond), g.MaxSwapWait), true
	}
	roundTrip := w.SwapCost + v.SwapCost
	work := time.Duration(w.Queued) * w.ServiceTime
	if w.Priority == v.Priority && w.ServiceTime > 0 && work >= roundTrip {
		return fmt.Sprintf("%s's backlog (%d × %s) is worth the swap round trip (%s)", w.Name, w.Queued, w.ServiceTime.Round(time.Millisecond), roundTrip.Round(time.Millisecond)), true
	}
	why := fmt.Sprintf("%s waits: %s is busy (%d in flight, %d queued)", w.Name, v.Name, v.InFlight, v.Queued)
	if w.Priority < v.Priority {
		why += fmt.Sprintf(" with priority %d above its %d", v.Priority, w.Priority)
	} else if w.ServiceTime == 0 {
		why += "; its service time is not known yet"
	} else {
		why += fmt.Sprintf("; its backlog (%d × %s) is worth less than the swap round trip (%s)", w.Queued, w.ServiceTime.Round(time.Millisecond), roundTrip.Round(time.Millisecond))
	}
	if g.MaxSwapWait > 0 {
		why += fmt.Sprintf(", and its oldest request waited %s of maxSwapWait %s", w.OldestWait.Round(time.Millisecond), g.MaxSwapWait)
	}
	return why, false
}
