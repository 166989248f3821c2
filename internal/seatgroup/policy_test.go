package seatgroup

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

var now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

type opt func(*App)

func prio(p int32) opt { return func(a *App) { a.Priority = p } }

// queued: n requests wait, the oldest for wait.
func queued(n int, wait time.Duration) opt {
	return func(a *App) { a.Queued, a.OldestWait = n, wait }
}
func inFlight(n int) opt               { return func(a *App) { a.InFlight = n } }
func resident(d time.Duration) opt     { return func(a *App) { a.ResidentSince = now.Add(-d) } }
func usedAgo(d time.Duration) opt      { return func(a *App) { a.LastUse = now.Add(-d) } }
func service(d time.Duration) opt      { return func(a *App) { a.ServiceTime = d } }
func swapCost(d time.Duration) opt     { return func(a *App) { a.SwapCost = d } }
func memory(m MemoryCheck) opt         { return func(a *App) { a.Memory = m } }
func level(n int) opt                  { return func(a *App) { a.SleepLevel = n } }
func ownResidency(d time.Duration) opt { return func(a *App) { a.MinResidency = d } }
func sleepAfter(d time.Duration) opt   { return func(a *App) { a.SleepAfter = d } }
func state(s sidecarapi.State, drain bool) func(string, ...opt) App {
	return func(name string, opts ...opt) App {
		// Defaults: resident and last used long ago, a 1 s swap, memory
		// freed while asleep.
		a := App{Name: name, State: s, Draining: drain, ResidentSince: now.Add(-time.Hour), LastUse: now.Add(-time.Minute), SwapCost: time.Second}
		if s == sidecarapi.Asleep {
			a.Memory = MemoryFreed
		}
		for _, o := range opts {
			o(&a)
		}
		return a
	}
}

var (
	awake = state(sidecarapi.Awake, false)
	// draining: the executor drains the holder (its gate held).
	draining = state(sidecarapi.Awake, true)
	asleep   = state(sidecarapi.Asleep, false)
	// sleeping: the sidecar runs the sleep (its own drain, then the
	// engine's sleep call).
	sleeping     = state(sidecarapi.FallingAsleep, false)
	sidecarDrain = state(sidecarapi.Draining, false)
	waking       = state(sidecarapi.Waking, false)
	failed       = state(sidecarapi.Failed, false)
	unknown      = state(sidecarapi.Unknown, false)
	restarting   = state(sidecarapi.Restarting, false)
)

func wakeA(app string) Action { return Action{Kind: ActionWake, App: app} }
func sleepA(app, forApp string, lvl int) Action {
	return Action{Kind: ActionSleep, App: app, For: forApp, Level: lvl}
}
func idleSleepA(app string) Action {
	return Action{Kind: ActionSleep, App: app, Level: 1, Idle: true}
}
func drainA(app, forApp string) Action { return Action{Kind: ActionDrain, App: app, For: forApp} }
func waitA(app, reason string) Action  { return Action{Kind: ActionWait, App: app, Reason: reason} }

