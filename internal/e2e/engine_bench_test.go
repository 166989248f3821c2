package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/polltest"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/ssetest"
)

var (
	benchEngine       = flag.Bool("engine-bench", false, "run the real-engine benchmark (make bench-engine) instead of skipping it")
	benchEngineRounds = flag.Int("engine-bench-rounds", 3, "rounds of the real-engine benchmark")
	benchEngineLarge  = flag.String("engine-bench-large", "256MiB", "size of the larger generated model of the real-engine benchmark")
	benchEngineDocs   = flag.String("engine-bench-docs", "", "write the real-engine benchmark's tables between the bench-engine markers of this file (relative to the module root)")
	benchEngineWakes  = flag.Int("engine-bench-wakes", 3, "wakes from zero, and as many plain scales, a model and round of the real-engine benchmark, in alternating order")
	benchEngineTTFT   = flag.Bool("engine-bench-ttft", false, "measure only the first token (tiny model: direct, one relay pod, three relay pods, gateway + queue), no wakes and no larger model")
)

const (
	engineStartMarker = "<!-- bench-engine:start -->"
	engineEndMarker   = "<!-- bench-engine:end -->"
	// The first-token table has a block of its own, which the TTFT-only
	// mode (-engine-bench-ttft) rewrites alone.
	firstTokenStartMarker = "<!-- bench-engine-first-token:start -->"
	firstTokenEndMarker   = "<!-- bench-engine-first-token:end -->"
	// benchLargeRepo is the mirror repository of the larger model.
	benchLargeRepo = "bench/large-gguf"
	benchLargeFile = "large.gguf"
	// sets of requests (one a path of firstTokenPaths) per size and round
	benchPairs = 10
)

// The paths of the first-token sets: straight to the engine's pod IP,
// through one plain relay pod (the floor of any design with a pod between
// client and engine), through three (the hop count of gateway, NATS and
// dispatcher), through the gateway on its direct lane (the default) and
// through the gateway and queue (X-Orchestra-Lane: queue, as with
// spec.gateway.directLane false).
const (
	pathDirect       = "direct"
	pathRelay        = "relay"
	pathRelays       = "relays"
	pathGateway      = "gateway"
	pathGatewayQueue = "gateway-queue"
)

var firstTokenPaths = []string{pathGateway, pathDirect, pathGatewayQueue, pathRelay, pathRelays}

// pathCode ends each path's prompts: a code of one length per path, so
// that every prompt is different and all have one length.
var pathCode = map[string]string{pathGateway: "gw", pathDirect: "dx", pathRelay: "r1", pathRelays: "r3", pathGatewayQueue: "gq"}

// engineSize is one generated model of the benchmark and its two
// applications: one that scales to zero, one that sleeps.
type engineSize struct {
	label       string
	bytes       int64
	zero, sleep string // applications
	// measured
	wake, baseline []startTimes
	sleepWake      []time.Duration
	// first token and tokens/s by path (firstTokenPaths), in set order
	first map[string][]time.Duration
	rate  map[string][]float64
	// round trips through the NATS pod: engine idle, engine streaming
	podIdle, podBusy []time.Duration
	// laneMisses counts gateway requests meant for the direct lane that
	// the gateway queued (no lease held yet): repeated, not counted.
	laneMisses int
}

