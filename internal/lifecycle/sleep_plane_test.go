package lifecycle_test

// The in-process application with sleeping engines the sleep tests run:
// a root pod with a simulator engine and its real sidecar, a node agent,
// NATS and a fake Kubernetes API.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/s3cred"
	"github.com/model-orchestra/operator/internal/fetch/s3test"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"
)

// weightsBytes is the size of the simulator's weights in these tests: big
// enough that every wake moves and hashes real bytes, small enough for a
// shared machine.
const weightsBytes = 8 << 20

// sleepPlane is one root pod's engine (a real simulator with real weights
// and sleep mode), its sidecar (a real sidecar over HTTP) and
// the node's agent (a real checkpoint node agent over HTTP), on the fake
// cluster of env, with a real dispatcher in front.
type sleepPlane struct {
	e       *env
	sim     *sim.Simulator
	engine  *httptest.Server
	sidecar *httptest.Server
	agent   *httptest.Server
	// agentHot and agentWarm are the node agent's tier directories.
	agentHot, agentWarm string
	// tokenFile holds the release's caller token, which the node agent
	// requires of every mutating call and the leader sends.
	tokenFile string
	client    *natsqueue.Client
	// dispatcherReg holds the dispatcher's metrics (and its lifecycle's,
	// when it runs one).
	dispatcherReg *prometheus.Registry

	// failWake makes the engine answer 500 to its wake calls; hang makes
	// it answer 500 to everything (an engine the sidecar can no longer tell).
	failWake atomic.Bool
	broken   atomic.Bool
	// sleepDelay holds every sidecar sleep call before it reaches the sidecar.
	sleepDelay atomic.Int64

	mu      sync.Mutex
	written []v1alpha1.ModelCheckpointStatus // ModelCheckpoint status writes
	regs    map[string]*prometheus.Registry  // each leader's metrics
}

// registry is the metrics registry of the leader named identity.
func (p *sleepPlane) registry(identity string) *prometheus.Registry {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.regs == nil {
		p.regs = map[string]*prometheus.Registry{}
	}
	if p.regs[identity] == nil {
		p.regs[identity] = prometheus.NewRegistry()
	}
	return p.regs[identity]
}

type planeOptions struct {
	// inDispatcher runs the lifecycle inside the dispatcher (production);
	// otherwise the test starts controllers itself (startLeader).
	inDispatcher bool
	sleep        func(*lifecycle.SleepConfig)
	sim          func(*sim.Config)
	// offloadElsewhere gives the engine a hot directory of its own, outside
	// the node agent's hot tier (so the agent cannot demote its offload).
	offloadElsewhere bool
	// coldS3 makes the agent's cold tier the model file in an S3 fake (its
	// source named for the application), instead of the model cache.
	coldS3 bool
	// ollama makes the sidecar drive an Ollama engine that loads copies of
	// its model file (sleep_copies_test.go); the simulator still answers
	// the requests.
	ollama *copyLoader
	// cacheNotMounted gives the node agent no cold directory (a
	// ReadWriteOnce model cache only the engine's pod mounts): it copies
	// the model through the sidecar, which requires the caller token.
	cacheNotMounted bool
}

