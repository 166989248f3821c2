package lifecycle

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// startingRoot is a root pod at ip whose containers run and that the
// kubelet has not marked Ready: an engine with a startup and a readiness
// probe on its named port, and a sidecar with a readiness probe of its own.
func startingRoot(ip string, enginePort, sidecarPort int32) *corev1.Pod {
	httpProbe := func(path, port string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(port)}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "chat-root-0", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{
				Name: "engine", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: enginePort}},
				StartupProbe: httpProbe("/health", "http"), ReadinessProbe: httpProbe("/health", "http"),
			},
			{
				Name: "sidecar", Ports: []corev1.ContainerPort{{Name: "sidecar", ContainerPort: sidecarPort}},
				ReadinessProbe: httpProbe("readyz", "sidecar"),
			},
		}},
		Status: corev1.PodStatus{
			PodIP:      ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "engine", Started: ptr.To(false), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}},
				{Name: "sidecar", Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}},
			},
		},
	}
}

func TestEarlyChecksRunThePodsOwnProbes(t *testing.T) {
	tests := []struct {
		name    string
		change  func(p *corev1.Pod)
		want    []string // a check's URL or TCP address
		wantErr string
	}{
		{"startup and readiness of a container that has not started, readiness of one that has", nil,
			[]string{"http://10.0.0.7:8000/health", "http://10.0.0.7:8000/health", "http://10.0.0.7:9300/readyz"}, ""},
		{"a started container's startup probe is done", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].Started = ptr.To(true) },
			[]string{"http://10.0.0.7:8000/health", "http://10.0.0.7:9300/readyz"}, ""},
		{"a TCP probe on a port number", func(p *corev1.Pod) {
			p.Spec.Containers[1].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9301)}}}
		}, []string{"http://10.0.0.7:8000/health", "http://10.0.0.7:8000/health", "10.0.0.7:9301"}, ""},
		{"an HTTPS probe", func(p *corev1.Pod) { p.Spec.Containers[1].ReadinessProbe.HTTPGet.Scheme = corev1.URISchemeHTTPS },
			[]string{"http://10.0.0.7:8000/health", "http://10.0.0.7:8000/health", "https://10.0.0.7:9300/readyz"}, ""},
		{"an exec probe is the kubelet's", func(p *corev1.Pod) {
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"ollama", "show", "m"}}}}
		}, nil, "container engine: an exec probe runs only in the pod"},
		{"a port name no container port has", func(p *corev1.Pod) { p.Spec.Containers[1].ReadinessProbe.HTTPGet.Port = intstr.FromString("nope") },
			nil, `container sidecar: no port named "nope"`},
		{"readiness gates", func(p *corev1.Pod) {
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/ready"}}
		}, nil, "the pod has readiness gates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startingRoot("10.0.0.7", 8000, 9300)
			if tt.change != nil {
				tt.change(p)
			}
			checks, err := earlyChecks(p)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range checks {
				got = append(got, c.url+c.addr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("checks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEarlyProbePeriodIsAShareOfTheStart(t *testing.T) {
	for _, tt := range []struct{ since, want time.Duration }{
		{0, 10 * time.Millisecond},
		{time.Second, 20 * time.Millisecond},
		{10 * time.Second, 200 * time.Millisecond},
		{5 * time.Minute, 500 * time.Millisecond},
	} {
		if got := earlyProbePeriod(tt.since); got != tt.want {
			t.Errorf("earlyProbePeriod(%v) = %v, want %v", tt.since, got, tt.want)
		}
	}
}

func TestAnEarlyAnswerStandsUntilTheKubeletSpeaksOrThePodChanges(t *testing.T) {
	at := time.Unix(1000, 0)
	ans := earlyAnswer{restarts: 0, at: at}
	// wentUnready: the pod was Ready after its containers started, and
	// turned unready (a failing readiness probe, a sleeping engine's
	// sidecar) at a whole second, as the API's times are.
	wentUnready := func(p *corev1.Pod) {
		started := p.Status.ContainerStatuses[0].State.Running.StartedAt.Time
		p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(started.Add(2 * time.Second).Truncate(time.Second))
	}
	unreadyAt := func(p *corev1.Pod) time.Time { return p.Status.Conditions[0].LastTransitionTime.Time }
	tests := []struct {
		name   string
		change func(p *corev1.Pod)
		now    time.Time
		// woken is when the leader said the engine woke, from the time the
		// pod turned unready (nil: it did not).
		woken *time.Duration
		want  bool
	}{
		{"just answered", nil, at.Add(time.Second), nil, true},
		{"the kubelet has not agreed within the grace", nil, at.Add(earlyReadyGrace), nil, false},
		{"the engine restarted since", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount = 1 }, at, nil, false},
		{"a container stopped", func(p *corev1.Pod) {
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}
		}, at, nil, false},
		{"terminating", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: at} }, at, nil, false},
		{"Ready: the kubelet's word counts", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionTrue }, at, nil, false},
		{"Ready once since its containers started, not any more: the kubelet's word counts", wentUnready, at, nil, false},
		{"a container restarted after the pod turned unready", func(p *corev1.Pod) {
			p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(p.Status.ContainerStatuses[0].State.Running.StartedAt.Add(-time.Second))
		}, at, nil, true},
		{"unready while its engine slept, woken since", wentUnready, at, ptr.To(10 * time.Second), true},
		{"woken within the second it turned unready", wentUnready, at, ptr.To(300 * time.Millisecond), true},
		{"unready again after the wake: the kubelet's word counts", wentUnready, at, ptr.To(-time.Second), false},
		{"woken, and Ready: the kubelet's word counts", func(p *corev1.Pod) {
			wentUnready(p)
			p.Status.Conditions[0].Status = corev1.ConditionTrue
		}, at, ptr.To(10 * time.Second), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startingRoot("10.0.0.7", 8000, 9300)
			if tt.change != nil {
				tt.change(p)
			}
			var woken time.Time
			if tt.woken != nil {
				woken = unreadyAt(p).Add(*tt.woken)
			}
			if got := ans.stands(p, tt.now, woken); got != tt.want {
				t.Errorf("stands = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestEarlyReadyServesAStartingRootTheMomentItAnswers runs the probes of a
// starting root against real listeners: the pod serves once both of its
// containers answer, not before, and no longer once it restarted.
func TestEarlyReadyServesAStartingRootTheMomentItAnswers(t *testing.T) {
	var engineUp atomic.Bool
	var engineProbes atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		engineProbes.Add(1)
		if r.URL.Path != "/health" || !engineUp.Load() {
			http.Error(w, "loading", http.StatusServiceUnavailable)
		}
	}))
	defer engine.Close()
	sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		}
	}))
	defer sidecar.Close()
	p := startingRoot("127.0.0.1", listenerPort(engine), listenerPort(sidecar))

	answered := make(chan *corev1.Pod, 4)
	e := newEarlyReady(slog.New(slog.DiscardHandler), time.Now, func(p *corev1.Pod) { answered <- p })
	ctx := t.Context()
	e.start(ctx)
	e.track(p, false)

	time.Sleep(200 * time.Millisecond)
	if e.serves(p) {
		t.Fatal("the pod serves while its engine answers 503")
	}
	if n := engineProbes.Load(); n < 3 {
		t.Errorf("the engine was probed %d times in 200 ms; want one every 10 ms or so", n)
	}
	up := time.Now()
	engineUp.Store(true)
	awaitAnswer(t, answered, up, "after the engine came up")
	if !e.serves(p) {
		t.Fatal("the pod does not serve after answering its probes")
	}

	// The engine restarts: the answer no longer stands, and it is probed
	// again.
	engineUp.Store(false)
	restarted := p.DeepCopy()
	restarted.Status.ContainerStatuses[0].RestartCount = 1
	e.track(restarted, false)
	if e.serves(restarted) {
		t.Fatal("a restarted pod serves by the answer of its previous engine")
	}
	engineUp.Store(true)
	select {
	case <-answered:
	case <-time.After(2 * time.Second):
		t.Fatal("the restarted pod was not probed again")
	}
	if !e.serves(restarted) {
		t.Fatal("the restarted pod does not serve after answering again")
	}

	// The kubelet marks it Ready: the early answer is dropped.
	ready := restarted.DeepCopy()
	ready.Status.Conditions[0].Status = corev1.ConditionTrue
	e.track(ready, false)
	if e.serves(restarted) {
		t.Error("the early answer outlived the kubelet's Ready")
	}
	e.track(ready, true)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.probing) != 0 || len(e.answers) != 0 {
		t.Errorf("after the pod was deleted: %d probing, %d answers; want none", len(e.probing), len(e.answers))
	}
}