// TestEngineBenchmark measures the real Ollama engine on real pods, on the
// tiny generated model and a larger one, interleaved in one run: the first
// request at zero pods to its first token against a plain scale 0 -> 1 of
// the same StatefulSet to its engine's first answer; a wake from sleep
// (the sidecar unloads with keep_alive 0 and reloads) against that cold
// start; and the first token and tokens/s through the gateway and queue
// against straight to the engine, through one and three plain relay pods.
// With -engine-bench-ttft only the first-token sets run, on the tiny model.
func TestEngineBenchmark(t *testing.T) {
	if !*benchEngine {
		t.Skip("the real-engine benchmark runs with -engine-bench (make bench-engine)")
	}
	requireOllama(t)
	// A round of both models took 8-9 minutes on 2 CPUs (the 248 MiB
	// model streams about 10 tokens/s there): 4 minutes a round ran a
	// 3-round bench out of time in its last round.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute+time.Duration(*benchEngineRounds)*12*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "bench-engine")
	const name = "bench"

	sizes := []*engineSize{{label: "tiny", bytes: int64(len(stack.TinyModelFiles()[stack.DemoFile])), zero: "tiny-zero", sleep: "tiny-sleep"}}
	hub := ""
	if !*benchEngineTTFT {
		large, err := modelgen.ParseSize(*benchEngineLarge)
		if err != nil {
			t.Fatal(err)
		}
		var largeBytes int64
		hub, largeBytes = startLargeMirror(t, large)
		sizes = append(sizes, &engineSize{label: modelgen.FormatSize(uint64(largeBytes)), bytes: largeBytes, zero: "large-zero", sleep: "large-sleep"})
	}
	for _, s := range sizes {
		s.first, s.rate = map[string][]time.Duration{}, map[string][]float64{}
	}
	token, err := stack.EnsureToken(ctx, env.cs, ns, "bench-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := benchEngineResource(t, ns, name, hub, sizes)
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	relays := startRelays(ctx, t, ns)
	for _, s := range sizes {
		// The TTFT-only mode's one application wakes here, from zero.
		app := s.sleep
		if *benchEngineTTFT {
			app = s.zero
		}
		if _, err := stack.StreamChatOnceReachable(ctx, base, token, app, "hello", 4, nil, 2*time.Minute); err != nil {
			t.Fatalf("first chat to %s: %v", app, err)
		}
	}
	loadBefore := loadAverage()
	for round := range *benchEngineRounds {
		for _, s := range sizes {
			if *benchEngineTTFT {
				benchFirstTokens(ctx, t, ns, name, base, token, relays, s, round)
				continue
			}
			benchZeroRound(ctx, t, ns, name, base, token, relays, s, round)
			benchSleepRound(ctx, t, ns, name, base, token, s, round)
		}
	}
	loadAfter := loadAverage()
	first := firstTokenTable(sizes, loadBefore, loadAfter)
	t.Log("\n" + first)
	var wake string
	if !*benchEngineTTFT {
		wake = engineTable(sizes, loadBefore, loadAfter)
		t.Log("\n" + wake)
	}
	if *benchEngineDocs != "" {
		path := *benchEngineDocs
		if !filepath.IsAbs(path) {
			path = filepath.Join(env.root, path)
		}
		if err := writeMarked(path, firstTokenStartMarker, firstTokenEndMarker, first); err != nil {
			t.Error(err)
		}
		if wake != "" {
			if err := writeMarked(path, engineStartMarker, engineEndMarker, wake); err != nil {
				t.Error(err)
			}
		}
	}
}

// startLargeMirror generates the larger model and serves it from a mirror
// of its own on the node address; it returns the mirror's URL and the
// file's size.
func startLargeMirror(t *testing.T, size uint64) (string, int64) {
	t.Helper()
	cfg, err := modelgen.ForSize(size)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), benchLargeFile)
	start := time.Now()
	if _, _, err := modelgen.WriteFile(path, cfg); err != nil {
		t.Fatal(err)
	}
	content, err := fetchtest.File(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("generated %s (%d bytes) in %s", benchLargeFile, content.Size(), time.Since(start).Round(time.Millisecond))
	srv := &hubtest.Server{}
	srv.AddRepo(&hubtest.Repo{ID: benchLargeRepo, Files: []hubtest.File{{Path: benchLargeFile, Content: content, LFS: true}}})
	srv.SetCDNBase("")
	ln, err := net.Listen("tcp", net.JoinHostPort(stack.NodeAddress, "0"))
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String(), content.Size()
}