func newSleepPlane(t *testing.T, o planeOptions) *sleepPlane {
	t.Helper()
	e := newEnv(t, 1)
	p := &sleepPlane{e: e}
	dir := t.TempDir()
	cold := filepath.Join(dir, "cold")
	agentHot, agentWarm := filepath.Join(dir, "agent-hot"), filepath.Join(dir, "agent-warm")
	// The namespace's tier directories exist before the engine starts (the
	// chart mounts them as hostPath DirectoryOrCreate).
	for _, d := range []string{cold, filepath.Join(agentHot, ns), filepath.Join(agentWarm, ns)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The model file in the model cache (the cold tier).
	w := make([]byte, weightsBytes)
	for i := range w {
		w[i] = byte(i*7 + i>>11)
	}
	if err := os.WriteFile(filepath.Join(cold, "weights.bin"), w, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p.tokenFile = filepath.Join(dir, "caller-token")
	if err := os.WriteFile(p.tokenFile, []byte("release-caller-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The node agent.
	ac := agent.Default()
	ac.Role = agent.RoleNode
	ac.Node.Store = nodeagent.StoreConfig{HotDir: agentHot, WarmDir: agentWarm, Budgets: nodeapi.Budgets{Hot: 64 << 20, Warm: 64 << 20}}
	ac.Node.ColdDir, ac.Node.MeasureBytes, ac.Node.CRIU, ac.Node.RuntimeVersion = cold, 4<<20, "", "containerd://1.6.20"
	ac.Node.CallerTokenFile = p.tokenFile
	if o.coldS3 {
		s3 := s3test.New("AKTEST")
		t.Cleanup(s3.Close)
		s3.Put("models", "chat/weights.bin", fetchtest.Bytes(w))
		creds := t.TempDir()
		for f, v := range map[string]string{s3cred.AccessKeyName: "AKTEST", s3cred.SecretKeyName: "s3cr3t"} {
			if err := os.WriteFile(filepath.Join(creds, f), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		ac.Node.ColdDir = ""
		ac.Node.ColdS3 = []nodeagent.ColdS3Source{{Name: app, URL: "s3://models/chat/weights.bin", Endpoint: s3.URL(), Credentials: creds}}
	}
	if o.cacheNotMounted {
		ac.Node.ColdDir = ""
	}
	ah, err := agent.Start(ctx, ac, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("agent", "node"))
	if err != nil {
		t.Fatal(err)
	}
	p.agent, p.agentHot, p.agentWarm = httptest.NewServer(ah), agentHot, agentWarm
	t.Cleanup(p.agent.Close)

	// The engine: the simulator reads its weights from the model cache;
	// its hot and warm directories are the namespace's directories of the
	// agent's tiers, as the chart mounts them: its level-1 offload lands in
	// the agent's hot tier, and a copy the agent places in the warm tier is
	// what a level-2 wake reads.
	sc := dataplanetest.FastSim()
	sc.Weights = sim.Weights{File: filepath.Join(cold, "weights.bin"), Name: "demo-chat"}
	sc.Sleep = sim.Sleep{Enabled: true, HotDir: filepath.Join(agentHot, ns), WarmDir: filepath.Join(agentWarm, ns)}
	if o.offloadElsewhere {
		sc.Sleep.HotDir = t.TempDir()
	}
	if o.sim != nil {
		o.sim(&sc)
	}
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
	p.sim = sim.New(sc)
	if err := p.sim.LoadWeights(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.sim.Close)
	eh := p.sim.Handler()
	if o.ollama != nil {
		eh = o.ollama.handler(t, eh, cold, w)
	}
	p.engine = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.broken.Load() {
			http.Error(w, `{"error":{"message":"injected: the engine is broken"}}`, http.StatusInternalServerError)
			return
		}
		if p.failWake.Load() && r.Method == http.MethodPost && (r.URL.Path == "/wake_up" || r.URL.Path == "/collective_rpc") {
			http.Error(w, `{"error":{"message":"injected: the engine cannot wake"}}`, http.StatusInternalServerError)
			return
		}
		eh.ServeHTTP(w, r)
	}))
	t.Cleanup(p.engine.Close)

	// The sidecar.
	scfg := agent.Default()
	scfg.Sidecar.Engine = sidecar.EngineConfig{Kind: v1alpha1.EngineSimulator, URL: p.engine.URL, PollInterval: 5 * time.Millisecond}
	scfg.Sidecar.PollInterval, scfg.Sidecar.DrainTimeout = 5*time.Millisecond, 5*time.Second
	if o.ollama != nil {
		o.ollama.sidecar(&scfg.Sidecar, cold, filepath.Join(agentHot, ns), filepath.Join(agentWarm, ns))
	}
	if o.cacheNotMounted {
		scfg.Sidecar.CallerTokenFile = p.tokenFile
	}
	sh, err := agent.Start(ctx, scfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("agent", "sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	p.sidecar = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := time.Duration(p.sleepDelay.Load()); d > 0 && r.URL.Path == "/sleep" {
			select {
			case <-r.Context().Done():
				return // the caller gave up: the sidecar never hears of this sleep
			case <-time.After(d):
			}
		}
		sh.ServeHTTP(w, r)
	}))
	t.Cleanup(p.sidecar.Close)
	eventually(t, 5*time.Second, func() error {
		if st := p.sidecarState().State; st != sidecarapi.Awake {
			return fmt.Errorf("the sidecar sees its engine %s, want awake", st)
		}
		return nil
	})

	// The root pod and the node agent's pod, where the leader finds them.
	p.placePods()
	u, _ := url.Parse(p.engine.URL)
	e.c.engine = u.Host
	e.c.slice(true)

	lc := p.config(o.sleep)
	cfg := dispatch.Default()
	cfg.Orchestra, cfg.Namespace, cfg.NATS.URL = orch, ns, e.srv.ClientURL()
	cfg.Apps = []dispatch.App{{Name: app, Service: root, PortName: "http", Port: 1, MaxConcurrency: 8}}
	if o.inDispatcher {
		cfg.Lifecycle = &lc
	}
	cfg.AckWait = metav1.Duration{Duration: 5 * time.Second}
	cfg.HeartbeatInterval = metav1.Duration{Duration: 200 * time.Millisecond}
	nc, err := nats.Connect(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	p.dispatcherReg = prometheus.NewRegistry()
	d, err := dispatch.New(cfg, nc, slog.New(slog.NewTextHandler(testWriter{t}, nil)), dispatch.WithKubernetes(e.c.cs), dispatch.WithRegistry(p.dispatcherReg))
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(dctx) }()
	t.Cleanup(func() { dcancel(); <-done; nc.Close() })

	qc := natsqueue.DefaultClientConfig()
	qc.Orchestra = orch
	cnc, err := nats.Connect(e.srv.ClientURL())
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

func port(t *testing.T, s *httptest.Server) int32 {
	u, _ := url.Parse(s.URL)
	n, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// placePods gives the root StatefulSet its selector and the root pod an
// address, a node and the engine's port, and adds the node agent's pod on
// the same node: everything here listens on 127.0.0.1, so the pods'
// address is that, and the configured ports tell the servers apart.
func (p *sleepPlane) placePods() {
	t, c := p.e.t, p.e.c
	stsGVR := appsv1.SchemeGroupVersion.WithResource("statefulsets")
	obj, err := c.cs.Tracker().Get(stsGVR, ns, root)
	if err != nil {
		t.Fatal(err)
	}
	sts := obj.(*appsv1.StatefulSet).DeepCopy()
	sts.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{
		"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "root", "modelorchestra.io/application": app}}
	if err := c.cs.Tracker().Update(stsGVR, sts, ns); err != nil {
		t.Fatal(err)
	}
	p.placeRoot()
	agent := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: orch + "-agent-x1", Namespace: ns, Labels: map[string]string{
			"app.kubernetes.io/instance": orch, "app.kubernetes.io/component": "checkpoint-agent"}},
		Spec:   corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{PodIP: "127.0.0.1", Phase: corev1.PodRunning},
	}
	if err := c.cs.Tracker().Add(agent); err != nil {
		t.Fatal(err)
	}
}

// placeRoot gives the root pod an address, a node and the engine's port.
func (p *sleepPlane) placeRoot() {
	t, c := p.e.t, p.e.c
	podGVR := corev1.SchemeGroupVersion.WithResource("pods")
	obj, err := c.cs.Tracker().Get(podGVR, ns, root+"-0")
	if err != nil {
		t.Fatal(err)
	}
	pod := obj.(*corev1.Pod).DeepCopy()
	pod.Spec.NodeName = "node-a"
	pod.Spec.Containers = []corev1.Container{{Name: "engine", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: port(t, p.engine)}}}}
	pod.Status.PodIP, pod.Status.Phase = "127.0.0.1", corev1.PodRunning
	if err := c.cs.Tracker().Update(podGVR, pod, ns); err != nil {
		t.Fatal(err)
	}
}

