package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/lifecycle"
)

var (
	benchLifecycle = flag.Bool("lifecycle-bench", false, "run the wake benchmark (make bench-lifecycle) instead of skipping it")
	benchRounds    = flag.Int("lifecycle-bench-rounds", 5, "wakes (and kubectl-scale baselines) measured by the wake benchmark")
	benchDocs      = flag.String("lifecycle-bench-docs", "", "write the wake benchmark's table between the bench-lifecycle markers of this file (relative to the module root)")
)

// The markers of the wake benchmark's block in docs/benchmarks.md.
const (
	wakeStartMarker = "<!-- bench-lifecycle:start -->"
	wakeEndMarker   = "<!-- bench-lifecycle:end -->"
)

// wakeTimes are the moments of one wake, as this process saw them (watch
// events, so each includes a watch's delivery latency).
type wakeTimes struct {
	request  time.Time // the streamed request was sent
	scaled   time.Time // the root StatefulSet's replicas became 1
	podReady time.Time // the root pod became Ready
	// answers: the root's engine first answered GET /health, asked by
	// this process every answerProbe from the moment the pod had an
	// address (what the kubelet's probe would see, without its tick).
	answers time.Time
	// listed: the application's Service's EndpointSlice listed the root
	// ready (the dispatcher takes its roots from there).
	listed     time.Time
	firstToken time.Time // the first content delta arrived
	// warm is a second request's time to its first token, sent right
	// after the first answer, to the same pod while awake: the gateway,
	// queue, dispatcher and engine path that every request takes.
	warm time.Duration
}

// TestWakeBenchmark measures, on the real-node cluster, the first request to
// an application at zero until its first token, split into our control
// overhead (request -> replicas written, and root ready -> first token) and
// Kubernetes plus the engine (replicas written -> root ready), against a
// baseline in the same run: the same StatefulSet scaled from 0 to 1 by a
// plain scale (as kubectl scale does) until its pod is ready.
func TestWakeBenchmark(t *testing.T) {
	if !*benchLifecycle {
		t.Skip("the wake benchmark runs with -lifecycle-bench (make bench-lifecycle)")
	}
	requireCluster(t)
	// About 10 s a round (two pod starts, two scales to zero) on an idle
	// machine; the bound leaves room for a busy one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+time.Duration(*benchRounds)*30*time.Second)
	defer cancel()
	ns := newNamespace(ctx, t, "bench-wake")
	const name = "wake"
	token, err := stack.EnsureToken(ctx, env.cs, ns, "bench-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := simulatorResource(t, ns, name)
	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(0), "maxReplicas": int64(1), "zeroAfter": "3s", "maxWait": "5m",
	}, "spec", "applications", app, "lifecycle"))
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	root := name + "-" + app
	loadBefore := loadAverage()

	var wakes, baselines []wakeTimes
	for round := range *benchRounds {
		// The wake: one streamed request at zero.
		waitZeroPods(ctx, t, ns, name)
		w := wakeTimes{}
		stop := watchWake(ctx, t, ns, root, &w)
		var once sync.Once
		w.request = time.Now()
		_, err := stack.StreamChat(ctx, base, token, served, fmt.Sprintf("wake %d", round), 8, func(string) {
			once.Do(func() { w.firstToken = time.Now() })
		})
		// The answer can be complete before the EndpointSlice lists the
		// root (the dispatchers do not wait for it): wait for the listing.
		for deadline := time.Now().Add(10 * time.Second); w.listedAt().IsZero() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		if err != nil || w.scaled.IsZero() || w.podReady.IsZero() || w.listed.IsZero() || w.answersAt().IsZero() || w.firstToken.IsZero() {
			t.Fatalf("round %d: %v (times %+v)", round, err, w)
		}
		var warmFirst time.Time
		var warmOnce sync.Once
		sent := time.Now()
		if _, err := stack.StreamChat(ctx, base, token, served, fmt.Sprintf("warm %d", round), 8, func(string) {
			warmOnce.Do(func() { warmFirst = time.Now() })
		}); err != nil || warmFirst.IsZero() {
			t.Fatalf("round %d: the warm request: %v", round, err)
		}
		w.warm = warmFirst.Sub(sent)
		t.Logf("round %d: request -> replicas %v, -> engine answers %v, -> root Ready %v (at %s), -> listed %v, -> first token %v (at %s); warm first token %v", round,
			w.scaled.Sub(w.request), w.answers.Sub(w.request), w.podReady.Sub(w.request), w.podReady.UTC().Format(time.StampMicro), w.listed.Sub(w.request),
			w.firstToken.Sub(w.request), w.firstToken.UTC().Format(time.StampMicro), w.warm)
		wakes = append(wakes, w)

		// The baseline: the same StatefulSet, scaled as kubectl scale does.
		waitZeroPods(ctx, t, ns, name)
		b := wakeTimes{}
		stop = watchWake(ctx, t, ns, root, &b)
		b.request = time.Now()
		if err := lifecycle.Scale(ctx, env.cs, ns, root, 1); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Minute)
		for (b.podReadyAt().IsZero() || b.answersAt().IsZero()) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		if b.podReadyAt().IsZero() || b.answersAt().IsZero() {
			t.Fatalf("baseline %d: the pod did not become ready, or its engine did not answer (times %+v)", round, b)
		}
		baselines = append(baselines, b)
		// Back to zero by a plain scale too, not after zeroAfter: a round
		// takes seconds less. The lifecycle follows once it has taken the
		// scale up as a wake and is awake (a scale to zero while it
		// wakes would be woken again).
		for state := ""; state != string(v1alpha1.LifecycleAwake); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("baseline %d: the lifecycle did not follow the scale up (state %q)", round, state)
			}
			state = lifecycleState(ctx, ns, root)
		}
		if err := lifecycle.Scale(ctx, env.cs, ns, root, 0); err != nil {
			t.Fatal(err)
		}
	}
	table := wakeTable(wakes, baselines, loadBefore, loadAverage())
	t.Log("\n" + table)
	if *benchDocs != "" {
		path := *benchDocs
		if !filepath.IsAbs(path) {
			path = filepath.Join(env.root, path)
		}
		if err := writeSection(path, table); err != nil {
			t.Error(err)
		} else {
			t.Logf("wrote the table into %s", path)
		}
	}
	if testing.Verbose() {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=dispatcher"})
		if err == nil {
			for _, p := range pods.Items {
				tail := int64(60)
				raw, err := env.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
				t.Logf("dispatcher %s (last 60 lines, %v):\n%s", p.Name, err, raw)
			}
		}
	}
}