func benchEngineResource(t *testing.T, ns, name, largeHub string, sizes []*engineSize) *unstructured.Unstructured {
	t.Helper()
	image, err := stack.ImageRef(filepath.Join(env.root, "_output", "images", "ollama.tar"))
	if err != nil {
		t.Fatal(err)
	}
	apps := map[string]any{}
	for _, s := range sizes {
		type application struct {
			name      string
			lifecycle map[string]any
			slots     int64
		}
		// The zero application, where the first-token sets run, has two
		// slots: the gateway's direct lane holds one (a lease) while the
		// interleaved queue-lane requests take the other. The requests are
		// sequential: Ollama never runs two at once.
		list := []application{
			{s.zero, map[string]any{"minReplicas": int64(0), "maxReplicas": int64(1), "zeroAfter": "1h", "maxWait": "5m"}, 2},
			{s.sleep, map[string]any{"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "6s", "maxWait": "5m"}, 1},
		}
		if *benchEngineTTFT {
			list = list[:1] // the first-token sets use the zero application only
		}
		for _, a := range list {
			apps[a.name] = map[string]any{
				"runtime": map[string]any{
					"engine": "ollama", "image": image,
					"resources": map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "256Mi"}},
				},
				"serving":   map[string]any{"servedModelName": a.name, "maxConcurrency": a.slots, "contextLength": int64(ollamaContext)},
				"lifecycle": a.lifecycle,
			}
		}
	}
	obj := mirroredOrchestra(t, ns, name, apps)
	for _, s := range sizes[1:] {
		for _, a := range []string{s.zero, s.sleep} {
			must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
				"source": "hf://" + benchLargeRepo, "hubEndpoint": largeHub, "format": "gguf", "file": benchLargeFile,
				"cache": map[string]any{"size": fmt.Sprintf("%dMi", s.bytes*2>>20+64)},
			}, "spec", "applications", a, "model"))
		}
	}
	return obj
}

// benchZeroRound times -engine-bench-wakes wakes from zero through the
// gateway and as many plain scales 0 -> 1 of the same StatefulSet to its
// engine's first answer, in alternating order, then the first-token sets on
// the root the last of them left (benchFirstTokens).
func benchZeroRound(ctx context.Context, t *testing.T, ns, name, base, token string, relays []string, s *engineSize, round int) {
	t.Helper()
	for i := range 2 * *benchEngineWakes {
		// They alternate, so that each follows the other as often.
		if i%2 == 0 {
			benchWake(ctx, t, ns, name, base, token, s, round, i/2)
		} else {
			benchPlainScale(ctx, t, ns, name, s, round, i/2)
		}
	}
	benchFirstTokens(ctx, t, ns, name, base, token, relays, s, round)
}

// benchWake times one wake from zero: a streamed chat through the gateway
// at zero pods to its first non-empty content.
func benchWake(ctx context.Context, t *testing.T, ns, name, base, token string, s *engineSize, round, i int) {
	t.Helper()
	timedWithContent(t, s, round, "the wake", fmt.Sprintf("wake %d %d", round, i), func(prompt string) bool {
		toZero(ctx, t, ns, name, s.zero)
		pods := watchRoot(ctx, t, ns, name, s.zero)
		sent := time.Now()
		ttft, _, err := streamTimed(ctx, base+"/chat/completions", token, s.zero, prompt)
		tl := pods.stop(sent)
		if errors.Is(err, errNoContent) {
			return false
		}
		if err != nil {
			t.Fatalf("%s round %d: the wake: %v", s.label, round, err)
		}
		tl.first = ttft
		s.wake = append(s.wake, tl)
		t.Logf("%s round %d: wake -> first token %v (pod created %v, running %v after the request)", s.label, round, ttft, tl.created, tl.running)
		return true
	})
}

// timedWithContent runs one timing (a wake or a plain scale, from its
// start) asked prompt until its answer has content, with the prompt's last
// character changed each time, up to contentAttempts times: an answer
// without content (the generated model drew the end token first) has no
// first token. timed reports false for such an answer.
func timedWithContent(t *testing.T, s *engineSize, round int, what, prompt string, timed func(prompt string) bool) {
	t.Helper()
	for attempt := range contentAttempts {
		if timed(attemptPrompt(prompt, attempt)) {
			return
		}
		t.Logf("%s round %d: %s: the answer had no content; timing it again from its start with another prompt", s.label, round, what)
	}
	t.Fatalf("%s round %d: %s: %d answers without content", s.label, round, what, contentAttempts)
}

// contentAttempts bounds the times a wake or a plain scale is timed again
// because its answer had no content.
const contentAttempts = 3

// attemptPrompt is prompt for the first attempt, and for a later one the
// prompt with its last character changed (the same length).
func attemptPrompt(prompt string, attempt int) string {
	if attempt == 0 {
		return prompt
	}
	return prompt[:len(prompt)-1] + string(rune('a'+attempt))
}

// benchPlainScale times one plain scale 0 -> 1, as kubectl scale does, to
// the engine's first answer, asked directly (pod IP) every 20 ms from the
// moment a watch sees the pod run.
func benchPlainScale(ctx context.Context, t *testing.T, ns, name string, s *engineSize, round, i int) {
	t.Helper()
	timedWithContent(t, s, round, "the plain scale", fmt.Sprintf("plain %d %d", round, i), func(prompt string) bool {
		return benchPlainScaleOnce(ctx, t, ns, name, s, round, prompt)
	})
}