// wantHistory waits until the node agent's persisted history of demo-chat
// holds wakes wakes and sleeps sleeps, as the leader reports them, each
// wake with the engine's digest (the agent's promotions verify by it).
func (p *sleepPlane) wantHistory(wakes, sleeps int) {
	p.e.t.Helper()
	eventually(p.e.t, 5*time.Second, func() error {
		h, err := agentHistory(p.agentWarm, "demo-chat")
		if err != nil {
			return err
		}
		if len(h.Wakes) != wakes || len(h.Sleeps) != sleeps {
			return fmt.Errorf("the agent's history %+v; want %d wakes and %d sleeps of %s/demo-chat", h, wakes, sleeps, ns)
		}
		if d := p.sim.WeightsStatus().Digest; wakes > 0 && h.Digest != d {
			return fmt.Errorf("the agent's history of %s/demo-chat has digest %q, want the engine's %q", ns, h.Digest, d)
		}
		return nil
	})
}

// agentHistory is the node agent's persisted history (in its warm tier
// warmDir) of the weights name of the namespace ns.
func agentHistory(warmDir, name string) (nodeagent.WakeHistory, error) {
	b, err := os.ReadFile(filepath.Join(warmDir, ".wakes.json"))
	if err != nil {
		return nodeagent.WakeHistory{}, err
	}
	var hs []nodeagent.WakeHistory
	if err := json.Unmarshal(b, &hs); err != nil {
		return nodeagent.WakeHistory{}, err
	}
	for _, h := range hs {
		if h.Key == (nodeapi.Key{Namespace: ns, Name: name}) {
			return h, nil
		}
	}
	return nodeagent.WakeHistory{}, fmt.Errorf("the agent's histories %s have none of %s/%s", b, ns, name)
}

