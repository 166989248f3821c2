package lifecycle_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// TestSeatGroupLeaderSwapsApplications runs a seat group of three
// simulator applications with one seat through a real dispatcher whose
// lifecycle leader multiplexes them: the group comes within its budget (one
// engine awake), requests to each application in turn are all answered
// whole, each turn moves the seat to the application asked (the status
// says who holds it and counts the swaps), no sleep ever reaches an engine
// with requests in flight, and at no time are two engines awake once the
// group settled.
func TestSeatGroupLeaderSwapsApplications(t *testing.T) {
	apps := []string{"alpha", "beta", "gamma"}
	p := newSeatGroupPlane(t, apps, nil, 1)
	eventually(t, 30*time.Second, holds("the group to come within its budget of one awake engine", func() bool {
		return len(p.awake()) == 1
	}))

	// Two engines awake at once, from here on, would break the budget.
	overBudget := countWhile(func() bool { return len(p.awake()) > 1 })

	for round := range 2 {
		for _, app := range apps {
			if err := p.send(app, round, 6, 16); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, holds(app+" to hold the seat in its status", func() bool {
				st := p.status(app)
				return st.Seat != nil && st.Seat.Holding && st.State == v1alpha1.LifecycleAwake
			}))
		}
	}
	if n := overBudget(); n > 0 {
		t.Errorf("two engines were awake at once %d times", n)
	}
	for _, app := range apps {
		if n := p.engines[app].sleepsInFlight.Load(); n > 0 {
			t.Errorf("%s: %d sleeps reached the engine with requests in flight", app, n)
		}
		st := p.status(app)
		if st.Seat == nil || st.Seat.SwapsIn < 2 {
			t.Errorf("%s: status %+v, want at least 2 swaps in (one per round)", app, st.Seat)
		} else if secs, err := strconv.ParseFloat(st.Seat.LastSwapSeconds, 64); err != nil || secs <= 0 {
			t.Errorf("%s: lastSwapSeconds %q, want a positive number", app, st.Seat.LastSwapSeconds)
		}
	}
	// The last turn was gamma's: it holds the seat, the others sleep.
	eventually(t, 10*time.Second, holds("alpha and beta to report Asleep and not holding", func() bool {
		for _, app := range []string{"alpha", "beta"} {
			st := p.status(app)
			if st.Seat == nil || st.Seat.Holding || st.State != v1alpha1.LifecycleAsleep || st.ResidentTier != v1alpha1.TierHot {
				return false
			}
		}
		return true
	}))
	if got := sum(t, p.reg, "orchestra_seatgroup_swaps_total"); got < float64(2*len(apps)-1) {
		t.Errorf("orchestra_seatgroup_swaps_total = %v, want at least %d", got, 2*len(apps)-1)
	}
	if got := sum(t, p.reg, "orchestra_dispatcher_failed_total"); got != 0 {
		t.Errorf("the dispatcher counted %v failed deliveries", got)
	}
}

