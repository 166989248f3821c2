package lifecycle_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
	"github.com/model-orchestra/operator/internal/seatgroup/simengine"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"
)

const seatGroupSet = "demo-seat-g"

// seatEngine is one application of the group pod: a simulator with real
// weights and sleep mode, restartable in place as in a group pod
// (orchestra-sim --restartable), and its real seat agent over HTTP.
type seatEngine struct {
	name   string
	eng    *simengine.Engine
	engine *httptest.Server
	seat   *httptest.Server
	// sleepsInFlight counts sleeps that reached the engine while it ran
	// requests.
	sleepsInFlight atomic.Int64
	// chats counts the inference requests that reached the engine, and
	// chatsAsleep those that reached it while it slept.
	chats, chatsAsleep atomic.Int64
	// weightsFile, when set, is the model file the engine loads (in the
	// node agent's cold tier), under the name weightsName in its tiers;
	// warm is its warm tier directory.
	weightsFile, weightsName, warm string
}

// seatGroupPlane is a seat group's pod (one engine and seat agent per
// application, all on 127.0.0.1, told apart by their ports) on a fake
// cluster, with a real dispatcher whose lifecycle leader multiplexes them.
type seatGroupPlane struct {
	t       *testing.T
	js      jetstream.JetStream
	cs      *fake.Clientset
	client  *natsqueue.Client
	reg     *prometheus.Registry
	engines map[string]*seatEngine
	// podEngines are the engines of each pod of the group (pod i at
	// 127.0.0.<i+1>, its engines and seats at pod 0's ports);
	// podEngines[0] is engines.
	podEngines []map[string]*seatEngine
	// agent is the node agent of the group pods' node (seatPlaneOptions
	// agent), agentWarm its warm tier; while agentHangs is set it answers
	// no report of a wake or a sleep until the caller gives up.
	agent                          *httptest.Server
	agentHot, agentWarm, agentCold string
	agentHangs                     atomic.Bool
}

// weights reports the engine's weights; a stopped (restarted) engine
// sleeps with nothing resident.
func (e *seatEngine) weights() sim.WeightsStatus {
	if s := e.eng.Simulator(); s != nil {
		return s.WeightsStatus()
	}
	return sim.WeightsStatus{Sleeping: true}
}

// seatPlaneOptions change some applications of a seat group plane.
type seatPlaneOptions struct {
	// leak makes these applications' engines keep their memory at every
	// sleep (vllm#47654).
	leak map[string]bool
	// sleepAfter is these applications' lifecycle.sleepAfter.
	sleepAfter map[string]time.Duration
	// pods is the group's pods (its configured replicas); default 1.
	pods int
	// agent runs a node agent on the group pods' node, to which the
	// leader reports the swaps.
	agent bool
	// fromCold are applications (with agent, of a group of one pod)
	// whose engine sleeps at level 2 and loads a model file from the
	// node agent's cold tier, its hot and warm tiers the agent's: the
	// agent can promote their weights ahead of a predicted wake.
	fromCold map[string]bool
}