// TestAWokenRootServesOnceItsProbesPass: a root that was Ready and turned
// unready while its engine slept is not probed early, until the leader
// says its engine woke: then it serves as soon as its probes pass, before
// the kubelet's next probe, and the kubelet's word counts again once it
// speaks. A wake said longer ago than earlyReadyGrace no longer counts.
func TestAWokenRootServesOnceItsProbesPass(t *testing.T) {
	var sidecarAwake atomic.Bool
	var sidecarProbes atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer engine.Close()
	sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sidecarProbes.Add(1)
		if r.URL.Path != "/readyz" || !sidecarAwake.Load() {
			http.Error(w, "asleep", http.StatusServiceUnavailable)
		}
	}))
	defer sidecar.Close()
	// The root ran, was Ready, and turned unready 2 s later when its
	// engine fell asleep.
	asleep := startingRoot("127.0.0.1", listenerPort(engine), listenerPort(sidecar))
	started := time.Now().Add(-time.Minute)
	for i := range asleep.Status.ContainerStatuses {
		asleep.Status.ContainerStatuses[i].Started = ptr.To(true)
		asleep.Status.ContainerStatuses[i].State.Running.StartedAt = metav1.NewTime(started)
	}
	asleep.Status.Conditions[0].LastTransitionTime = metav1.NewTime(started.Add(2 * time.Second))

	now := time.Now
	answered := make(chan *corev1.Pod, 4)
	e := newEarlyReady(slog.New(slog.DiscardHandler), now, func(p *corev1.Pod) { answered <- p })
	e.start(t.Context())

	// Asleep: the kubelet's alone.
	e.track(asleep, false)
	time.Sleep(100 * time.Millisecond)
	if n := sidecarProbes.Load(); n != 0 || e.serves(asleep) {
		t.Fatalf("a root that went unready was probed %d times (serves: %v) before any wake", n, e.serves(asleep))
	}

	// The leader woke it: the sidecar answers, and the root serves at
	// once.
	sidecarAwake.Store(true)
	woke := time.Now()
	e.wokeUp(asleep, now())
	awaitAnswer(t, answered, woke, "after the wake was said")
	if !e.serves(asleep) {
		t.Fatal("the woken root does not serve after answering its probes")
	}
	// A pod update the kubelet makes meanwhile (the same unready pod) keeps
	// the answer.
	e.track(asleep.DeepCopy(), false)
	if !e.serves(asleep) {
		t.Fatal("the woken root's answer was dropped by an update of the same unready pod")
	}

	// The kubelet marks it Ready: its word counts, the wake is forgotten.
	ready := asleep.DeepCopy()
	ready.Status.Conditions[0].Status = corev1.ConditionTrue
	ready.Status.Conditions[0].LastTransitionTime = metav1.NewTime(time.Now())
	e.track(ready, false)
	if e.serves(ready) {
		t.Error("the early answer outlived the kubelet's Ready")
	}
	e.mu.Lock()
	woken, probing, answers := len(e.woken), len(e.probing), len(e.answers)
	e.mu.Unlock()
	if woken+probing+answers != 0 {
		t.Errorf("after the kubelet's Ready: %d woken, %d probing, %d answers; want none", woken, probing, answers)
	}

	// It sleeps again (unready after that wake), and a wake said longer ago
	// than the grace does not make it probed.
	again := asleep.DeepCopy()
	again.UID = "u2"
	sidecarAwake.Store(false)
	e.wokeUp(again, now().Add(-earlyReadyGrace))
	probes := sidecarProbes.Load()
	time.Sleep(100 * time.Millisecond)
	if n := sidecarProbes.Load() - probes; n != 0 || e.serves(again) {
		t.Errorf("a wake said %v ago made the root probed %d times (serves: %v)", earlyReadyGrace, n, e.serves(again))
	}

	// A wake whose probes never passed within the grace does not keep the
	// next wake from probing the root again.
	e.wokeUp(again, now().Add(-earlyReadyGrace+100*time.Millisecond))
	time.Sleep(300 * time.Millisecond) // the first wake's probing ended meanwhile
	sidecarAwake.Store(true)
	woke = time.Now()
	e.wokeUp(again, now())
	awaitAnswer(t, answered, woke, "after the next wake was said")
	if !e.serves(again) {
		t.Error("the root woken again does not serve after answering its probes")
	}
}

// listenerPort is the port a test server listens on.
func listenerPort(s *httptest.Server) int32 {
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	return int32(n)
}

// awaitAnswer waits for a pod's early answer, which must come within 2 s
// and should within 500 ms of since (what says when since was).
func awaitAnswer(t *testing.T, answered <-chan *corev1.Pod, since time.Time, what string) {
	t.Helper()
	select {
	case <-answered:
	case <-time.After(2 * time.Second):
		t.Fatalf("no answer within 2 s %s", what)
	}
	if d := time.Since(since); d > 500*time.Millisecond {
		t.Errorf("answered %v %s", d, what)
	}
}