// TestSeatGroupLeaderDrainsABusyHolder makes a higher-priority application
// ask for the seat while the holder runs requests: the holder's gate
// closes, the requests it runs finish, and only then does its engine
// sleep; the newcomer is served, the holder's queued requests wait and are
// served once it has the seat back. While the newcomer waits, its status
// says how long (seat.waitingSeconds). Every request is answered whole, and
// no sleep reaches an engine with requests in flight.
func TestSeatGroupLeaderDrainsABusyHolder(t *testing.T) {
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, map[string]int32{"beta": 10}, 1)
	eventually(t, 30*time.Second, holds("the group to come within its budget, beta (the higher priority) awake", func() bool {
		a := p.awake()
		return len(a) == 1 && a[0] == "beta"
	}))
	var wg sync.WaitGroup
	var alphaErr error
	wg.Go(func() { alphaErr = p.send("alpha", 0, 16, 64) })
	eventually(t, 20*time.Second, holds("alpha to hold the seat and run requests", func() bool {
		return p.engines["alpha"].weights().InFlight > 0
	}))
	// While beta waits for alpha to drain, its status says how long.
	var waited atomic.Value
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if st := p.status("beta"); st.Seat != nil && st.Seat.WaitingSeconds != "" && !st.Seat.Holding {
				waited.Store(st.Seat.WaitingSeconds)
			}
		}
	})
	if err := p.send("beta", 0, 4, 16); err != nil {
		t.Fatal(err)
	}
	close(stop)
	watch.Wait()
	wg.Wait()
	if alphaErr != nil {
		t.Fatal(alphaErr)
	}
	if waited.Load() == nil {
		t.Error("beta's status never showed seat.waitingSeconds while it waited for alpha to drain")
	}
	for name, e := range p.engines {
		if n := e.sleepsInFlight.Load(); n > 0 {
			t.Errorf("%s: %d sleeps reached the engine with requests in flight", name, n)
		}
	}
	if got := sum(t, p.reg, "orchestra_seatgroup_drain_seconds"); got < 1 {
		t.Errorf("no holder was drained (orchestra_seatgroup_drain_seconds has %v samples); the test did not make beta take a busy seat", got)
	}
	if st := p.status("beta"); st.Seat == nil || st.Seat.SwapsIn < 1 {
		t.Errorf("beta's seat status %+v, want a swap in", st.Seat)
	}
	if got := sum(t, p.reg, "orchestra_dispatcher_failed_total"); got != 0 {
		t.Errorf("the dispatcher counted %v failed deliveries", got)
	}
}

// TestSeatGroupLeaderRestartsAnEngineThatKeptItsMemory runs a group whose
// beta leaks its memory at every sleep (vllm#47654): the leader reads each
// engine's memory through its seat agent after every sleep, restarts beta
// in place through its seat (POST /restart) each time it slept, and only
// then wakes the next application, so the engines never hold more than one
// application's weights; every request is answered whole.
func TestSeatGroupLeaderRestartsAnEngineThatKeptItsMemory(t *testing.T) {
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, map[string]int32{"alpha": 10}, 1,
		func(o *seatPlaneOptions) { o.leak = map[string]bool{"beta": true} })
	restarts := func() float64 {
		return counter(t, p.reg, "orchestra_seatgroup_restarts_total", map[string]string{"app": "beta", "reason": "memory_not_freed"})
	}
	// Every engine starts awake; beta, put to sleep to bring the group
	// within its seat, kept its memory and is restarted.
	eventually(t, 30*time.Second, holds("beta to be restarted after its first sleep", func() bool { return restarts() >= 1 }))

	stop := make(chan struct{})
	var overBudget atomic.Int64
	var watch sync.WaitGroup
	watch.Go(func() {
		over := false
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var held int64
			for _, e := range p.engines {
				n, _ := e.eng.ResidentBytes(context.Background())
				held += n
			}
			// Two readings in a row: the engines are read one after the
			// other, and one reading may straddle a swap.
			if held > 4<<20 && over {
				overBudget.Add(1)
			}
			over = held > 4<<20
		}
	})
	for round := range 2 {
		for _, app := range []string{"beta", "alpha"} {
			if err := p.send(app, round, 3, 16); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, 10*time.Second, holds("alpha to hold the seat", func() bool {
		a := p.awake()
		return len(a) == 1 && a[0] == "alpha"
	}))
	close(stop)
	watch.Wait()
	if n := overBudget.Load(); n > 0 {
		t.Errorf("the engines held more than one application's weights in %d pairs of readings", n)
	}
	// beta slept three times (at the start and after each of its turns).
	if got := restarts(); got != 3 {
		t.Errorf("beta was restarted %v times for memory not freed, want 3 (once per sleep)", got)
	}
	if n, _ := p.engines["beta"].eng.ResidentBytes(context.Background()); n != 0 {
		t.Errorf("beta holds %d bytes after its restart, want 0", n)
	}
	if st, err := p.engines["beta"].seatState(); err != nil || st.Restarts != 3 || st.State != sidecarapi.Asleep {
		t.Errorf("beta's seat: %+v (%v), want Asleep after 3 restarts", st, err)
	}
	if got := counter(t, p.reg, "orchestra_seatgroup_restarts_total", map[string]string{"app": "alpha"}); got != 0 {
		t.Errorf("alpha, which frees its memory, was restarted %v times", got)
	}
	if got := sum(t, p.reg, "orchestra_dispatcher_failed_total"); got != 0 {
		t.Errorf("the dispatcher counted %v failed deliveries", got)
	}
}