func newSeatGroupPlane(t *testing.T, apps []string, priority map[string]int32, replicas int32, opts ...func(*seatPlaneOptions)) *seatGroupPlane {
	t.Helper()
	var o seatPlaneOptions
	for _, f := range opts {
		f(&o)
	}
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	p := &seatGroupPlane{t: t, js: js, engines: map[string]*seatEngine{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	labels := map[string]string{"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "seat-group", "modelorchestra.io/seat-group": "g"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: seatGroupSet, Namespace: ns, Generation: 1, Labels: labels},
		Spec:       appsv1.StatefulSetSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels}},
		Status:     appsv1.StatefulSetStatus{ObservedGeneration: 1, Replicas: 1, ReadyReplicas: 1, UpdatedReplicas: 1},
	}
	pods := max(o.pods, 1)
	objs := []runtime.Object{sts}
	agentSelector := "app.kubernetes.io/instance=" + orch + ",app.kubernetes.io/component=checkpoint-agent"
	if o.agent {
		p.startAgent(ctx)
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: orch + "-agent-x1", Namespace: ns, Labels: map[string]string{
				"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "checkpoint-agent"}},
			Spec:   corev1.PodSpec{NodeName: "node-a"},
			Status: corev1.PodStatus{PodIP: "127.0.0.1", Phase: corev1.PodRunning},
		})
	}
	var addrs []string
	for i := range pods {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		addrs = append(addrs, ip)
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", seatGroupSet, i), Namespace: ns, Labels: labels},
			Spec:       corev1.PodSpec{NodeName: "node-a"},
			Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		})
		p.podEngines = append(p.podEngines, map[string]*seatEngine{})
	}
	p.engines = p.podEngines[0]
	p.cs = fake.NewClientset(objs...)

	var hots []string
	for range addrs {
		hots = append(hots, t.TempDir())
	}
	group := lifecycle.SeatGroup{Name: "g", StatefulSet: seatGroupSet, ActiveSeats: 1, Replicas: int32(o.pods)}
	dcfg := dispatch.Default()
	dcfg.Orchestra, dcfg.Namespace, dcfg.NATS.URL = orch, ns, srv.ClientURL()
	var specs []natsqueue.ConsumerSpec
	for i, name := range apps {
		var e *seatEngine
		for pi, addr := range addrs {
			pe := &seatEngine{name: name}
			hot := hots[pi]
			if o.fromCold[name] {
				pe.weightsFile, pe.weightsName = writeModelFile(t, p.agentCold, name, i), "demo-"+name
				hot, pe.warm = filepath.Join(p.agentHot, ns), filepath.Join(p.agentWarm, ns)
			}
			// Pod pi serves at pod 0's ports on its own address, with
			// its own hot tier.
			startSeatEngine(ctx, t, pe, i, hot, addr, p.podEngines[0][name], o.leak[name])
			p.podEngines[pi][name] = pe
			if pi == 0 {
				e = pe
			}
		}
		// The application's Service leads to its engine in the group pod,
		// ready whether the engine is awake or asleep (the pod's
		// readiness is one for all its engines).
		u, _ := url.Parse(e.engine.URL)
		_, portStr, _ := strings.Cut(u.Host, ":")
		enginePort, _ := strconv.Atoi(portStr)
		service := orch + "-" + name
		ready := true
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: service + "-x", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(enginePort))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		}
		if err := p.cs.Tracker().Add(es); err != nil {
			t.Fatal(err)
		}
		dcfg.Apps = append(dcfg.Apps, dispatch.App{Name: name, Service: service, PortName: "http", Port: 1, MaxConcurrency: 4})
		specs = append(specs, natsqueue.ConsumerSpec{App: name, AckWait: 30 * time.Second, MaxAckPending: 100})
		member := lifecycle.SeatMember{Name: name, SeatPort: port(t, e.seat), Priority: priority[name],
			MinResidency: metav1.Duration{Duration: 100 * time.Millisecond}, SleepAfter: metav1.Duration{Duration: o.sleepAfter[name]}}
		if o.agent {
			member.AgentSelector, member.AgentPort, member.ModelCheckpoint = agentSelector, port(t, p.agent), "demo-"+name
		}
		if o.fromCold[name] {
			member.SleepLevel, member.ColdPath = 2, name+".bin"
		}
		group.Members = append(group.Members, member)
		for pi := range addrs {
			pe := p.podEngines[pi][name]
			eventually(t, 5*time.Second, holds(name+"'s seat to see its engine awake", func() bool {
				st, err := pe.seatState()
				return err == nil && st.State == sidecarapi.Awake
			}))
		}
	}
	err = natsqueue.Provision(context.Background(), js, natsqueue.StreamSpec{Names: names, Replicas: 1, MaxAge: time.Hour, Duplicates: time.Minute, DeadLetterMaxAge: time.Hour}, specs)
	if err != nil {
		t.Fatal(err)
	}

	dcfg.Lifecycle = &lifecycle.Config{Lease: "demo-lifecycle", Tick: metav1.Duration{Duration: 50 * time.Millisecond},
		SeatGroups: []lifecycle.SeatGroup{group}}
	dcfg.AckWait = metav1.Duration{Duration: 5 * time.Second}
	dcfg.HeartbeatInterval = metav1.Duration{Duration: 200 * time.Millisecond}
	if err := dcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	p.reg = prometheus.NewRegistry()
	d, err := dispatch.New(dcfg, dnc, slog.New(slog.NewTextHandler(testWriter{t}, nil)), dispatch.WithKubernetes(p.cs), dispatch.WithRegistry(p.reg))
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(dctx) }()
	t.Cleanup(func() { dcancel(); <-done; dnc.Close() })

	qc := natsqueue.DefaultClientConfig()
	qc.Orchestra = orch
	cnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	p.client, err = natsqueue.NewClient(cnc, qc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.client.Close)
	return p
}