// benchPlainScaleOnce is one plain scale asked prompt; false when the
// engine's answer had no content.
func benchPlainScaleOnce(ctx context.Context, t *testing.T, ns, name string, s *engineSize, round int, prompt string) bool {
	t.Helper()
	sts := name + "-" + s.zero
	toZero(ctx, t, ns, name, s.zero)
	pods := watchRoot(ctx, t, ns, name, s.zero)
	start := time.Now()
	if err := lifecycle.Scale(ctx, env.cs, ns, sts, 1); err != nil {
		t.Fatal(err)
	}
	// The pod's address comes from the watch that times it, which runs
	// during the wakes too: both pay for it alike.
	var ip string
	select {
	case <-pods.ran:
		ip = pods.ip
	case <-time.After(5 * time.Minute):
		t.Fatalf("%s round %d: the plainly scaled root did not run within 5 minutes", s.label, round)
	}
	var first time.Duration
	deadline := start.Add(5 * time.Minute)
	for first == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s round %d: the plainly scaled root did not answer within 5 minutes", s.label, round)
		}
		reqSent := time.Now()
		ttft, _, err := streamTimed(ctx, "http://"+net.JoinHostPort(ip, "8080")+"/v1/chat/completions", "", s.zero, prompt)
		if errors.Is(err, errNoContent) {
			pods.stop(start)
			return false
		}
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		first = reqSent.Sub(start) + ttft
	}
	tl := pods.stop(start)
	tl.first = first
	s.baseline = append(s.baseline, tl)
	t.Logf("%s round %d: plain scale -> first answer %v (pod created %v, running %v after the scale)", s.label, round, first, tl.created, tl.running)
	return true
}

// startTimes is one wake or plain scale, each step from its start (the
// request sent, the scale asked): the root pod's creation and its running
// with an IP, as a watch from the test saw them, and the first token.
type startTimes struct{ created, running, first time.Duration }

// rootWatch records when an application's new root pod appears and runs.
type rootWatch struct {
	done             chan struct{}
	cancel           context.CancelFunc
	created, running time.Time
	// ran is closed when the pod runs, at address ip.
	ran chan struct{}
	ip  string
}

// watchRoot watches the application's root pods (there are none: toZero)
// until stop.
func watchRoot(ctx context.Context, t *testing.T, ns, name, app string) *rootWatch {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	w, err := env.cs.CoreV1().Pods(ns).Watch(wctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + app + ",app.kubernetes.io/component=root"})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	rw := &rootWatch{done: make(chan struct{}), cancel: cancel, ran: make(chan struct{})}
	go func() {
		defer close(rw.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.DeletionTimestamp != nil {
				continue
			}
			now := time.Now()
			if rw.created.IsZero() {
				rw.created = now
			}
			if rw.running.IsZero() && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				rw.running, rw.ip = now, p.Status.PodIP
				close(rw.ran)
			}
		}
	}()
	return rw
}

// stop ends the watch and returns its times from start.
func (rw *rootWatch) stop(start time.Time) startTimes {
	rw.cancel()
	<-rw.done
	since := func(at time.Time) time.Duration {
		if at.IsZero() {
			return 0
		}
		return at.Sub(start)
	}
	return startTimes{created: since(rw.created), running: since(rw.running)}
}