// TestSeatGroupLeaderPutsAnIdleHolderToSleep: alpha, with a sleepAfter,
// gives its seat up once idle that long, and the next application swaps
// in with a wake alone; beta, without one, keeps the seat while idle.
func TestSeatGroupLeaderPutsAnIdleHolderToSleep(t *testing.T) {
	const idle = 500 * time.Millisecond
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, map[string]int32{"alpha": 10}, 1,
		func(o *seatPlaneOptions) { o.sleepAfter = map[string]time.Duration{"alpha": idle} })
	// The executor's idle clock starts when the dispatcher finished the
	// last request, somewhere between the send's start and the client
	// reading the end of the answer (the gateway's relay, tens of
	// milliseconds under load): the sleep comes at least sleepAfter after
	// the send started.
	sent := time.Now()
	if err := p.send("alpha", 0, 2, 16); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holds("alpha to sleep once idle for its sleepAfter", func() bool {
		st := p.status("alpha")
		return len(p.awake()) == 0 && st.Seat != nil && !st.Seat.Holding && st.State == v1alpha1.LifecycleAsleep
	}))
	if waited := time.Since(sent); waited < idle {
		t.Errorf("alpha slept %v after its last requests were sent, before its sleepAfter %v", waited, idle)
	}
	if err := p.send("beta", 0, 2, 16); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * idle)
	if a := p.awake(); len(a) != 1 || a[0] != "beta" {
		t.Errorf("awake %v, want beta (no sleepAfter) to keep the seat while idle", a)
	}
}