// startAgent starts the node agent of the group pods' node, with its hot
// and warm tiers in temporary directories.
func (p *seatGroupPlane) startAgent(ctx context.Context) {
	t := p.t
	dir := t.TempDir()
	ac := checkpoint.Default()
	ac.Role = checkpoint.RoleNode
	p.agentHot, p.agentWarm, p.agentCold = filepath.Join(dir, "hot"), filepath.Join(dir, "warm"), filepath.Join(dir, "cold")
	// The namespace's tier directories exist before the engines start
	// (the chart mounts them as hostPath DirectoryOrCreate).
	for _, d := range []string{filepath.Join(p.agentHot, ns), filepath.Join(p.agentWarm, ns), p.agentCold} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ac.Node.Store = checkpoint.StoreConfig{HotDir: p.agentHot, WarmDir: p.agentWarm, Budgets: checkpoint.Budgets{Hot: 64 << 20, Warm: 64 << 20}}
	ac.Node.MeasureBytes, ac.Node.CRIU, ac.Node.RuntimeVersion = 1<<20, "", "containerd://1.6.20"
	ac.Node.ColdDir = p.agentCold
	// Plan often, and promote whatever is predicted at all: the test's
	// wakes come a second apart.
	ac.Node.PromoteInterval, ac.Node.PromoteMargin = 100*time.Millisecond, time.Hour
	ah, err := checkpoint.Start(ctx, ac, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("agent", "node"))
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	p.agent = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.agentHangs.Load() && (r.URL.Path == "/wakes" || r.URL.Path == "/sleeps") {
			// Read the body, so that the server notices the caller
			// giving up.
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
			case <-released:
			}
			return
		}
		ah.ServeHTTP(w, r)
	}))
	t.Cleanup(p.agent.Close)
	t.Cleanup(func() { close(released) }) // first: Close waits for the handlers
}

