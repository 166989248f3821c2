package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
)

// Seat group test settings: four simulator applications with 16 MiB of
// weights each share one seat (a budget for one).
const (
	seatWeights = 16 << 20
	// seatAntiThrash is gamma's minResidency; the others keep their seat
	// at least seatResidency.
	seatAntiThrash = 5 * time.Second
	seatResidency  = time.Second
	// seatSleepAfter is beta's sleepAfter.
	seatSleepAfter = 4 * time.Second
)

// TestSeatGroupMultiplexesFourApplications runs config/samples/
// simulator-seatgroup.yaml with a fourth application on the real-node
// cluster: alpha (priority 10), beta (priority 5, sleepAfter 4s), gamma
// (priority 0, minResidency 5s) and delta (priority 0, its simulator
// leaking its memory at every sleep, vllm#47654) share one seat, with
// 16 MiB of weights each. The group runs as one pod with an engine and a
// sidecar per application, and each application's EndpointSlice leads
// to its own engine's port in that pod. In sequence, through the gateway,
// JetStream and the dispatcher's lifecycle leader:
//
//   - start: alpha, the highest priority, keeps the seat;
//   - round-robin: each application in turn, twice;
//   - memory not freed: delta, put to sleep for alpha, is restarted in
//     place before alpha wakes and then holds nothing;
//   - anti-thrash: beta, asked right after gamma woke, waits out gamma's
//     minResidency;
//   - priority: while beta runs a long request, delta, gamma and alpha
//     ask in that order; alpha drains beta (beta's request ends whole) and
//     is served first, then delta (the older wait), then gamma;
//   - bursty: five concurrent requests for each application at once;
//   - sleepAfter: beta, idle for its sleepAfter, gives the seat up.
//
// In every case each request is answered once and whole (a streamed answer
// with its finish reason and [DONE], no 5xx), the engines that were not
// restarted served exactly the requests sent to them, no dispatcher failed
// or redelivered a delivery, no engine refused a request while asleep or a
// sleep with requests in flight, every wake verified its weights, and
// sampled every 250 ms the engines never held more than one application's
// weights in two samples in a row. The group pod is never replaced and no
// container restarts: delta's restart happens inside its engine container.
// The status reports the seat holder, each application's swaps and last
// swap time, and the leader's metrics its swaps, swap times, seat waits
// and delta's restarts.
func TestSeatGroupMultiplexesFourApplications(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-seatgroup")
	start := time.Now()
	logf := stepLogf(t)

	apps := []string{"alpha", "beta", "delta", "gamma"} // in name order: engine i on 8080+i
	port := map[string]int{}
	name, token := applySeatSample(ctx, t, ns, "simulator-seatgroup.yaml", func(obj *unstructured.Unstructured) {
		gammaSpec, _, err := unstructured.NestedMap(obj.Object, "spec", "applications", "gamma")
		if err != nil || gammaSpec == nil {
			t.Fatalf("the sample has no application gamma: %v", err)
		}
		must(t, unstructured.SetNestedMap(obj.Object, gammaSpec, "spec", "applications", "delta"))
		// The device the engines share holds one application's weights.
		must(t, unstructured.SetNestedField(obj.Object, strconv.Itoa(seatWeights), "spec", "seatGroups", "accel", "deviceMemory"))
		for i, app := range apps {
			port[app] = 8080 + i
			args := []any{fmt.Sprintf("--weights-bytes=%d", seatWeights), "--ttft=20ms", "--itl=5ms", "--output-tokens=600"}
			residency := seatResidency
			switch app {
			case "beta":
				must(t, unstructured.SetNestedField(obj.Object, int64(5), "spec", "applications", app, "lifecycle", "seat", "priority"))
				must(t, unstructured.SetNestedField(obj.Object, seatSleepAfter.String(), "spec", "applications", app, "lifecycle", "sleepAfter"))
			case "gamma":
				residency = seatAntiThrash
			case "delta":
				args = append(args, "--fault-sleep-leak")
			}
			must(t, unstructured.SetNestedSlice(obj.Object, args, "spec", "applications", app, "runtime", "args"))
			must(t, unstructured.SetNestedField(obj.Object, residency.String(), "spec", "applications", app, "lifecycle", "seat", "minResidency"))
		}
	})
	logf("Ready")

	groupSel := "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=seat-group,modelorchestra.io/seat-group=accel"
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: groupSel})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods of seat group accel, want 1", len(pods.Items))
	}
	group := pods.Items[0]
	if n := len(group.Spec.Containers); n != 2*len(apps) {
		t.Errorf("group pod %s has %d containers, want an engine and a seat for each of %d applications", group.Name, n, len(apps))
	}
	roots, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=root"})
	if err != nil {
		t.Fatal(err)
	}
	if len(roots.Items) != 0 {
		t.Errorf("%d root pods run besides the group pod; want none", len(roots.Items))
	}
	for _, app := range apps {
		wantPort := int32(port[app])
		eventually(t, time.Minute, func() error {
			slices, err := env.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name + "-" + app})
			if err != nil {
				return err
			}
			for _, es := range slices.Items {
				for _, p := range es.Ports {
					if p.Name == nil || *p.Name != "http" || p.Port == nil || *p.Port != wantPort {
						continue
					}
					for _, ep := range es.Endpoints {
						if ep.TargetRef != nil && ep.TargetRef.Name == group.Name && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
							return nil
						}
					}
				}
			}
			return fmt.Errorf("no ready endpoint %s:%d (http) in the EndpointSlices of %s-%s", group.Name, wantPort, name, app)
		})
	}

	status := func() (map[string]v1alpha1.ApplicationStatus, error) { return appStatuses(ctx, ns, name) }
	holders := func(st map[string]v1alpha1.ApplicationStatus) []string {
		var h []string
		for _, app := range apps {
			if lc := st[app].Lifecycle; lc != nil && lc.Seat != nil && lc.Seat.Holding {
				h = append(h, app)
			}
		}
		return h
	}
	// wantHolders waits until exactly want hold the seat (none or one)
	// and every other application is Asleep. It fails t, the subtest
	// that calls it.
	wantHolders := func(t *testing.T, within time.Duration, want ...string) {
		t.Helper()
		eventually(t, within, func() error {
			st, err := status()
			if err != nil {
				return err
			}
			if h := holders(st); !slices.Equal(h, want) {
				return fmt.Errorf("holders %v, want %v; status %s", h, want, jsonOf(st))
			}
			for _, other := range apps {
				if !slices.Contains(want, other) && st[other].Phase != v1alpha1.PhaseAsleep {
					return fmt.Errorf("%s has phase %s, want Asleep while %v hold the seat", other, st[other].Phase, want)
				}
			}
			return nil
		})
	}

	// The memory monitor: the engines' resident weights, sampled.
	weights := func(app string) (residentBytes int64, sleeping bool, err error) {
		raw, err := env.cs.CoreV1().Pods(ns).ProxyGet("http", group.Name, strconv.Itoa(port[app]), "/orchestra/weights", nil).DoRaw(ctx)
		if err != nil {
			return 0, false, err
		}
		var w struct {
			ResidentBytes int64 `json:"residentBytes"`
			Sleeping      bool  `json:"sleeping"`
		}
		if err := json.Unmarshal(raw, &w); err != nil {
			return 0, false, fmt.Errorf("%s's weights: %w", app, err)
		}
		return w.ResidentBytes, w.Sleeping, nil
	}

	var overBudget []string
	var samples int
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	monitorDone := make(chan struct{})
	monitoring := false
	startMonitor := func() {
		monitoring = true
		go func() {
			defer close(monitorDone)
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			var last string
			for {
				select {
				case <-monitorCtx.Done():
					return
				case <-tick.C:
				}
				var sum int64
				var parts []string
				ok := true
				for _, app := range apps {
					n, _, err := weights(app)
					if err != nil {
						ok = false
						break
					}
					sum += n
					parts = append(parts, fmt.Sprintf("%s %d MiB", app, n>>20))
				}
				if !ok {
					continue
				}
				samples++
				// One application's weights, and a margin for reads that
				// straddle a swap (the engines are read one after another):
				// over budget in two samples in a row is a wake next to an
				// engine that still holds its memory.
				if sum > seatWeights {
					now := fmt.Sprintf("[%.1fs] %s", time.Since(start).Seconds(), strings.Join(parts, ", "))
					if last != "" {
						overBudget = append(overBudget, last+" then "+now)
					}
					last = now
				} else {
					last = ""
				}
			}
		}()
	}
	defer func() {
		stopMonitor()
		if monitoring {
			<-monitorDone
		}
	}()
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	chats := newSeatChats(ctx, base, token)
	ask, wantAllAnswered, sent := chats.ask, chats.wantAllAnswered, chats.sent
	var mu sync.Mutex // order
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, "alpha", chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
	// The engines' counts from here on: the first chat may have been
	// retried before the gateway was reachable.
	baseline := map[string]float64{}
	for _, app := range apps {
		m, err := scrape(ctx, ns, group.Name, strconv.Itoa(port[app]))
		if err != nil {
			t.Fatal(err)
		}
		baseline[app] = metricValue(m, "vllm:request_success_total")
	}
	failedBefore := seatDeliveryFailures(ctx, t, ns, apps)

	t.Run("start", func(t *testing.T) {
		// The leader brings the group within its one seat: alpha, the
		// highest priority, keeps it.
		wantHolders(t, time.Minute, "alpha")
		logf("alpha holds the seat; the others are Asleep")
		// The engines share one device with room for one application's
		// weights, alpha's now: a wake behind the leader's back fails and
		// names who holds the memory.
		for _, c := range group.Spec.Containers {
			if strings.HasPrefix(c.Name, "engine-") && !slices.Contains(c.Args, fmt.Sprintf("--device-capacity=%d", seatWeights)) {
				t.Errorf("%s args %q: want the group's shared device of %d bytes", c.Name, c.Args, seatWeights)
			}
		}
		raw, err := env.cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(group.Name + ":" + strconv.Itoa(port["gamma"])).
			SubResource("proxy").Suffix("wake_up").DoRaw(ctx)
		if got := fmt.Sprint(string(raw), err); err == nil || !strings.Contains(got, "device memory exhausted") || !strings.Contains(got, "held by alpha") {
			t.Errorf("waking gamma while alpha holds the device: %s; want device memory exhausted, held by alpha", got)
		}
	})
	// From here on the group is within its seat (every engine of a new
	// group pod starts awake).
	startMonitor()

	t.Run("round-robin", func(t *testing.T) {
		began := time.Now()
		for range 2 {
			for _, app := range apps {
				ask(app, 16)
			}
		}
		wantAllAnswered(t)
		wantHolders(t, 30*time.Second, "gamma") // the last asked
		logf("round-robin: %d chats in %.1fs", 2*len(apps), time.Since(began).Seconds())
	})

	t.Run("memory-not-freed", func(t *testing.T) {
		before := leaderMetric(ctx, t, ns, "orchestra_seatgroup_restarts_total", `app="delta"`, `reason="memory_not_freed"`)
		if before < 1 {
			t.Errorf("delta slept once in the round-robin and was restarted %g times for memory not freed, want at least 1", before)
		}
		ask("delta", 16)
		n, _, err := weights("delta")
		if err != nil || n != seatWeights {
			t.Errorf("awake delta holds %d bytes (%v), want its %d", n, err, seatWeights)
		}
		began := time.Now()
		ask("alpha", 16)
		wantAllAnswered(t)
		logf("memory not freed: alpha answered %.1fs after delta's turn", time.Since(began).Seconds())
		if after := leaderMetric(ctx, t, ns, "orchestra_seatgroup_restarts_total", `app="delta"`, `reason="memory_not_freed"`); after != before+1 {
			t.Errorf("delta restarted %g times for memory not freed, want %g: put to sleep for alpha, it kept its memory", after, before+1)
		}
		n, sleeping, err := weights("delta")
		if err != nil || n != 0 || !sleeping {
			t.Errorf("delta after its restart: %d bytes resident, sleeping %v (%v); want 0, asleep", n, sleeping, err)
		}
		for _, other := range apps {
			if other == "delta" {
				continue
			}
			if n := leaderMetric(ctx, t, ns, "orchestra_seatgroup_restarts_total", `app="`+other+`"`); n != 0 {
				t.Errorf("%s was restarted %g times; only delta leaks", other, n)
			}
		}
	})

	t.Run("anti-thrash", func(t *testing.T) {
		began := time.Now()
		ask("gamma", 16)
		asked := time.Since(began)
		ask("beta", 16)
		took := time.Since(began)
		wantAllAnswered(t)
		logf("anti-thrash: gamma answered after %.1fs, beta (priority 5) after %.1fs", asked.Seconds(), took.Seconds())
		if took < seatAntiThrash {
			t.Errorf("beta was answered %.1fs after gamma was asked, within gamma's minResidency %s: gamma gave its seat up early", took.Seconds(), seatAntiThrash)
		}
	})

	t.Run("priority", func(t *testing.T) {
		// beta holds the seat; a long request keeps it busy (600 tokens
		// 5 ms apart, about 3 s).
		var wg sync.WaitGroup
		var long *stack.ChatResult
		// gamma, served last, waits seconds for a seat: its status says so.
		var waited string
		watchCtx, stopWatch := context.WithCancel(ctx)
		var watch sync.WaitGroup
		watch.Go(func() {
			for watchCtx.Err() == nil {
				if st, err := status(); err == nil {
					if seat := st["gamma"].Lifecycle.Seat; seat != nil && !seat.Holding && seat.WaitingSeconds != "" {
						waited = seat.WaitingSeconds
						return
					}
				}
				time.Sleep(250 * time.Millisecond)
			}
		})
		wg.Go(func() { long = ask("beta", 600) })
		time.Sleep(500 * time.Millisecond)
		var order []string
		for _, app := range []string{"delta", "gamma", "alpha"} {
			wg.Go(func() {
				if ask(app, 16) != nil {
					mu.Lock()
					order = append(order, app)
					mu.Unlock()
				}
			})
			time.Sleep(150 * time.Millisecond)
		}
		wg.Wait()
		stopWatch()
		watch.Wait()
		wantAllAnswered(t)
		if waited == "" {
			t.Error("gamma's status never showed lifecycle.seat.waitingSeconds while it waited for the seat")
		} else {
			logf("priority: gamma's status showed waitingSeconds %s", waited)
		}
		if long != nil && long.Chunks < 600 {
			t.Errorf("beta's long request, drained for alpha, ended after %d chunks, want 600", long.Chunks)
		}
		logf("priority: answered in the order %v", order)
		if want := []string{"alpha", "delta", "gamma"}; !slices.Equal(order, want) {
			t.Errorf("answers in the order %v, want %v (priority, then the oldest wait)", order, want)
		}
	})

	t.Run("bursty", func(t *testing.T) {
		began := time.Now()
		var wg sync.WaitGroup
		for _, app := range apps {
			for range 5 {
				wg.Go(func() { ask(app, 16) })
			}
		}
		wg.Wait()
		wantAllAnswered(t)
		logf("bursty: %d concurrent chats in %.1fs", 5*len(apps), time.Since(began).Seconds())
	})

	t.Run("sleepAfter", func(t *testing.T) {
		ask("beta", 16)
		answered := time.Now()
		wantAllAnswered(t)
		wantHolders(t, seatSleepAfter, "beta")
		wantHolders(t, seatSleepAfter+30*time.Second) // nobody
		idle := time.Since(answered)
		logf("sleepAfter: beta gave the seat up after %.1fs idle", idle.Seconds())
		if idle < seatSleepAfter-time.Second {
			t.Errorf("beta gave its seat up %.1fs after its last answer, before its sleepAfter %s", idle.Seconds(), seatSleepAfter)
		}
	})

	stopMonitor()
	<-monitorDone
	monitoring = false
	if len(overBudget) > 0 {
		t.Errorf("the engines held more than one application's weights (%d MiB) in two samples in a row: %s", seatWeights>>20, strings.Join(overBudget, "; "))
	}
	logf("memory: %d samples, %d over budget", samples, len(overBudget))

	st, err := status()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, app := range apps {
		total += sent[app]
		seat := st[app].Lifecycle.Seat
		if seat == nil || seat.SwapsIn < 2 {
			t.Errorf("%s: lifecycle.seat %s, want at least 2 swaps in", app, jsonOf(seat))
			continue
		}
		if secs, err := strconv.ParseFloat(seat.LastSwapSeconds, 64); err != nil || secs <= 0 {
			t.Errorf("%s: lastSwapSeconds %q, want a positive number", app, seat.LastSwapSeconds)
		}
		m, err := scrape(ctx, ns, group.Name, strconv.Itoa(port[app]))
		if err != nil {
			t.Fatal(err)
		}
		if n := metricValue(m, "orchestra_sim_requests_refused_asleep_total"); n != 0 {
			t.Errorf("%s's engine refused %g requests: one was sent to it while it slept", app, n)
		}
		if n := metricValue(m, "orchestra_sim_sleeps_total", `result="refused"`); n != 0 {
			t.Errorf("%s's engine refused %g sleeps: one reached it with requests in flight", app, n)
		}
		if n := metricValue(m, "orchestra_sim_wakes_total", `result="mismatch"`); n != 0 {
			t.Errorf("%s's engine: %g wakes failed the hash verification", app, n)
		}
		if app != "delta" { // delta's counts start again at each restart
			if got := metricValue(m, "vllm:request_success_total") - baseline[app]; got != float64(sent[app]) {
				t.Errorf("%s's engine served %g requests, %d were sent: each must be served exactly once", app, got, sent[app])
			}
		}
		t.Logf("%s: %d requests, %d swaps in, the last %ss", app, sent[app], seat.SwapsIn, seat.LastSwapSeconds)
	}
	if grew := grown(failedBefore, seatDeliveryFailures(ctx, t, ns, apps)); len(grew) > 0 {
		t.Errorf("the dispatchers failed or redelivered deliveries:\n%s", strings.Join(grew, "\n"))
	}
	for _, m := range []string{"orchestra_seatgroup_swaps_total", "orchestra_seatgroup_swap_seconds_count", "orchestra_seatgroup_seat_wait_seconds_count"} {
		if n := leaderMetric(ctx, t, ns, m, `group="accel"`); n == 0 {
			t.Errorf("the leader reports no %s", m)
		}
	}
	logf("%d requests answered whole, %d swaps, %.0f restarts of delta", total,
		int(leaderMetric(ctx, t, ns, "orchestra_seatgroup_swaps_total", `group="accel"`)),
		leaderMetric(ctx, t, ns, "orchestra_seatgroup_restarts_total", `app="delta"`))

	p, err := env.cs.CoreV1().Pods(ns).Get(ctx, group.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != group.UID {
		t.Errorf("group pod %s was replaced", group.Name)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("container %s of the group pod restarted %d times (last: %+v)", s.Name, s.RestartCount, s.LastTerminationState.Terminated)
		}
		if !s.Ready {
			t.Errorf("container %s of the group pod is not ready", s.Name)
		}
	}
}