func TestDecide(t *testing.T) {
	const (
		minRes  = 30 * time.Second
		maxWait = 10 * time.Second
	)
	for _, c := range []struct {
		name  string
		seats int
		apps  []App
		want  []Action
	}{
		{
			name: "nothing waits and the seat is within budget: nothing to do",
			apps: []App{awake("a"), asleep("b"), asleep("c")},
		},
		{
			name: "a request for a sleeping application wakes it into the free seat",
			apps: []App{asleep("a"), asleep("b", queued(1, time.Millisecond))},
			want: []Action{wakeA("b")},
		},
		{
			name: "a full seat: the idle holder goes to sleep at its level, then the requested application wakes",
			apps: []App{awake("a", level(2)), asleep("b", queued(1, 0))},
			want: []Action{sleepA("a", "b", 2), wakeA("b")},
		},
		{
			name: "round-robin: of two waiting applications of equal priority, the one waiting longest goes first",
			apps: []App{awake("a"), asleep("b", queued(1, 2*time.Second)), asleep("c", queued(1, 3*time.Second)), asleep("d")},
			want: []Action{sleepA("a", "c", 1), wakeA("c"), waitA("b", "all 1 seats are taken by applications waking or ahead of it")},
		},
		{
			name: "priority order: the higher-priority waiting application is woken first, even if it waited less",
			apps: []App{awake("a"), asleep("b", queued(5, 9*time.Second)), asleep("c", prio(10), queued(1, time.Second))},
			want: []Action{sleepA("a", "c", 1), wakeA("c"), waitA("b", "")},
		},
		{
			name: "priority order: a higher-priority application drains a busy lower-priority holder",
			apps: []App{awake("a", inFlight(2), queued(3, 0)), asleep("b", prio(5), queued(1, 0))},
			want: []Action{drainA("a", "b"), waitA("b", "a drains its seat: 2 requests in flight")},
		},
		{
			name: "priority order: a lower-priority application does not displace a busy higher-priority holder",
			apps: []App{awake("a", prio(5), inFlight(1)), asleep("b", queued(50, time.Second), service(time.Second))},
			want: []Action{waitA("b", "b waits: a is busy (1 in flight, 0 queued) with priority 5 above its 0, and its oldest request waited 1s of maxSwapWait 10s")},
		},
		{
			name:  "the idle holder of the lowest (priority, last use) goes to sleep, whatever the waiting application's priority",
			seats: 2,
			apps: []App{
				awake("a", prio(5), usedAgo(time.Hour)), awake("b", prio(1), usedAgo(time.Second)),
				asleep("c", queued(1, 0)),
			},
			want: []Action{sleepA("b", "c", 1), wakeA("c")},
		},
		{
			name:  "an idle holder goes before a busy one of lower priority",
			seats: 2,
			apps: []App{
				awake("a", prio(1), inFlight(3)), awake("b", prio(9)),
				asleep("c", prio(5), queued(1, 0)),
			},
			want: []Action{sleepA("b", "c", 1), wakeA("c")},
		},
		{
			name: "bursty: a small backlog waits while the holder is busy",
			apps: []App{
				awake("a", inFlight(4), queued(20, 0)),
				asleep("b", queued(1, time.Second), service(200*time.Millisecond), swapCost(500*time.Millisecond)),
			},
			want: []Action{waitA("b", "b waits: a is busy (4 in flight, 20 queued); its backlog (1 × 200ms) is worth less than the swap round trip (1.5s), and its oldest request waited 1s of maxSwapWait 10s")},
		},
		{
			name: "bursty: a backlog worth the swap round trip drains the busy holder first",
			apps: []App{
				awake("a", inFlight(4), queued(20, 0)),
				asleep("b", queued(8, time.Second), service(200*time.Millisecond), swapCost(500*time.Millisecond)),
			},
			want: []Action{drainA("a", "b"), waitA("b", "a drains its seat: 4 requests in flight")},
		},
		{
			name: "an application whose service time is unknown waits behind a busy holder until maxSwapWait",
			apps: []App{awake("a", inFlight(1)), asleep("b", queued(100, 9*time.Second))},
			want: []Action{waitA("b", "b waits: a is busy (1 in flight, 0 queued); its service time is not known yet, and its oldest request waited 9s of maxSwapWait 10s")},
		},
		{
			name: "starvation bound: a request waiting maxSwapWait drains even a higher-priority holder",
			apps: []App{awake("a", prio(100), inFlight(1)), asleep("b", queued(1, maxWait))},
			want: []Action{drainA("a", "b"), waitA("b", "")},
		},
		{
			name: "anti-thrash: an idle holder resident for less than minResidency keeps its seat",
			apps: []App{awake("a", resident(29*time.Second)), asleep("b", prio(100), queued(9, time.Hour))},
			want: []Action{waitA("b", "anti-thrash: a holds its seat for 29s of the minimum 30s")},
		},
		{
			name: "anti-thrash: once resident for minResidency, the idle holder gives up its seat",
			apps: []App{awake("a", resident(minRes)), asleep("b", queued(1, 0))},
			want: []Action{sleepA("a", "b", 1), wakeA("b")},
		},
		{
			name: "anti-thrash: a holder's own minResidency replaces the group's",
			apps: []App{awake("a", resident(time.Minute), ownResidency(2*time.Minute)), asleep("b", queued(1, 0))},
			want: []Action{waitA("b", "anti-thrash: a holds its seat for 1m0s of the minimum 2m0s")},
		},
		{
			name: "anti-thrash: a shorter own minResidency lets the holder go sooner than the group's",
			apps: []App{awake("a", resident(10*time.Second), ownResidency(5*time.Second)), asleep("b", queued(1, 0))},
			want: []Action{sleepA("a", "b", 1), wakeA("b")},
		},
		{
			name: "in-flight protection: a draining holder with requests in flight is not put to sleep",
			apps: []App{draining("a", inFlight(1)), asleep("b", queued(1, 0))},
			want: []Action{waitA("b", "a drains its seat: 1 requests in flight")},
		},
		{
			name: "in-flight protection: a drained holder with nothing in flight goes to sleep, then the waiting one wakes",
			apps: []App{draining("a", queued(3, 0)), asleep("b", queued(1, 0))},
			want: []Action{sleepA("a", "b", 1), wakeA("b")},
		},
		{
			name: "in-flight protection: a busy holder with queued work but nothing in flight is slept directly when justified",
			apps: []App{awake("a", queued(2, 0)), asleep("b", prio(1), queued(1, 0))},
			want: []Action{sleepA("a", "b", 1), wakeA("b")},
		},
		{
			name: "a holder falling asleep: the waiting application wakes after it",
			apps: []App{sleeping("a"), asleep("b", queued(1, 0))},
			want: []Action{waitA("b", "a is going to sleep; b wakes after it")},
		},
		{
			name: "a sidecar draining inside its own sleep call counts as falling asleep, not as a drained holder to resume",
			apps: []App{sidecarDrain("a"), asleep("b", queued(1, 0))},
			want: []Action{waitA("b", "a is going to sleep; b wakes after it")},
		},
		{
			name: "a draining holder nobody waits for any more is resumed",
			apps: []App{draining("a", inFlight(1)), asleep("b")},
			want: []Action{{Kind: ActionResume, App: "a", Reason: "no application waits for its seat any more"}},
		},
		{
			name: "memory not freed: the asleep application is restarted before the next wake",
			apps: []App{asleep("a", memory(MemoryNotFreed)), asleep("b", queued(1, 0))},
			want: []Action{{Kind: ActionRestart, App: "a", Reason: "it sleeps but did not free its memory (vllm-project/vllm#47654)"}, wakeA("b")},
		},
		{
			name: "memory not read yet: the asleep application is checked before the next wake",
			apps: []App{asleep("a", memory(MemoryUnchecked)), asleep("b", queued(1, 0))},
			want: []Action{{Kind: ActionCheckMemory, App: "a", Reason: "it sleeps and nobody has read its memory since"}, wakeA("b")},
		},
		{
			name: "a failed seat is restarted, and its queued requests wake it",
			apps: []App{failed("a", queued(2, 0)), asleep("b")},
			want: []Action{{Kind: ActionRestart, App: "a", Reason: "its sidecar reports Failed: the engine's state and memory are unknown"}, wakeA("a")},
		},
		{
			name: "a waking application holds its seat",
			apps: []App{waking("a"), asleep("b", queued(1, time.Hour))},
			want: []Action{waitA("b", "all 1 seats are taken")},
		},
		{
			name: "over budget: every engine started awake, the lowest (priority, last use) ones sleep, idle first, minResidency ignored",
			apps: []App{
				awake("a", resident(0), prio(3)), awake("b", resident(0), prio(1), inFlight(1)),
				awake("c", resident(0), prio(2), usedAgo(time.Hour)), awake("d", resident(0), prio(2)),
			},
			want: []Action{
				sleepA("c", "", 1), sleepA("d", "", 1), sleepA("a", "", 1),
			},
		},
		{
			name: "over budget: a busy holder beyond the budget is drained, not slept",
			apps: []App{awake("a", inFlight(1), resident(0)), awake("b", inFlight(2), resident(0), prio(1))},
			want: []Action{drainA("a", "")},
		},
		{
			name: "a seat that does not answer keeps its seat: nobody wakes into it, nobody is put to sleep for it",
			apps: []App{awake("a"), unknown("b"), asleep("c", queued(1, 0))},
			want: []Action{waitA("c", "the sidecars of b do not answer; their engines may hold memory")},
		},
		{
			name: "a sidecar restarting its engine holds its seat like one that does not answer",
			apps: []App{awake("a"), restarting("b"), asleep("c", queued(1, 0))},
			want: []Action{waitA("c", "the sidecars of b do not answer; their engines may hold memory")},
		},
		{
			name:  "activeSeats 2: two waiting applications take the two free seats",
			seats: 2,
			apps:  []App{asleep("a", queued(1, 0)), asleep("b", queued(1, 0)), asleep("c", queued(1, 0))},
			want:  []Action{wakeA("a"), wakeA("b"), waitA("c", "all 2 seats are taken")},
		},
		{
			name:  "activeSeats 2: one busy and one idle holder; the idle one makes room, the busy one keeps serving",
			seats: 2,
			apps: []App{
				awake("a", inFlight(5)), awake("b"),
				asleep("c", queued(1, 0)), asleep("d", queued(1, 0)),
			},
			want: []Action{sleepA("b", "c", 1), wakeA("c"), waitA("d", "d waits: a is busy")},
		},
		{
			name: "sleepAfter: a holder idle for its sleepAfter since its last use gives its seat up",
			apps: []App{awake("a", sleepAfter(20*time.Second), usedAgo(25*time.Second)), asleep("b")},
			want: []Action{idleSleepA("a")},
		},
		{
			name: "sleepAfter: idleness counts from the later of last use and wake",
			apps: []App{awake("a", sleepAfter(20*time.Second), usedAgo(time.Hour), resident(10*time.Second)), asleep("b")},
		},
		{
			name: "sleepAfter: a holder with requests in flight or queued is not idle",
			apps: []App{
				awake("a", sleepAfter(time.Second), usedAgo(time.Hour), inFlight(1)),
				awake("b", sleepAfter(time.Second), usedAgo(time.Hour), queued(1, 0)),
				asleep("c"),
			},
			seats: 2,
		},
		{
			name: "sleepAfter unset: an idle holder keeps its seat",
			apps: []App{awake("a", usedAgo(time.Hour)), asleep("b")},
		},
		{
			name: "sleepAfter: a holder already giving its seat to a waiting application is not slept twice",
			apps: []App{awake("a", sleepAfter(time.Second), usedAgo(time.Hour)), asleep("b", queued(1, 0))},
			want: []Action{sleepA("a", "b", 1), wakeA("b")},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := Group{ActiveSeats: max(c.seats, 1), MinResidency: minRes, MaxSwapWait: maxWait, Apps: c.apps}
			got := Decide(g, now)
			// Reasons are compared as prefixes where the case gives one,
			// and ignored where it gives none (except for Wait).
			for i := range got {
				if i < len(c.want) {
					w := c.want[i]
					if w.Reason == "" || strings.HasPrefix(got[i].Reason, w.Reason) {
						c.want[i].Reason = got[i].Reason
					}
				}
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideNeverSleepsAnApplicationWithRequestsInFlight(t *testing.T) {
	// Every combination of states, in-flight counts and priorities of two
	// holders and two waiting applications, with one or two seats.
	states := []func(string, ...opt) App{awake, draining, sleeping, sidecarDrain, asleep, waking, failed, unknown, restarting}
	n := 0
	for _, seats := range []int{1, 2} {
		for _, s1 := range states {
			for _, s2 := range states {
				for _, f1 := range []int{0, 1} {
					for _, f2 := range []int{0, 3} {
						for _, p := range []int32{0, 5} {
							apps := []App{
								s1("a", inFlight(f1)), s2("b", inFlight(f2), prio(p)),
								asleep("c", queued(2, time.Hour), prio(3)), asleep("d", queued(1, time.Minute)),
							}
							for _, act := range Decide(Group{ActiveSeats: seats, MinResidency: time.Second, MaxSwapWait: time.Second, Apps: apps}, now) {
								n++
								if act.Kind != ActionSleep {
									continue
								}
								for _, a := range apps {
									if a.Name == act.App && a.InFlight > 0 {
										t.Fatalf("plan sleeps %s with %d in flight: %+v", a.Name, a.InFlight, apps)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no plan had any action")
	}
}

func TestEstimateSwapCost(t *testing.T) {
	if got := EstimateSwapCost(1<<30, 2<<30, 10*time.Millisecond); got != 510*time.Millisecond {
		t.Errorf("1 GiB at 2 GiB/s + 10ms = %v, want 510ms", got)
	}
	if got := EstimateSwapCost(1<<30, 0, 10*time.Millisecond); got != 10*time.Millisecond {
		t.Errorf("without a bandwidth = %v, want the TTFT", got)
	}
}