// agentReport is the node agent's report.
func (p *seatGroupPlane) agentReport() checkpoint.NodeReport {
	p.t.Helper()
	var report checkpoint.NodeReport
	resp, err := http.Get(p.agent.URL + "/report")
	if err != nil {
		p.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if err := json.NewDecoder(resp.Body).Decode(&report); err != nil {
		p.t.Fatal(err)
	}
	return report
}

// writeModelFile writes app i's 4 MiB model file into dir and returns its
// path.
func writeModelFile(t *testing.T, dir, app string, i int) string {
	t.Helper()
	w := make([]byte, 4<<20)
	for j := range w {
		w[j] = byte(j*7 + j>>11 + i)
	}
	path := filepath.Join(dir, app+".bin")
	if err := os.WriteFile(path, w, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// history is the node agent's persisted history of app's weights (nil
// while it has none).
func (p *seatGroupPlane) history(app string) *checkpoint.WakeHistory {
	h, err := agentHistory(p.agentWarm, "demo-"+app)
	if err != nil {
		return nil
	}
	return &h
}

func (e *seatEngine) seatState() (sidecarapi.Status, error) {
	var st sidecarapi.Status
	resp, err := http.Get(e.seat.URL + "/state")
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// awake names the applications whose engines are awake.
func (p *seatGroupPlane) awake() []string {
	var out []string
	for name, e := range p.engines {
		if !e.weights().Sleeping {
			out = append(out, name)
		}
	}
	return out
}

// status is app's lifecycle status as the operator reads it: the group
// StatefulSet's annotation for the application.
func (p *seatGroupPlane) status(app string) v1alpha1.LifecycleStatus {
	sts, err := p.cs.AppsV1().StatefulSets(ns).Get(context.Background(), seatGroupSet, metav1.GetOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	var st v1alpha1.LifecycleStatus
	if raw, ok := sts.Annotations[v1alpha1.LifecycleStatusAnnotation(app, true)]; ok {
		_ = json.Unmarshal([]byte(raw), &st)
	}
	return st
}

// send sends n concurrent streamed chats to app and reads every answer to
// its end; it names each request that failed and how.
func (p *seatGroupPlane) send(app string, round, n, tokens int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("%s-%s-%d-%d", p.t.Name(), app, round, i)
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"request %d"}],"stream":true,"max_tokens":%d}`, app, i, tokens)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r, err := p.client.Submit(ctx, queue.Job{ID: id, App: app, Path: "/v1/chat/completions", Body: []byte(body), Stream: true})
			if err != nil {
				errs[i] = fmt.Errorf("%s: submit: %w", id, err)
				return
			}
			defer func() { _ = r.Close() }()
			status, got, err := readAll(ctx, r)
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("%s: %w", id, err)
			case status != 200:
				errs[i] = fmt.Errorf("%s: status %d: %s", id, status, got)
			case !strings.Contains(string(got), "data: [DONE]"):
				errs[i] = fmt.Errorf("%s: stream cut: %q", id, got)
			}
		})
	}
	wg.Wait()
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("%d of %d requests to %s failed:\n%s", len(msgs), n, app, strings.Join(msgs, "\n"))
	}
	return nil
}

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
		return sumLabeled(t, p.reg, "orchestra_seatgroup_restarts_total", map[string]string{"app": "beta", "reason": "memory_not_freed"})
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
	if got := sumLabeled(t, p.reg, "orchestra_seatgroup_restarts_total", map[string]string{"app": "alpha"}); got != 0 {
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
      - {name: "alpha", priority: 10, minResidency: "10s", sleepLevel: 1, seatPort: 9300,
         agentSelector: "app.kubernetes.io/instance=demo,app.kubernetes.io/component=checkpoint-agent",
         agentPort: 9301, modelCheckpoint: "demo-alpha", coldPath: "alpha/m.gguf"}
      - {name: "beta", seatPort: 9301}
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
		{Name: "alpha", Priority: 10, MinResidency: metav1.Duration{Duration: 10 * time.Second}, SleepLevel: 1, SeatPort: 9300,
			AgentSelector: "app.kubernetes.io/instance=demo,app.kubernetes.io/component=checkpoint-agent", AgentPort: 9301,
			ModelCheckpoint: "demo-alpha", ColdPath: "alpha/m.gguf"},
		{Name: "beta", MinResidency: metav1.Duration{Duration: 30 * time.Second}, SleepLevel: 1, SeatPort: 9301, AgentPort: 9301},
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
		{"no seat port", func(c *lifecycle.Config) { c.SeatGroups[0].Members[0].SeatPort = 0 }, "seatPort must be a port"},
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

// sumLabeled adds up the series of a metric family in reg whose labels
// include every one of labels.
func sumLabeled(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			total += value(m)
		}
	}
	return total
}

// startSeatEngine starts app i's engine (a restartable simulator with
// 4 MiB of weights, its hot tier in hot) and its real seat agent on addr,
// at random ports, or at like's ports when like is set (another pod's).
func startSeatEngine(ctx context.Context, t *testing.T, e *seatEngine, i int, hot, addr string, like *seatEngine, leak bool) {
	t.Helper()
	sc := dataplanetest.FastSim()
	sc.Model = e.name
	sc.InterTokenLatency = 2 * time.Millisecond // requests last long enough to be in flight
	sc.Weights = sim.Weights{Bytes: 4 << 20, Seed: uint64(i + 1)}
	if e.weightsFile != "" {
		sc.Weights = sim.Weights{File: e.weightsFile, Name: e.weightsName}
	}
	sc.Sleep = sim.Sleep{Enabled: true, HotDir: hot, WarmDir: e.warm}
	sc.Faults.SleepLeak = leak
	var err error
	e.eng, err = simengine.New(sc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.eng.Close)
	listen := func(srv *httptest.Server, likeURL string) {
		port := "0"
		if likeURL != "" {
			u, _ := url.Parse(likeURL)
			port = u.Port()
		}
		l, err := net.Listen("tcp", net.JoinHostPort(addr, port))
		if err != nil {
			t.Fatal(err)
		}
		_ = srv.Listener.Close()
		srv.Listener = l
		srv.Start()
		t.Cleanup(srv.Close)
	}
	e.engine = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := e.weights()
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/sleep":
			if !st.Sleeping && st.InFlight > 0 {
				e.sleepsInFlight.Add(1)
			}
		case r.URL.Path == "/v1/chat/completions":
			e.chats.Add(1)
			if st.Sleeping {
				e.chatsAsleep.Add(1)
			}
		}
		e.eng.ServeHTTP(w, r)
	}))
	var likeEngine, likeSeat string
	if like != nil {
		likeEngine, likeSeat = like.engine.URL, like.seat.URL
	}
	listen(e.engine, likeEngine)
	ac := checkpoint.Default()
	ac.Seat.Engine = checkpoint.EngineConfig{Kind: checkpoint.EngineSimulator, URL: e.engine.URL, PollInterval: 5 * time.Millisecond}
	ac.Seat.PollInterval, ac.Seat.DrainTimeout = 5*time.Millisecond, 10*time.Second
	sh, err := checkpoint.Start(ctx, ac, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("seat", e.name, "addr", addr))
	if err != nil {
		t.Fatal(err)
	}
	e.seat = httptest.NewUnstartedServer(sh)
	listen(e.seat, likeSeat)
}

// countWhile samples bad every 2 ms from now on; the function it returns
// stops the sampling and returns how many samples were bad.
func countWhile(bad func() bool) func() int64 {
	stop := make(chan struct{})
	var n atomic.Int64
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if bad() {
				n.Add(1)
			}
		}
	})
	return func() int64 {
		close(stop)
		watch.Wait()
		return n.Load()
	}
}

// TestSeatGroupSwapsReachTheNodeAgent: the leader reports each swap of a
// seat group to the node agent of the group pod's node, as it reports an
// application's sleeps and wakes. Two applications take the one seat in
// turn, at a steady pace: the agent's history holds each swap's sleeps and
// wakes with the bytes and tier of the restore, knows which engine is
// awake (the one swapped in last, however quickly it was swapped out and
// back in before), and predicts the next wake of the one asleep from the
// pattern. Alpha sleeps at level 2 and loads a model file the agent can read
// (its cold tier): the agent promotes it to the hot tier ahead of its
// predicted turn, and alpha's next wake reads that copy. An agent that
// does not answer holds no swap up: its reports are counted as failed,
// and the applications are still swapped and served.
func TestSeatGroupSwapsReachTheNodeAgent(t *testing.T) {
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, nil, 1, func(o *seatPlaneOptions) {
		o.agent, o.fromCold = true, map[string]bool{"alpha": true}
	})
	eventually(t, 30*time.Second, holds("the group to come within its budget of one awake engine", func() bool {
		return len(p.awake()) == 1
	}))
	holding := func(app string) func() error {
		return holds(app+" to hold the seat", func() bool {
			st := p.status(app)
			return st.Seat != nil && st.Seat.Holding && st.State == v1alpha1.LifecycleAwake
		})
	}
	// Alpha is asked for every period, beta half a period later.
	const period, rounds = time.Second, 4
	start := time.Now()
	for round := range rounds {
		for i, app := range []string{"alpha", "beta"} {
			time.Sleep(time.Until(start.Add(time.Duration(round)*period + time.Duration(i)*period/2)))
			if err := p.send(app, round, 2, 8); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, holding(app))
		}
	}

	// Beta holds the seat; alpha was swapped out after its last turn.
	var alpha, beta *checkpoint.WakeHistory
	eventually(t, 5*time.Second, func() error {
		alpha, beta = p.history("alpha"), p.history("beta")
		switch {
		case alpha == nil || beta == nil:
			return fmt.Errorf("the agent's histories: alpha %+v, beta %+v", alpha, beta)
		case len(alpha.Wakes) < rounds-1 || len(alpha.Sleeps) < rounds-1:
			return fmt.Errorf("alpha: %d wakes and %d sleeps reported, want at least %d of each", len(alpha.Wakes), len(alpha.Sleeps), rounds-1)
		case alpha.Awake() || !beta.Awake():
			return fmt.Errorf("the agent holds alpha awake %v and beta awake %v; want alpha asleep, beta awake", alpha.Awake(), beta.Awake())
		}
		return nil
	})
	if alpha.Bytes != 4<<20 || alpha.Digest == "" {
		t.Errorf("alpha's history: %d bytes, digest %q; want the 4 MiB the swaps restored and the engine's digest", alpha.Bytes, alpha.Digest)
	}
	// Swapped out and back in quickly: every wake after the first comes
	// after a sleep, and every sleep after the wake before it.
	for i := 1; i < len(alpha.Wakes); i++ {
		if alpha.Sleeps[0].After(alpha.Wakes[i]) {
			continue
		}
		n := 0
		for _, s := range alpha.Sleeps {
			if s.After(alpha.Wakes[i-1]) && s.Before(alpha.Wakes[i]) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("alpha's history has %d sleeps between its wakes %d and %d, want 1 (one swap out between two swaps in): %+v", n, i-1, i, alpha)
		}
	}

	// The agent predicts alpha's next wake from the pattern; beta is awake.
	resp, err := http.Post(p.agent.URL+"/promote-ahead", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	report := p.agentReport()
	var predicted *checkpoint.PredictedWake
	for i, pw := range report.Promotion.Predictions {
		switch pw.Name {
		case "demo-alpha":
			predicted = &report.Promotion.Predictions[i]
		case "demo-beta":
			t.Errorf("the agent predicts a wake of beta, which is awake: %+v", pw)
		}
	}
	lastWake := alpha.Wakes[len(alpha.Wakes)-1]
	if predicted == nil {
		t.Fatalf("the agent predicts no wake of alpha from %d wakes and %d sleeps at a steady pace: %+v", len(alpha.Wakes), len(alpha.Sleeps), report.Promotion)
	}
	// The next turn, or the one after when the next passed while the test
	// read the history.
	next := predicted.Next.Sub(lastWake)
	turns := (next + period/2) / period
	if off := next - turns*period; turns < 1 || off < -period*3/10 || off > period*3/10 || predicted.Next.Before(time.Now().Add(-period*3/10)) {
		t.Errorf("alpha's next wake predicted %v after its last one (%s pattern), want a coming turn: a multiple of the period %v", next, predicted.Pattern, period)
	}

	// With a margin of an hour, a prediction makes alpha's promotion due
	// at once: the agent copies its model file from the cold tier up to the
	// hot tier, verified, and alpha's next wake reads the hot copy.
	eventually(t, 10*time.Second, func() error {
		r := p.agentReport().Promotion
		for _, d := range r.Done {
			if d.Name == "demo-alpha" && d.To == checkpoint.TierHot && d.Error == "" {
				return nil
			}
		}
		return fmt.Errorf("the agent's promotions %+v, want alpha's weights promoted to the hot tier", r)
	})
	if err := p.send("alpha", rounds, 2, 8); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holding("alpha"))
	if w := p.engines["alpha"].weights(); w.LastWake == nil || w.LastWake.Tier != sim.TierHot || !w.LastWake.Verified {
		t.Errorf("alpha's last wake %+v, want a verified wake from the hot copy the agent promoted", w.LastWake)
	}

	// An agent that answers no report holds no swap up.
	if c := sumLabeled(t, p.reg, "orchestra_lifecycle_agent_reports_total", map[string]string{"app": "alpha", "result": "failed"}); c != 0 {
		t.Errorf("%v reports of alpha's swaps failed while the agent answered", c)
	}
	p.agentHangs.Store(true)
	for round := rounds + 1; round < rounds+3; round++ {
		for _, app := range []string{"alpha", "beta"} {
			sent := time.Now()
			if err := p.send(app, round, 2, 8); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, holding(app))
			// A report waits up to 2 s for the agent's answer: a swap
			// that waited for one would take longer.
			if took := time.Since(sent); took >= 2*time.Second {
				t.Errorf("swapping %s in took %v while the agent did not answer; the swap waited for the report", app, took)
			}
		}
	}
	eventually(t, 10*time.Second, func() error {
		if c := sumLabeled(t, p.reg, "orchestra_lifecycle_agent_reports_total", map[string]string{"result": "failed"}); c < 2 {
			return fmt.Errorf("orchestra_lifecycle_agent_reports_total{result=failed} = %v, want the reports the agent did not answer counted", c)
		}
		return nil
	})
}