// config is the lifecycle with sleeping engines: minReplicas 1, sleep after
// 300ms idle at level 1.
func (p *sleepPlane) config(mut func(*lifecycle.SleepConfig)) lifecycle.Config {
	s := &lifecycle.SleepConfig{
		After: metav1.Duration{Duration: 300 * time.Millisecond}, Level: 1,
		SidecarPort: port(p.e.t, p.sidecar),
		Weights: lifecycle.Weights{
			AgentSelector:   "app.kubernetes.io/instance=" + orch + ",app.kubernetes.io/component=checkpoint-agent",
			AgentPort:       port(p.e.t, p.agent),
			ModelCheckpoint: "demo-chat",
			ColdPath:        "weights.bin",
		},
		WakeTimeout: metav1.Duration{Duration: 20 * time.Second},
	}
	if mut != nil {
		mut(s)
	}
	cfg := appConfig(func(a *lifecycle.App) {
		a.MinReplicas, a.MaxReplicas = 1, 1
		a.ZeroAfter.Duration = time.Hour
		a.Sleep = s
	})
	cfg.AgentTokenFile = p.tokenFile
	return cfg
}

// agentCall is a mutating call of the node agent, as the leader makes it
// (with the release's caller token).
func (p *sleepPlane) agentCall(method, path string) (*http.Response, error) {
	req, err := http.NewRequest(method, p.agent.URL+path, nil)
	if err != nil {
		return nil, err
	}
	nodeapi.Authorize(req, "release-caller-token")
	return http.DefaultClient.Do(req)
}

