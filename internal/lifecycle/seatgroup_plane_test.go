package lifecycle_test

// The in-process seat group the seat-group tests run: a group pod of
// simulator engines with their real sidecars, an optional node agent, and
// a leader.

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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/queue"
	"github.com/model-orchestra/operator/internal/seatgroup/simengine"
	"github.com/model-orchestra/operator/internal/sidecar"
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
	// copies are applications (with agent) whose engine loads copies of
	// its model (SeatMember.ModelCopies): the leader asks the agent for a
	// copy when they fall asleep.
	copies map[string]bool
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
		member := lifecycle.SeatMember{Name: name, SidecarPort: port(t, e.seat), Priority: priority[name],
			MinResidency: metav1.Duration{Duration: 100 * time.Millisecond}, SleepAfter: metav1.Duration{Duration: o.sleepAfter[name]}}
		if o.agent {
			member.AgentSelector, member.AgentPort, member.ModelCheckpoint = agentSelector, port(t, p.agent), "demo-"+name
		}
		if o.fromCold[name] {
			member.SleepLevel, member.ColdPath = 2, name+".bin"
		}
		member.ModelCopies = o.copies[name]
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
	ac := agent.Default()
	ac.Role = agent.RoleNode
	p.agentHot, p.agentWarm, p.agentCold = filepath.Join(dir, "hot"), filepath.Join(dir, "warm"), filepath.Join(dir, "cold")
	// The namespace's tier directories exist before the engines start
	// (the chart mounts them as hostPath DirectoryOrCreate).
	for _, d := range []string{filepath.Join(p.agentHot, ns), filepath.Join(p.agentWarm, ns), p.agentCold} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ac.Node.Store = nodeagent.StoreConfig{HotDir: p.agentHot, WarmDir: p.agentWarm, Budgets: nodeapi.Budgets{Hot: 64 << 20, Warm: 64 << 20}}
	ac.Node.MeasureBytes, ac.Node.CRIU, ac.Node.RuntimeVersion = 1<<20, "", "containerd://1.6.20"
	ac.Node.ColdDir = p.agentCold
	// Plan often, and promote whatever is predicted at all: the test's
	// wakes come a second apart.
	ac.Node.PromoteInterval, ac.Node.PromoteMargin = 100*time.Millisecond, time.Hour
	ah, err := agent.Start(ctx, ac, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("agent", "node"))
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
func (p *seatGroupPlane) agentReport() nodeapi.NodeReport {
	p.t.Helper()
	var report nodeapi.NodeReport
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
func (p *seatGroupPlane) history(app string) *nodeagent.WakeHistory {
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
	ac := agent.Default()
	ac.Sidecar.Engine = sidecar.EngineConfig{Kind: v1alpha1.EngineSimulator, URL: e.engine.URL, PollInterval: 5 * time.Millisecond}
	ac.Sidecar.PollInterval, ac.Sidecar.DrainTimeout = 5*time.Millisecond, 10*time.Second
	sh, err := agent.Start(ctx, ac, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("seat", e.name, "addr", addr))
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