// benchFirstTokens runs benchPairs sets of streamed chats to the awake
// root of the zero application, one a path of firstTokenPaths in rotating
// order, and round trips through the NATS pod between them. The root has
// no sidecar: direct requests, which the lifecycle does not see, cannot make
// it fall asleep in the middle.
func benchFirstTokens(ctx context.Context, t *testing.T, ns, name, base, token string, relays []string, s *engineSize, round int) {
	t.Helper()
	sts := name + "-" + s.zero
	eventually(t, time.Minute, func() error {
		if state := lifecycleState(ctx, ns, sts); state != string(v1alpha1.LifecycleAwake) {
			return fmt.Errorf("%s: lifecycle %q; want Awake", s.zero, state)
		}
		return nil
	})
	rootAddr := net.JoinHostPort(rootIP(ctx, ns, name, s.zero), "8080")
	// One gateway pod, by its pod IP as the relays and the engine are
	// reached: each gateway replica holds a lease of its own, and the
	// Service's NodePort would add kube-proxy's translation to the
	// gateway's paths only.
	gw := gatewayPodIP(ctx, t, ns, name)
	base = "http://" + net.JoinHostPort(gw, "8080") + "/v1"
	direct := "http://" + rootAddr + "/v1/chat/completions"
	relayed := "http://" + relays[0] + "/v1/chat/completions"
	probe := startPodProbe(ctx, t, ns, name)
	defer probe.close()
	paths := firstTokenPaths
	// target is a path's URL, token and headers.
	target := func(path string) (url, tok string, h http.Header) {
		h = http.Header{}
		switch path {
		case pathDirect:
			return direct, "", h
		case pathRelay:
			h.Set(relayViaHeader, rootAddr) // the first relay pod straight to the engine
			return relayed, "", h
		case pathRelays:
			h.Set(relayViaHeader, relayVia(relays, rootAddr))
			return relayed, "", h
		case pathGatewayQueue:
			h.Set(gateway.HeaderLane, "queue")
		}
		return base + "/chat/completions", token, h
	}
	// measure sends one request of path; a request meant for the
	// gateway's direct lane that the gateway queued (its lease not held
	// yet, or being renewed at the dispatcher's leaseMaxAge) is repeated, not
	// counted.
	measure := func(path, prompt string) (time.Duration, float64, error) {
		url, tok, h := target(path)
		for try := 0; ; try++ {
			first, rate, lane, err := streamContentWith(ctx, url, tok, h, s.zero, prompt)
			if err != nil || path != pathGateway || lane == "direct" || try == 20 {
				if err == nil && path == pathGateway && lane != "direct" {
					err = fmt.Errorf("the gateway queued 20 requests in a row: no lease for its direct lane")
				}
				return first, rate, err
			}
			s.laneMisses++
			// The queued request left its prompt in Ollama's prompt cache:
			// the repeat starts with another character (same length), so
			// that it shares no prefix with it and gains nothing from it.
			prompt = string(rune('A'+try%26)) + prompt[1:]
			time.Sleep(100 * time.Millisecond) // the lease is on its way
		}
	}
	// One set first, not counted: the first requests after a wake or a
	// pause stream at a fraction of the usual rate (cold caches) on every
	// path.
	for _, path := range paths {
		if _, _, err := measure(path, fmt.Sprintf("warm %d %s", round, pathCode[path])); err != nil {
			t.Fatalf("%s round %d: %s warm-up request: %v", s.label, round, path, err)
		}
	}
	for i := range benchPairs {
		// Each request has a prompt of its own, of one length, and the
		// order rotates: no path gains from Ollama's prompt cache (an
		// earlier version sent the pair one prompt, gateway first, which
		// handed the direct request the cached prompt) or from its place.
		for k := range paths {
			path := paths[(i+k)%len(paths)]
			first, rate, err := measure(path, fmt.Sprintf("pair %d %d %s", round, i, pathCode[path]))
			t.Logf("%s round %d set %d: %s first token %v, %.0f tokens/s", s.label, round, i, path, first, rate)
			if err != nil {
				t.Fatalf("%s round %d: %s request: %v", s.label, round, path, err)
			}
			s.first[path] = append(s.first[path], first)
			s.rate[path] = appendRate(s.rate[path], rate)
		}
		// The floor of a process hop on this node: round trips through
		// the NATS pod while the engine is idle, and while it streams an
		// answer (a direct request of its own, not measured above).
		s.podIdle = append(s.podIdle, probe.rtts(20)...)
		s.podBusy = append(s.podBusy, probe.during(t, func() {
			if _, _, err := streamContent(ctx, direct, "", s.zero, fmt.Sprintf("probe %d %d x", round, i)); err != nil {
				t.Fatalf("%s round %d: probe request: %v", s.label, round, err)
			}
		})...)
	}
}

// podProbe measures round trips through the orchestra's NATS pod from the
// test process: a request that the test process answers itself, so each
// one passes through the pod twice, as a request passes through a data-plane
// pod on its way to the engine and back.
type podProbe struct {
	nc   *nats.Conn
	subj string
}