// lifecycleState is the lifecycle state the leader last wrote on the root
// StatefulSet; "" when it cannot be read.
func lifecycleState(ctx context.Context, ns, root string) string {
	sts, err := env.cs.AppsV1().StatefulSets(ns).Get(ctx, root, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	var st v1alpha1.LifecycleStatus
	if json.Unmarshal([]byte(sts.Annotations[v1alpha1.AnnotationLifecycleStatus]), &st) != nil {
		return ""
	}
	return string(st.State)
}

var wakeMu sync.Mutex

func (w *wakeTimes) listedAt() time.Time {
	wakeMu.Lock()
	defer wakeMu.Unlock()
	return w.listed
}

func (w *wakeTimes) podReadyAt() time.Time {
	wakeMu.Lock()
	defer wakeMu.Unlock()
	return w.podReady
}

func (w *wakeTimes) answersAt() time.Time {
	wakeMu.Lock()
	defer wakeMu.Unlock()
	return w.answers
}

// answerProbe is how often the benchmark asks a starting root's engine
// whether it answers.
const answerProbe = 5 * time.Millisecond

// probeEngine asks the engine of pod p whether it answers
// (engineAnswers) every answerProbe until it does (recorded in w.answers)
// or ctx ends.
func probeEngine(ctx context.Context, p *corev1.Pod, w *wakeTimes) {
	for ctx.Err() == nil {
		if engineAnswers(ctx, p) {
			wakeMu.Lock()
			if w.answers.IsZero() {
				w.answers = time.Now()
			}
			wakeMu.Unlock()
			return
		}
		time.Sleep(answerProbe)
	}
}

// watchWake records when the root StatefulSet gets replicas and when its
// first pod becomes ready.
func watchWake(ctx context.Context, t *testing.T, ns, root string, w *wakeTimes) (stop func()) {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	sts, err := env.cs.AppsV1().StatefulSets(ns).Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=" + root})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := env.cs.CoreV1().Pods(ns).Watch(wctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=root,modelorchestra.io/application=" + app})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := env.cs.DiscoveryV1().EndpointSlices(ns).Watch(wctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + root})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for e := range slices.ResultChan() {
			es, ok := e.Object.(*discoveryv1.EndpointSlice)
			if !ok || e.Type == watch.Deleted {
				continue
			}
			for _, ep := range es.Endpoints {
				c := ep.Conditions
				if (c.Ready == nil || *c.Ready) && (c.Terminating == nil || !*c.Terminating) {
					wakeMu.Lock()
					if w.listed.IsZero() {
						w.listed = time.Now()
					}
					wakeMu.Unlock()
				}
			}
		}
	})
	wg.Go(func() {
		for e := range sts.ResultChan() {
			if s, ok := e.Object.(*appsv1.StatefulSet); ok && e.Type != watch.Deleted && s.Spec.Replicas != nil && *s.Spec.Replicas > 0 {
				wakeMu.Lock()
				if w.scaled.IsZero() {
					w.scaled = time.Now()
				}
				wakeMu.Unlock()
			}
		}
	})
	wg.Go(func() {
		probing := false
		for e := range pods.ResultChan() {
			p, ok := e.Object.(*corev1.Pod)
			if !ok || e.Type == watch.Deleted || p.DeletionTimestamp != nil {
				continue
			}
			if !probing && p.Status.PodIP != "" {
				probing = true
				wg.Go(func() { probeEngine(wctx, p, w) })
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					wakeMu.Lock()
					if w.podReady.IsZero() {
						w.podReady = time.Now()
					}
					wakeMu.Unlock()
				}
			}
		}
	})
	return func() { sts.Stop(); pods.Stop(); slices.Stop(); cancel(); wg.Wait() }
}