// TestSeatGroupConfig parses lifecycle.seatGroups as the chart renders it,
// fills in the defaults, and names what is wrong in an invalid group.
func TestSeatGroupConfig(t *testing.T) {
	const rendered = `
lease: demo-dispatcher-lifecycle
apps: []
seatGroups:
  - name: "accel"
    statefulSet: "demo-seat-accel"
    activeSeats: 1
    members:
      - {name: "alpha", priority: 10, minResidency: "10s", sleepLevel: 1, sidecarPort: 9300,
         agentSelector: "app.kubernetes.io/instance=demo,app.kubernetes.io/component=checkpoint-agent",
         agentPort: 9301, modelCheckpoint: "demo-alpha", coldPath: "alpha/m.gguf"}
      - {name: "beta", sidecarPort: 9301}
`
	var cfg lifecycle.Config
	if err := yaml.UnmarshalStrict([]byte(rendered), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaulted()
	if err := cfg.Validate([]string{"alpha", "beta"}); err != nil {
		t.Fatalf("the chart's shape is invalid: %v", err)
	}
	want := []lifecycle.SeatGroup{{Name: "accel", StatefulSet: "demo-seat-accel", Replicas: 1, ActiveSeats: 1, Members: []lifecycle.SeatMember{
		{Name: "alpha", Priority: 10, MinResidency: metav1.Duration{Duration: 10 * time.Second}, SleepLevel: 1, SidecarPort: 9300,
			Weights: lifecycle.Weights{AgentSelector: "app.kubernetes.io/instance=demo,app.kubernetes.io/component=checkpoint-agent", AgentPort: 9301,
				ModelCheckpoint: "demo-alpha", ColdPath: "alpha/m.gguf"}},
		{Name: "beta", MinResidency: metav1.Duration{Duration: 30 * time.Second}, SleepLevel: 1, SidecarPort: 9301, Weights: lifecycle.Weights{AgentPort: 9301}},
	}}}
	if d := cmp.Diff(want, cfg.SeatGroups); d != "" {
		t.Errorf("parsed and defaulted seat groups (-want +got):\n%s", d)
	}

	for _, tc := range []struct {
		name string
		mut  func(*lifecycle.Config)
		want string
	}{
		{"no StatefulSet", func(c *lifecycle.Config) { c.SeatGroups[0].StatefulSet = "" }, "statefulSet must be set"},
		{"one application", func(c *lifecycle.Config) { c.SeatGroups[0].Members = c.SeatGroups[0].Members[:1] }, "at least 2 applications"},
		{"as many seats as applications", func(c *lifecycle.Config) { c.SeatGroups[0].ActiveSeats = 2 }, "leaves nothing to multiplex"},
		{"too many replicas", func(c *lifecycle.Config) { c.SeatGroups[0].Replicas = 9 }, "replicas must be between 1 and 8, got 9"},
		{"an application not served", func(c *lifecycle.Config) { c.SeatGroups[0].Members[1].Name = "gamma" }, `application "gamma" is not in apps`},
		{"an application scaled too", func(c *lifecycle.Config) {
			c.Apps = []lifecycle.App{{Name: "alpha", RootStatefulSet: "x", MinReplicas: 1, MaxReplicas: 1, TargetQueuePerReplica: 1, Scaler: v1alpha1.ScalerBuiltin}}
		}, `application "alpha" is listed twice`},
		{"no seat port", func(c *lifecycle.Config) { c.SeatGroups[0].Members[0].SidecarPort = 0 }, "sidecarPort must be a port"},
		{"a bad sleep level", func(c *lifecycle.Config) { c.SeatGroups[0].Members[0].SleepLevel = 3 }, "sleepLevel must be 1 or 2"},
		{"a bad agent selector", func(c *lifecycle.Config) { c.SeatGroups[0].Members[0].AgentSelector = "a b" }, `application "alpha": agentSelector "a b"`},
		{"an agent without the weights' name", func(c *lifecycle.Config) { c.SeatGroups[0].Members[0].ModelCheckpoint = "" }, "agentSelector needs modelCheckpoint"},
		{"a cold path without an agent", func(c *lifecycle.Config) { c.SeatGroups[0].Members[1].ColdPath = "beta/m" }, `application "beta": coldPath needs agentSelector`},
		{"an S3 cold source without an agent", func(c *lifecycle.Config) { c.SeatGroups[0].Members[1].ColdS3 = "beta" }, `application "beta": coldS3 needs agentSelector`},
		{"both cold tiers", func(c *lifecycle.Config) {
			c.SeatGroups[0].Members[0].ColdPath, c.SeatGroups[0].Members[0].ColdS3 = "alpha/m", "alpha"
		}, `application "alpha": coldPath and coldS3 are exclusive`},
		{"a bad agent port", func(c *lifecycle.Config) { c.SeatGroups[0].Members[0].AgentPort = 70000 }, "agentPort must be a port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.SeatGroups = []lifecycle.SeatGroup{cfg.SeatGroups[0]}
			c.SeatGroups[0].Members = append([]lifecycle.SeatMember(nil), cfg.SeatGroups[0].Members...)
			tc.mut(&c)
			err := c.Validate([]string{"alpha", "beta"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestSeatGroupLeaderServesFromTwoPods runs a seat group of two pods with
// one seat each and three applications: the leader runs the policy per pod
// and the dispatcher sends an application's requests only to the pods where
// it is awake. Requests to every application at once, in rounds, are all
// answered whole; no request reaches a sleeping engine and no sleep an
// engine with requests in flight; no pod ever has two engines awake once the
// group settled; both pods serve; and the status names, per application,
// the pods where it holds a seat.
func TestSeatGroupLeaderServesFromTwoPods(t *testing.T) {
	apps := []string{"alpha", "beta", "gamma"}
	p := newSeatGroupPlane(t, apps, nil, 2, func(o *seatPlaneOptions) { o.pods = 2 })
	awakeIn := func(pod int) int {
		n := 0
		for _, e := range p.podEngines[pod] {
			if !e.weights().Sleeping {
				n++
			}
		}
		return n
	}
	eventually(t, 30*time.Second, holds("each pod to come within its budget of one awake engine", func() bool {
		return awakeIn(0) == 1 && awakeIn(1) == 1
	}))

	overBudget := countWhile(func() bool { return awakeIn(0) > 1 || awakeIn(1) > 1 })
	var spread atomic.Bool // two applications held in the two pods at once
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make([]error, len(apps))
		for i, app := range apps {
			wg.Go(func() { errs[i] = p.send(app, round, 4, 16) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		holders := map[string]string{}
		for _, app := range apps {
			if st := p.status(app); st.Seat != nil {
				for _, pod := range st.Seat.Pods {
					holders[pod] = app
				}
			}
		}
		if len(holders) == 2 && holders[seatGroupSet+"-0"] != holders[seatGroupSet+"-1"] {
			spread.Store(true)
		}
	}
	if n := overBudget(); n > 0 {
		t.Errorf("a pod had two engines awake at once %d times", n)
	}
	perPod := make([]int64, 2)
	for _, app := range apps {
		for pod := range 2 {
			e := p.podEngines[pod][app]
			perPod[pod] += e.chats.Load()
			if n := e.chatsAsleep.Load(); n > 0 {
				t.Errorf("%s in pod %d: %d requests reached the engine while it slept", app, pod, n)
			}
			if n := e.sleepsInFlight.Load(); n > 0 {
				t.Errorf("%s in pod %d: %d sleeps reached the engine with requests in flight", app, pod, n)
			}
		}
	}
	if perPod[0] == 0 || perPod[1] == 0 {
		t.Errorf("requests per pod %v: both pods must serve", perPod)
	}
	if !spread.Load() {
		t.Error("the status never showed two different applications holding the two pods' seats")
	}
	for _, app := range apps {
		st := p.status(app)
		if st.Seat == nil || st.Seat.Holding != (len(st.Seat.Pods) > 0) {
			t.Errorf("%s: lifecycle.seat %+v: holding must say whether it holds a seat in some pod", app, st.Seat)
		}
	}
	t.Logf("requests per pod: %v", perPod)
}

// TestSeatGroupLeaderRefusesAStatefulSetOfAnotherCount: the chart writes a
// group's replicas into the StatefulSet and the leader's configuration;
// the leader does not multiplex a group whose StatefulSet runs another
// count (someone scaled it), says so in an event on the StatefulSet and
// leaves the engines as they are.
func TestSeatGroupLeaderRefusesAStatefulSetOfAnotherCount(t *testing.T) {
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, nil, 2)
	var msg string
	eventually(t, 30*time.Second, holds("a SeatGroupRefused event", func() bool {
		evs, err := p.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == lifecycle.EventSeatGroupRefused && e.InvolvedObject.Name == seatGroupSet {
				msg = e.Message
				return true
			}
		}
		return false
	}))
	if !strings.Contains(msg, "runs 2 replicas") || !strings.Contains(msg, "spec.seatGroups.g.replicas") {
		t.Errorf("event message %q does not say why and what to do", msg)
	}
	if got := len(p.awake()); got != 2 {
		t.Errorf("%d engines awake after the refusal, want both (nothing multiplexes them)", got)
	}
}