// dispatcherMetrics reads the /metrics of every running dispatcher pod
// (through the API server's pod proxy), by pod.
func dispatcherMetrics(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=dispatcher"})
	if err != nil {
		t.Fatalf("listing dispatcher pods: %v", err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name != "metrics" {
					continue
				}
				m, err := scrape(ctx, ns, p.Name, strconv.Itoa(int(cp.ContainerPort)))
				if err != nil {
					t.Fatal(err)
				}
				out[p.Name] = m
			}
		}
	}
	return out
}

// leaderMetric sums a metric over the dispatchers (only the lifecycle
// leader reports the seat group's).
func leaderMetric(ctx context.Context, t *testing.T, ns, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, m := range dispatcherMetrics(ctx, t, ns) {
		sum += metricValue(m, name, labels...)
	}
	return sum
}

// seatDeliveryFailures reads the dispatchers' failed attempts and
// redeliveries of apps: series, prefixed by the pod, to value.
func seatDeliveryFailures(ctx context.Context, t *testing.T, ns string, apps []string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for pod, m := range dispatcherMetrics(ctx, t, ns) {
		for _, name := range []string{"orchestra_dispatcher_failed_total", "orchestra_dispatcher_redelivered_total"} {
			for _, app := range apps {
				out[pod+" "+name+" "+app] = metricValue(m, name, `app="`+app+`"`)
			}
		}
	}
	return out
}