// quantiles are the p50, p90, p99 and max of v, nearest rank (below 100
// values the p99 is the max).
type quantiles struct{ p50, p90, p99, max time.Duration }

func quantilesOf(v []time.Duration) quantiles {
	v = slices.Clone(v)
	slices.Sort(v)
	rank := func(p int) time.Duration { return v[(len(v)*p+99)/100-1] }
	return quantiles{p50: rank(50), p90: rank(90), p99: rank(99), max: v[len(v)-1]}
}

func (q quantiles) row(what string) string {
	return fmt.Sprintf("| %s | %s | %s | %s | %s |\n", what, msd(q.p50), msd(q.p90), msd(q.p99), msd(q.max))
}

// p99Note says when the nearest-rank p99 of n values is the max.
func p99Note(n int) string {
	if n < 100 {
		return fmt.Sprintf(": with %d rounds the p99 is the max", n)
	}
	return fmt.Sprintf(" (%d rounds)", n)
}

// wakeTable summarises the rounds: p50, p90, p99 and max, nearest rank,
// and whether the targets (at p99) are met.
func wakeTable(wakes, baselines []wakeTimes, loadBefore, loadAfter string) string {
	col := func(ws []wakeTimes, f func(wakeTimes) time.Duration) quantiles {
		var v []time.Duration
		for _, w := range ws {
			v = append(v, f(w))
		}
		return quantilesOf(v)
	}
	decision := func(w wakeTimes) time.Duration { return w.scaled.Sub(w.request) }
	// Our control overhead: the decision, and what the first token took
	// once the engine answered (the dispatchers run a starting root's
	// probes themselves and do not wait for the kubelet's Ready), beyond
	// the path every request takes.
	overhead := func(w wakeTimes) time.Duration {
		return decision(w) + w.firstToken.Sub(w.answers) - w.warm
	}
	total := func(w wakeTimes) time.Duration { return w.firstToken.Sub(w.request) }
	toReady := func(w wakeTimes) time.Duration { return w.podReady.Sub(w.request) }
	rows := []struct {
		what string
		f    func(wakeTimes) time.Duration
	}{
		{"control: request -> replicas written", decision},
		{"Kubernetes + engine: replicas written -> engine answers", func(w wakeTimes) time.Duration { return w.answers.Sub(w.scaled) }},
		{"Kubernetes: engine answers -> root Ready (the kubelet's probe)", func(w wakeTimes) time.Duration { return w.podReady.Sub(w.answers) }},
		{"Kubernetes: root Ready -> listed ready in the EndpointSlice", func(w wakeTimes) time.Duration { return w.listed.Sub(w.podReady) }},
		{"engine answers -> first token", func(w wakeTimes) time.Duration { return w.firstToken.Sub(w.answers) }},
		{"warm request -> first token (awake, same pod)", func(w wakeTimes) time.Duration { return w.warm }},
		{"control overhead: decision + (engine answers -> first token - warm)", overhead},
		{"**wake: request -> first token**", total},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make bench-lifecycle` (`go test ./internal/e2e -run TestWakeBenchmark\n"+
		"-lifecycle-bench -lifecycle-bench-rounds %d`) on the real-node local cluster (%d CPUs; load average\n"+
		"%s before, %s after): the simulator sample with a lifecycle (`zeroAfter: 3s`,\n"+
		"`--ttft=20ms`; its startup probe asks every second). Each round sends one streamed chat to the\n"+
		"application at zero pods and times, from watch events seen by the benchmark, the replicas being\n"+
		"written, the root pod turning Ready and the first token; the benchmark also asks the root's\n"+
		"engine `GET /health` every %v from the moment its pod has an address, to see when it answers.\n"+
		"Then the same StatefulSet, at zero again, is scaled to 1 by a plain scale (as `kubectl scale`\n"+
		"does) and timed to Ready, and scaled back to zero. A second request right after the first\n"+
		"answer times the path every request takes (gateway, queue, dispatcher, the engine's 20 ms to its\n"+
		"first token). The control overhead is the decision plus what the first token took from the\n"+
		"engine answering, beyond that path: the dispatchers run a starting root's own probes and send it\n"+
		"the waiting requests when they pass, before the kubelet's next probe marks the pod Ready.\n"+
		"Percentiles are nearest rank%s.\n\n",
		len(wakes), runtime.NumCPU(), loadBefore, loadAfter, answerProbe, p99Note(len(wakes)))
	b.WriteString("| Stage | p50 | p90 | p99 | max |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		b.WriteString(col(wakes, r.f).row(r.what))
	}
	bl := col(baselines, toReady)
	b.WriteString(bl.row("**baseline: plain scale 0 -> 1 -> root Ready**"))
	b.WriteString(col(baselines, func(w wakeTimes) time.Duration { return w.answers.Sub(w.request) }).row("baseline: plain scale 0 -> 1 -> engine answers"))
	wake, ctl := col(wakes, total), col(wakes, overhead)
	ratio50 := float64(wake.p50) / float64(bl.p50)
	ratio := float64(wake.p99) / float64(bl.p99)
	verdict := "Both targets met."
	switch {
	case ratio > 1.1 && ctl.p99 > 50*time.Millisecond:
		verdict = "**Neither target met.**"
	case ratio > 1.1:
		verdict = "**The wake-to-first-token target is not met.**"
	case ctl.p99 > 50*time.Millisecond:
		verdict = "**The control overhead target is not met.**"
	}
	fmt.Fprintf(&b, "\nwake-to-first-token / baseline: %.2f at p50, %.2f at p99 (target <= 1.1); control overhead (p99):\n%s (target <= 50 ms). %s\n",
		ratio50, ratio, msd(ctl.p99), verdict)
	return b.String()
}

// writeSection replaces the wake benchmark's block of the file at path.
func writeSection(path, content string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(raw)
	i, j := strings.Index(doc, wakeStartMarker), strings.Index(doc, wakeEndMarker)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s ... %s block", path, wakeStartMarker, wakeEndMarker)
	}
	doc = doc[:i+len(wakeStartMarker)] + "\n" + content + doc[j:]
	return os.WriteFile(path, []byte(doc), 0o644)
}

// loadAverage is /proc/loadavg's three load averages: how busy the shared
// machine was.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func msd(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