func startPodProbe(ctx context.Context, t *testing.T, ns, name string) *podProbe {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=nats"})
	if err != nil || len(pods.Items) == 0 || pods.Items[0].Status.PodIP == "" {
		t.Fatalf("the NATS pod of %s: %d pods (%v)", name, len(pods.Items), err)
	}
	nc, err := nats.Connect("nats://" + net.JoinHostPort(pods.Items[0].Status.PodIP, "4222"))
	if err != nil {
		t.Fatal(err)
	}
	p := &podProbe{nc: nc, subj: "bench.probe." + nats.NewInbox()[len("_INBOX."):]}
	if _, err := nc.Subscribe(p.subj, func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *podProbe) close() { p.nc.Close() }

func (p *podProbe) rtt() (time.Duration, bool) {
	start := time.Now()
	_, err := p.nc.Request(p.subj, nil, time.Second)
	return time.Since(start), err == nil
}

// rtts measures n round trips, 2 ms apart.
func (p *podProbe) rtts(n int) []time.Duration {
	var out []time.Duration
	for range n {
		if d, ok := p.rtt(); ok {
			out = append(out, d)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return out
}

// during measures round trips, 2 ms apart, while f runs.
func (p *podProbe) during(t *testing.T, f func()) []time.Duration {
	t.Helper()
	done := make(chan struct{})
	got := make(chan []time.Duration, 1)
	go func() {
		var out []time.Duration
		for {
			select {
			case <-done:
				got <- out
				return
			default:
			}
			if d, ok := p.rtt(); ok {
				out = append(out, d)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	f()
	close(done)
	return <-got
}

// benchSleepRound times a wake from sleep through the gateway; one whose
// answer had no content is timed again once the application sleeps again.
func benchSleepRound(ctx context.Context, t *testing.T, ns, name, base, token string, s *engineSize, round int) {
	t.Helper()
	timedWithContent(t, s, round, "the wake from sleep", fmt.Sprintf("sleep wake %d", round), func(prompt string) bool {
		return benchSleepWakeOnce(ctx, t, ns, name, base, token, s, round, prompt)
	})
}

// benchSleepWakeOnce waits for the application to sleep and times one wake
// asked prompt; false when the answer had no content.
func benchSleepWakeOnce(ctx context.Context, t *testing.T, ns, name, base, token string, s *engineSize, round int, prompt string) bool {
	t.Helper()
	eventually(t, 2*time.Minute, func() error {
		st, err := appStatus(ctx, ns, name, s.sleep)
		if err != nil {
			return err
		}
		if lc := st.Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleAsleep {
			return fmt.Errorf("%s: lifecycle %s; want Asleep", s.sleep, lifecycleJSON(st.Lifecycle))
		}
		if sc, err := sidecarState(ctx, ns, name+"-"+s.sleep+"-0"); err != nil || sc.State != sidecarapi.Asleep {
			return fmt.Errorf("%s: sidecar %+v (%v); want Asleep", s.sleep, sc, err) //nolint:errorlint // err may be nil: what the poll saw
		}
		return nil
	})
	ttft, _, err := streamTimed(ctx, base+"/chat/completions", token, s.sleep, prompt)
	if errors.Is(err, errNoContent) {
		return false
	}
	if err != nil {
		t.Fatalf("%s round %d: the wake from sleep: %v", s.label, round, err)
	}
	s.sleepWake = append(s.sleepWake, ttft)
	t.Logf("%s round %d: sleep -> wake -> first token %v", s.label, round, ttft)
	return true
}

func appendRate(r []float64, v float64) []float64 {
	if v > 0 {
		return append(r, v)
	}
	return r
}

// zeroSettle is how long toZero waits after the last root pod is gone:
// the kubelet still tears the pod's sandbox down after the API server
// deleted it, and a pod started meanwhile would share the node's CPU with
// that, so that wake and plain scale both start from a settled node.
const zeroSettle = 3 * time.Second

// toZero brings an application to zero pods by a plain scale while its
// lifecycle is not waking (as TestWakeBenchmark does), waits for it Idle
// with no root pod, then zeroSettle. The phase alone does not do: the
// operator's status can still say Idle while the leader has taken a root
// that a plain scale started as awake.
func toZero(ctx context.Context, t *testing.T, ns, name, app string) {
	t.Helper()
	sts := name + "-" + app // the root StatefulSet
	polltest.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() error {
		st, err := appStatus(ctx, ns, name, app)
		if err != nil {
			return err
		}
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "modelorchestra.io/application=" + app + ",app.kubernetes.io/component=root"})
		if err != nil {
			return err
		}
		if st.Phase == v1alpha1.PhaseIdle && len(pods.Items) == 0 {
			return nil
		}
		var seen []string
		running := false
		for _, p := range pods.Items {
			seen = append(seen, fmt.Sprintf("%s %s deleting=%t", p.Name, p.Status.Phase, p.DeletionTimestamp != nil))
			running = running || p.DeletionTimestamp == nil
		}
		if lc := st.Lifecycle; running && (lc == nil || lc.State != v1alpha1.LifecycleWaking) {
			if err := lifecycle.Scale(ctx, env.cs, ns, sts, 0); err != nil {
				return err
			}
		}
		return fmt.Errorf("%s: phase %s, lifecycle %s, root pods %v; want Idle and none", app, st.Phase, lifecycleJSON(st.Lifecycle), seen)
	})
	time.Sleep(zeroSettle)
}

// rootIP is the pod IP of the application's root pod, "" while it has none.
func rootIP(ctx context.Context, ns, name, app string) string {
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + app + ",app.kubernetes.io/component=root"})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p.Status.PodIP
		}
	}
	return ""
}