// applySeatSample applies a seat group sample of config/samples in ns,
// through a NodePort gateway without limits, after edit changed it; it
// waits until the orchestra is Ready and returns its name and a token.
func applySeatSample(ctx context.Context, t *testing.T, ns, sample string, edit func(obj *unstructured.Unstructured)) (name, token string) {
	t.Helper()
	token = apiToken(ctx, t, ns)
	obj, err := stack.LoadResource(filepath.Join(env.root, "config", "samples", sample))
	if err != nil {
		t.Fatal(err)
	}
	obj.SetNamespace(ns)
	must(t, stack.MirrorModel(obj, env.hub))
	must(t, unstructured.SetNestedField(obj.Object, "NodePort", "spec", "gateway", "service", "type"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))
	edit(obj)
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, obj.GetName())
	return obj.GetName(), token
}

// appStatuses returns the orchestra's application statuses.
func appStatuses(ctx context.Context, ns, name string) (map[string]v1alpha1.ApplicationStatus, error) {
	mo, err := stack.Get(ctx, env.dyn, ns, name)
	if err != nil {
		return nil, err
	}
	return mo.Status.Applications, nil
}

// seatChats sends streamed chats through the gateway and counts them: each
// must be answered once and whole (a finish reason and [DONE]).
type seatChats struct {
	ctx         context.Context
	base, token string

	mu       sync.Mutex
	sent     map[string]int
	failures []string
}

func newSeatChats(ctx context.Context, base, token string) *seatChats {
	return &seatChats{ctx: ctx, base: base, token: token, sent: map[string]int{}}
}

// ask sends one chat to app and returns its answer, or nil after
// recording why it was not answered whole.
func (c *seatChats) ask(app string, maxTokens int) *stack.ChatResult {
	c.mu.Lock()
	c.sent[app]++
	c.mu.Unlock()
	res, err := stack.StreamChat(c.ctx, c.base, c.token, app, chatPrompt, maxTokens, nil)
	switch {
	case err != nil:
		err = fmt.Errorf("%s: %w", app, err)
	case !res.Done || res.FinishReason == "" || res.Chunks == 0:
		err = fmt.Errorf("%s: answer cut: %+v", app, res)
	}
	if err != nil {
		c.mu.Lock()
		c.failures = append(c.failures, err.Error())
		c.mu.Unlock()
		return nil
	}
	return res
}

// wantAllAnswered fails t for every chat not answered whole since the
// last call.
func (c *seatChats) wantAllAnswered(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failures) > 0 {
		t.Errorf("%d requests not answered whole: %s", len(c.failures), strings.Join(c.failures, "; "))
		c.failures = nil
	}
}