// startLeader runs a lifecycle controller outside the dispatcher, with a
// ModelCheckpoint status writer that records; stop ends it (releasing the
// Lease).
func (p *sleepPlane) startLeader(identity string, cfg lifecycle.Config) (stop func()) {
	t := p.e.t
	t.Helper()
	if err := cfg.Validate([]string{app}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(p.e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := lifecycle.New(cfg, lifecycle.Deps{NC: nc, Kube: p.e.c.cs, Namespace: ns, Orchestra: orch, Identity: identity,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("leader", identity), Registry: p.registry(identity), Checkpoints: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ctl.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; nc.Close() }) }
	t.Cleanup(stop)
	return stop
}

// WriteStatus records ModelCheckpoint status writes.
func (p *sleepPlane) WriteStatus(_ context.Context, namespace, name string, st v1alpha1.ModelCheckpointStatus) error {
	if namespace != ns || name != "demo-chat" {
		return fmt.Errorf("unexpected ModelCheckpoint %s/%s", namespace, name)
	}
	p.mu.Lock()
	p.written = append(p.written, st)
	p.mu.Unlock()
	return nil
}

func (p *sleepPlane) checkpointStatus() v1alpha1.ModelCheckpointStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.written) == 0 {
		return v1alpha1.ModelCheckpointStatus{}
	}
	return p.written[len(p.written)-1]
}

func (p *sleepPlane) sidecarState() sidecarapi.Status {
	var st sidecarapi.Status
	if p.sidecar == nil {
		return st
	}
	resp, err := http.Get(p.sidecar.URL + "/state")
	if err != nil {
		return st
	}
	defer func() { _ = resp.Body.Close() }()
	_ = jsonDecode(resp, &st)
	return st
}

// agentMetric is the value of one series of the node agent's metrics (0
// when absent).
func (p *sleepPlane) agentMetric(series string) float64 {
	p.e.t.Helper()
	resp, err := http.Get(p.agent.URL + "/metrics")
	if err != nil {
		p.e.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// refused is the simulator's count of inference requests refused because
// it was not awake: a request the dispatcher sent to a sleeping engine.
func (p *sleepPlane) refused() float64 {
	p.e.t.Helper()
	resp, err := http.Get(p.engine.URL + "/metrics")
	if err != nil {
		p.e.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "orchestra_sim_requests_refused_asleep_total "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	p.e.t.Fatal("the simulator exports no orchestra_sim_requests_refused_asleep_total")
	return 0
}

// asleep waits for the application and its engine to sleep at level (the
// weights out of the engine's memory, the gate closed).
func (p *sleepPlane) asleep(level int, tier v1alpha1.Tier) {
	p.e.t.Helper()
	eventually(p.e.t, 15*time.Second, func() error {
		st := p.e.state()
		w := p.sim.WeightsStatus()
		if st.State != v1alpha1.LifecycleAsleep || st.ResidentTier != tier || !w.Sleeping || w.Level != level || w.ResidentBytes != 0 {
			return fmt.Errorf("state %s in tier %s, engine %+v; want the engines asleep at level %d in the %s tier", st.State, st.ResidentTier, w, level, tier)
		}
		return nil
	})
	if !p.e.consumer().Paused {
		p.e.t.Fatal("the engines sleep but the consumer is not paused: a dispatcher could send them a request")
	}
	if s := p.sidecarState(); s.State != sidecarapi.Asleep {
		p.e.t.Fatalf("sidecar state %s, want Asleep", s.State)
	}
}

// lastWake waits until the status's last wake is as described (the gate
// opens before the status is written, so answers can arrive first).
func (p *sleepPlane) lastWake(want string, ok func(*v1alpha1.WakeStatus) bool) {
	p.e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		lw := p.e.state().LastWake
		if lw != nil && ok(lw) {
			return
		}
		if time.Now().After(deadline) {
			p.e.t.Errorf("last wake %+v, want %s", lw, want)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counter sums the series of a metric family in reg whose labels include
// every one of want (all of them when want is empty).
func counter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
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
	metric:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metric
				}
			}
			total += value(m)
		}
	}
	return total
}

func jsonDecode(resp *http.Response, v any) error {
	return json.NewDecoder(resp.Body).Decode(v)
}