// gatewayPodIP is the IP of the first ready gateway pod, by name.
func gatewayPodIP(ctx context.Context, t *testing.T, ns, name string) string {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=gateway"})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return p.Status.PodIP
			}
		}
	}
	t.Fatalf("no ready gateway pod in %s", ns)
	return ""
}

// streamContent is streamTimed, asked again with the prompt's last
// character changed (the same length) when the generated model's first
// token ends the answer (no content): its weights are random, and now and
// then a prompt draws the end token first.
func streamContent(ctx context.Context, url, token, model, prompt string) (time.Duration, float64, error) {
	return streamContentVia(ctx, url, token, "", model, prompt)
}

// streamContentVia is streamContent with the relay pods' X-Relay-Via
// header (none when via is empty).
func streamContentVia(ctx context.Context, url, token, via, model, prompt string) (time.Duration, float64, error) {
	h := http.Header{}
	if via != "" {
		h.Set(relayViaHeader, via)
	}
	first, rate, _, err := streamContentWith(ctx, url, token, h, model, prompt)
	return first, rate, err
}

// streamContentWith is streamContent with request headers; it also
// returns the lane the gateway says it took (gateway.HeaderLane).
func streamContentWith(ctx context.Context, url, token string, h http.Header, model, prompt string) (time.Duration, float64, string, error) {
	var err error
	for k := range 5 {
		p := attemptPrompt(prompt, k)
		var first time.Duration
		var rate float64
		var lane string
		if first, rate, lane, err = streamTimedWith(ctx, url, token, h, model, p); !errors.Is(err, errNoContent) {
			return first, rate, lane, err
		}
	}
	return 0, 0, "", err
}

var errNoContent = errors.New("no content before [DONE]")

// streamTimed sends one streamed chat of up to 64 tokens and returns the
// time to its first non-empty content and its tokens per second after the
// first (ssetest.Result.TokensPerSecond).
func streamTimed(ctx context.Context, url, token, model, prompt string) (time.Duration, float64, error) {
	return streamTimedVia(ctx, url, token, "", model, prompt)
}

// streamTimedVia is streamTimed with the relay pods' X-Relay-Via header
// (none when via is empty).
func streamTimedVia(ctx context.Context, url, token, via, model, prompt string) (time.Duration, float64, error) {
	h := http.Header{}
	if via != "" {
		h.Set(relayViaHeader, via)
	}
	first, rate, _, err := streamTimedWith(ctx, url, token, h, model, prompt)
	return first, rate, err
}

// streamTimedWith is streamTimed with request headers; it also returns
// the lane the gateway says it took.
func streamTimedWith(ctx context.Context, url, token string, header http.Header, model, prompt string) (time.Duration, float64, string, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	sent, res, err := ssetest.Post(rctx, url, token, header, map[string]any{
		"model": model, "stream": true, "max_tokens": 64, "stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	}, nil)
	if err != nil {
		return 0, 0, "", err
	}
	lane := res.Header.Get(gateway.HeaderLane)
	if res.FirstContent.IsZero() {
		return 0, 0, lane, errNoContent
	}
	return res.FirstContent.Sub(sent), res.TokensPerSecond(), lane, nil
}
