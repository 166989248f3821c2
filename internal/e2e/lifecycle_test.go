package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/npmsdk"
)

// TestScaleToZeroAndWake runs a simulator application with a short
// zeroAfter on real pods: it reaches zero engine pods, then concurrent
// requests (half streamed) sent while it is at zero are all answered 2xx,
// also when the dispatcher (the lifecycle leader) is killed mid-wake, a
// batch sent at zero wakes it and completes (the npm openai SDK), and
// bursts timed to arrive while it scales down are never cut or lost.
func TestScaleToZeroAndWake(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-zero")
	const name, zeroAfter = "zero", 5 * time.Second

	token := apiToken(ctx, t, ns)
	obj := simulatorResource(t, ns, name)
	// The bursts come from one token: no per-token limits.
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))

	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(0), "maxReplicas": int64(2), "zeroAfter": zeroAfter.String(), "maxWait": "5m",
	}, "spec", "applications", app, "lifecycle"))
	base, served := deployAndChat(ctx, t, ns, name, token, obj)

	t.Run("256 requests, half streamed, at zero pods", func(t *testing.T) {
		wakes := waitZeroPods(ctx, t, ns, name)
		before := failedDeliveries(ctx, t, ns)
		if errs := burst(ctx, base, token, served, "zero", 256); len(errs) > 0 {
			t.Fatalf("%d of 256 requests sent at zero were not answered completely:\n%s", len(errs), strings.Join(errs, "\n"))
		}
		// Answered is not enough: a request that waited for the wake must
		// reach the new root at its first delivery.
		if grew := grown(before, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
			t.Errorf("requests sent at zero were not all delivered once; the dispatcher counted:\n%s", strings.Join(grew, "\n"))
		}
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if lc := mo.Status.Applications[app].Lifecycle; lc == nil || lc.Wakes != wakes+1 {
			t.Errorf("status.applications.%s.lifecycle = %+v; want one more wake than %d", app, lc, wakes)
		}
	})

	t.Run("a batch sent at zero pods wakes the application and completes", func(t *testing.T) {
		otherToken, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-other-token")
		if err != nil {
			t.Fatal(err)
		}
		dir := npmsdk.Dir(t, filepath.Join(env.root, "internal", "gateway", "testdata", "npm-sdk"))
		wakes := waitZeroPods(ctx, t, ns, name)
		npmsdk.Batches(t, dir, base, token, otherToken, served, 8)
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if lc := mo.Status.Applications[app].Lifecycle; lc == nil || lc.Wakes != wakes+1 {
			t.Errorf("status.applications.%s.lifecycle = %+v; want one more wake than %d: the batch's first line wakes it", app, lc, wakes)
		}
	})

	t.Run("the dispatcher killed in the middle of a wake", func(t *testing.T) {
		waitZeroPods(ctx, t, ns, name)
		done := make(chan []string, 1)
		go func() { done <- burst(ctx, base, token, served, "kill", 256) }()
		// Polled faster than eventually does: the wake lasts seconds.
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			mo, err := stack.Get(ctx, env.dyn, ns, name)
			if err != nil {
				return false, nil //nolint:nilerr // polled until the timeout
			}
			lc := mo.Status.Applications[app].Lifecycle
			return lc != nil && lc.State == v1alpha1.LifecycleWaking, nil
		})
		if err != nil {
			t.Fatalf("the application did not start waking: %v", err)
		}
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=dispatcher"})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("dispatcher pods: %d, %v", len(pods.Items), err)
		}
		for _, p := range pods.Items {
			zero := int64(0)
			must(t, env.cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
		}
		if errs := <-done; len(errs) > 0 {
			t.Fatalf("%d of 256 requests sent at zero, with the dispatcher killed mid-wake, were not answered completely:\n%s", len(errs), strings.Join(errs, "\n"))
		}
		// The consumer is paused while the application wakes, so the
		// killed dispatcher held none of them: the new one delivers each
		// once.
		if grew := grown(nil, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
			t.Errorf("requests sent at zero were not all delivered once; the new dispatcher counted:\n%s", strings.Join(grew, "\n"))
		}
	})

	t.Run("bursts while it scales down", func(t *testing.T) {
		sawTooth(ctx, t, ns, name, base, token, served, zeroAfter)
	})
}

// sawTooth sends bursts of 16 requests (half streamed) timed to arrive
// while the idle application goes to zero: half of them the moment the
// leader writes zero replicas (the root pod is terminating, the consumer
// paused), the others at the end of zeroAfter (while the leader decides
// to drain). Every request is answered completely and delivered once, and
// the bursts that came after the scale-down each woke the application.
// Bounded: four cycles of zeroAfter plus at most a wake (about a minute).
func sawTooth(ctx context.Context, t *testing.T, ns, name, base, token, model string, zeroAfter time.Duration) {
	t.Helper()
	root := name + "-" + app
	// The replica counts the leader writes, from a watch.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := env.cs.AppsV1().StatefulSets(ns).Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=" + root})
	if err != nil {
		t.Fatal(err)
	}
	zeroed := make(chan struct{}, 1)
	// The fence, seen from outside: the leader records the state Awake on
	// the root StatefulSet after it reopened the consumer, so at that
	// moment a root pod must serve (Ready, not terminating). Reopening on
	// the root that the scale to zero is taking away would let the
	// dispatchers hand it the waiting requests.
	var (
		fenceMu  sync.Mutex
		breaches []string
	)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		last, lastState := int32(-1), v1alpha1.LifecycleState("")
		for e := range w.ResultChan() {
			s, ok := e.Object.(*appsv1.StatefulSet)
			if !ok || s.Spec.Replicas == nil {
				continue
			}
			if *s.Spec.Replicas == 0 && last != 0 {
				select {
				case zeroed <- struct{}{}:
				default:
				}
			}
			last = *s.Spec.Replicas
			var st v1alpha1.LifecycleStatus
			if json.Unmarshal([]byte(s.Annotations[v1alpha1.AnnotationLifecycleStatus]), &st) != nil {
				continue
			}
			if st.State == v1alpha1.LifecycleAwake && lastState != "" && lastState != v1alpha1.LifecycleAwake {
				if msg := servingRoot(wctx, ns); msg != "" {
					fenceMu.Lock()
					breaches = append(breaches, fmt.Sprintf("%s -> Awake at %s: %s", lastState, time.Now().UTC().Format(time.StampMilli), msg))
					fenceMu.Unlock()
				}
			}
			lastState = st.State
		}
	}()
	defer func() {
		stopWatch()
		<-watched
		if len(breaches) > 0 {
			t.Errorf("the consumer was reopened with no root serving (the gate opened on a root on its way out):\n%s", strings.Join(breaches, "\n"))
		}
	}()
	status := func() *v1alpha1.LifecycleStatus {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		lc := mo.Status.Applications[app].Lifecycle
		if lc == nil {
			t.Fatalf("status.applications.%s.lifecycle is empty", app)
		}
		return lc
	}
	// Start awake, with the scale-down still ahead.
	if errs := burst(ctx, base, token, model, "saw-start", 4); len(errs) > 0 {
		t.Fatalf("requests before the saw-tooth were not answered completely:\n%s", strings.Join(errs, "\n"))
	}
	select {
	case <-zeroed: // a scale-down of the subtests before
	default:
	}
	before := failedDeliveries(ctx, t, ns)
	wakes := status().Wakes
	const cycles = 4
	afterZero := 0
	for i := range cycles {
		select {
		case <-zeroed: // a scale to zero before the last burst was answered
		default:
		}
		var when string
		if i%2 == 0 {
			// The moment the leader writes zero replicas, and a little later.
			select {
			case <-zeroed:
			case <-time.After(zeroAfter + time.Minute):
				t.Fatalf("cycle %d: the idle application did not scale to zero within zeroAfter and a minute", i)
			}
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			when = fmt.Sprintf("%v after the scale to zero", time.Duration(i)*100*time.Millisecond)
			afterZero++
		} else {
			// When the leader decides to drain (it ticks every second).
			d := zeroAfter + time.Duration(i-1)*250*time.Millisecond
			time.Sleep(d)
			when = fmt.Sprintf("%v after the last answer", d)
			select {
			case <-zeroed:
				afterZero++ // it went to zero before the burst
			default:
			}
		}
		began := time.Now()
		if errs := burst(ctx, base, token, model, fmt.Sprintf("saw-%d", i), 16); len(errs) > 0 {
			t.Fatalf("cycle %d (%s): %d of 16 requests were cut or lost:\n%s", i, when, len(errs), strings.Join(errs, "\n"))
		}
		t.Logf("cycle %d (%s): 16 answered in %v", i, when, time.Since(began).Round(time.Millisecond))
	}
	// Answered is not enough: the bursts that met the scale-down waited
	// behind the paused consumer and reached the new root at their first
	// delivery; none was handed to the root on its way out (which the
	// dispatcher would count as engine_unreachable, and JetStream deliver
	// again).
	if grew := grown(before, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
		t.Errorf("requests of the saw-tooth were delivered more than once (the scale-down raced them); the dispatchers counted:\n%s", strings.Join(grew, "\n"))
	}
	// Each burst sent after the scale to zero needed a wake: the race
	// between scaling down and new requests was exercised.
	eventually(t, 30*time.Second, func() error {
		if got := status().Wakes - wakes; got < int64(afterZero) {
			return fmt.Errorf("%d wakes during the saw-tooth, want at least the %d bursts sent after a scale to zero", got, afterZero)
		}
		return nil
	})
}

// servingRoot reports, when no root pod of the application serves (Ready
// and not terminating), what the root pods are; empty when one serves.
func servingRoot(ctx context.Context, ns string) string {
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=root,modelorchestra.io/application=" + app})
	if err != nil {
		return "" // the watch is ending
	}
	var seen []string
	for _, p := range pods.Items {
		// Ready, or not yet but its engine answers (the dispatchers run a
		// starting root's probes themselves: early readiness).
		if p.DeletionTimestamp == nil && (podReady(&p) || engineAnswers(ctx, &p)) {
			return ""
		}
		seen = append(seen, fmt.Sprintf("%s (terminating %v, ready %v)", p.Name, p.DeletionTimestamp != nil, podReady(&p)))
	}
	if len(seen) == 0 {
		return "no root pod"
	}
	return "root pods " + strings.Join(seen, ", ")
}

// engineAnswers reports whether the engine of root pod p answers GET
// /health on its port named http, as its probes ask.
func engineAnswers(ctx context.Context, p *corev1.Pod) bool {
	port := int32(0)
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == "http" {
				port = cp.ContainerPort
			}
		}
	}
	if port == 0 || p.Status.PodIP == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// failedDeliveries reads the dispatchers' failed attempts and redeliveries
// of the application from their /metrics (through the API server's pod
// proxy): series, prefixed by the pod, to value.
func failedDeliveries(ctx context.Context, t *testing.T, ns string) map[string]float64 {
	t.Helper()
	return failedDeliveriesOf(ctx, t, ns, app)
}

// failedDeliveriesOf is failedDeliveries of the application application.
func failedDeliveriesOf(ctx context.Context, t *testing.T, ns, application string) map[string]float64 {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=dispatcher"})
	if err != nil {
		t.Fatalf("listing dispatcher pods: %v", err)
	}
	out := map[string]float64{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		port := ""
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == "metrics" {
					port = strconv.Itoa(int(cp.ContainerPort))
				}
			}
		}
		raw, err := env.cs.CoreV1().Pods(ns).ProxyGet("http", p.Name, port, "/metrics", nil).DoRaw(ctx)
		if err != nil {
			t.Fatalf("reading the metrics of dispatcher %s: %v", p.Name, err)
		}
		for line := range strings.Lines(string(raw)) {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "orchestra_dispatcher_failed_total{") && !strings.HasPrefix(line, "orchestra_dispatcher_redelivered_total{") {
				continue
			}
			if !strings.Contains(line, `app="`+application+`"`) {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				t.Fatalf("dispatcher %s metrics line %q: %v", p.Name, line, err)
			}
			out[p.Name+" "+line[:i]] = v
		}
	}
	return out
}

// grown lists the series of after that are above their value in before.
func grown(before, after map[string]float64) []string {
	var out []string
	for k, v := range after {
		if v > before[k] {
			out = append(out, fmt.Sprintf("  %s: %g (was %g)", k, v, before[k]))
		}
	}
	slices.Sort(out)
	return out
}

// TestScaleOutAndBackInOnBacklog runs an application from one root to
// maxReplicas on a backlog of concurrent requests and back to one once the
// backlog has drained, on real pods: never above maxReplicas, every request
// answered and delivered once.
func TestScaleOutAndBackInOnBacklog(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-backlog")
	const name, clients, maxReplicas = "backlog", 24, 3

	token := apiToken(ctx, t, ns)
	obj := simulatorResource(t, ns, name)
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))
	// Answers of 40 tokens 50 ms apart (2 s each): 24 clients keep one
	// root's 16 slots busy and 8 requests queued, 6 replicas' worth at 4
	// per replica, until three roots serve them all.
	must(t, unstructured.SetNestedStringSlice(obj.Object, []string{"--ttft=20ms", "--itl=50ms"}, "spec", "applications", app, "runtime", "args"))
	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(1), "maxReplicas": int64(maxReplicas), "targetQueuePerReplica": int64(4), "zeroAfter": "10s",
	}, "spec", "applications", app, "lifecycle"))
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	root := name + "-" + app
	sts := func(ctx context.Context) (spec, ready int32, err error) {
		s, err := env.cs.AppsV1().StatefulSets(ns).Get(ctx, root, metav1.GetOptions{})
		if err != nil {
			return 0, 0, err
		}
		spec = 1
		if s.Spec.Replicas != nil {
			spec = *s.Spec.Replicas
		}
		return spec, s.Status.ReadyReplicas, nil
	}
	if spec, _, err := sts(ctx); err != nil || spec != 1 {
		t.Fatalf("root StatefulSet before the load: %d replicas, %v; want 1", spec, err)
	}
	before := failedDeliveries(ctx, t, ns)

	// The most replicas ever written, from a watch: no poll misses a
	// short excursion above maxReplicas.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := env.cs.AppsV1().StatefulSets(ns).Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=" + root})
	if err != nil {
		t.Fatal(err)
	}
	var most atomic.Int32
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for e := range w.ResultChan() {
			if s, ok := e.Object.(*appsv1.StatefulSet); ok && s.Spec.Replicas != nil && *s.Spec.Replicas > most.Load() {
				most.Store(*s.Spec.Replicas)
			}
		}
	}()

	// Closed-loop clients until maxReplicas roots are ready.
	stopLoad := make(chan struct{})
	var mu sync.Mutex
	var failed []string
	var answered atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				prompt := fmt.Sprintf("client %d request %d", c, i)
				res, err := stack.StreamChat(ctx, base, token, served, prompt, 40, nil)
				if err == nil && res.FinishReason == "" {
					err = fmt.Errorf("stream cut after %d chunks", res.Chunks)
				}
				if err != nil {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%s: %v", prompt, err))
					mu.Unlock()
					return
				}
				answered.Add(1)
			}
		})
	}
	stop := sync.OnceFunc(func() { close(stopLoad) })
	defer stop() // also when the wait below fails
	var ready int32
	eventually(t, 3*time.Minute, func() error {
		spec, r, err := sts(ctx)
		if err != nil {
			return err
		}
		if ready = r; ready < maxReplicas {
			return fmt.Errorf("%d concurrent clients did not scale the application to %d ready roots: %d written, %d ready", clients, maxReplicas, spec, ready)
		}
		return nil
	})
	stop()
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d requests under the backlog were not answered completely:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	t.Logf("%d ready roots after %d answers", ready, answered.Load())

	// The backlog has drained: back to one root, after the stabilization
	// window (min(zeroAfter, 1m) = 10s), its pods gone.
	sel := "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + app + ",app.kubernetes.io/component=root"
	eventually(t, 2*time.Minute, func() error {
		spec, ready, err := sts(ctx)
		if err != nil {
			return err
		}
		list, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		if spec != 1 || ready != 1 || len(list.Items) != 1 {
			return fmt.Errorf("the drained application did not scale back to one root: %d written, %d ready, %d root pods", spec, ready, len(list.Items))
		}
		return nil
	})
	stopWatch()
	<-watched
	if m := most.Load(); m != maxReplicas {
		t.Errorf("the most replicas written was %d; want maxReplicas (%d)", m, maxReplicas)
	}
	if grew := grown(before, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
		t.Errorf("requests were not all delivered once while scaling out and in; the dispatcher counted:\n%s", strings.Join(grew, "\n"))
	}
}

// waitZeroPods waits until the application runs no engine pods (asserted
// from the pods, not from the StatefulSet) and returns its wakes so far.
func waitZeroPods(ctx context.Context, t *testing.T, ns, name string) int64 {
	t.Helper()
	sel := "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + app
	var wakes int64
	eventually(t, 3*time.Minute, func() error {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel + ",app.kubernetes.io/component in (root,worker)"})
		if err != nil {
			return fmt.Errorf("listing engine pods: %w", err)
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("the idle application still runs %d engine pods (%s first)", len(pods.Items), pods.Items[0].Name)
		}
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		st := mo.Status.Applications[app]
		if st.Lifecycle != nil {
			wakes = st.Lifecycle.Wakes
		}
		if st.Phase != v1alpha1.PhaseIdle || !stack.Ready(mo) {
			return fmt.Errorf("at zero engine pods the application is in phase %s and Ready %v, want phase Idle and Ready", st.Phase, stack.Ready(mo))
		}
		return nil
	})
	return wakes
}

// burst sends n concurrent chats, every other one streamed, each with its
// own prompt, and returns a line per request that was not answered 2xx and
// completely (naming the request).
func burst(ctx context.Context, base, token, model, prefix string, n int) []string {
	var mu sync.Mutex
	var failed []string
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			prompt := fmt.Sprintf("%s request %d", prefix, i)
			var err error
			if i%2 == 0 {
				var res *stack.ChatResult
				res, err = stack.StreamChat(ctx, base, token, model, prompt, 8, nil)
				if err == nil && (!res.Done || res.FinishReason == "") {
					err = fmt.Errorf("stream cut: done %v, finish_reason %q after %d chunks", res.Done, res.FinishReason, res.Chunks)
				}
			} else {
				err = unaryChat(ctx, base, token, model, prompt)
			}
			if err != nil {
				mu.Lock()
				failed = append(failed, fmt.Sprintf("%s (streamed %v): %v", prompt, i%2 == 0, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// unaryChat sends one non-streamed chat and checks it was answered 200
// with a finished choice.
func unaryChat(ctx context.Context, base, token, model, prompt string) error {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) == 0 || out.Choices[0].FinishReason == "" {
		return errors.Join(errors.New("incomplete answer: "+string(b)), err)
	}
	return nil
}

// TestAWakeThatCannotStart wakes an application whose engine image cannot
// be pulled: within seconds its status says why (TopologyReady False,
// reason WakeFailing, the application's message naming the pod and the
// pull failure), and the requests waiting for it fail after maxWait with
// model_waking_timeout (503 and Retry-After; a streamed request, already
// answered 200 with keep-alives, gets it as an SSE error event), while the
// gateway and the dispatcher carry on untouched.
func TestAWakeThatCannotStart(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-wakefail")
	const name, maxWait = "wakefail", 20 * time.Second
	const image = "registry.invalid/model-orchestra/missing:v0"

	token := apiToken(ctx, t, ns)
	obj := simulatorResource(t, ns, name)
	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(0), "maxReplicas": int64(1), "zeroAfter": "2s", "maxWait": maxWait.String(),
	}, "spec", "applications", app, "lifecycle"))
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	waitZeroPods(ctx, t, ns, name)

	// At zero, the engine's image becomes one that cannot be pulled.
	root := name + "-" + app
	patch(ctx, t, ns, name, `{"spec":{"applications":{"`+app+`":{"runtime":{"image":"`+image+`"}}}}}`)
	eventually(t, 2*time.Minute, func() error {
		s, err := env.cs.AppsV1().StatefulSets(ns).Get(ctx, root, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Spec.Replicas == nil || *s.Spec.Replicas != 0 {
			return fmt.Errorf("the upgrade changed the root's replicas to %v; want the lifecycle's 0", s.Spec.Replicas)
		}
		for _, c := range s.Spec.Template.Spec.Containers {
			if c.Image == image {
				return nil
			}
		}
		return errors.New("the upgrade has not set the engine image of the root StatefulSet yet")
	})
	others := stackPods(ctx, t, ns)
	before := failedDeliveries(ctx, t, ns)

	type result struct {
		err     error
		elapsed time.Duration
	}
	streamed, unary := make(chan result, 1), make(chan result, 1)
	sent := time.Now()
	go func() {
		err := wakeTimeoutStreamed(ctx, base, token, served)
		streamed <- result{err, time.Since(sent)}
	}()
	go func() { err := wakeTimeoutUnary(ctx, base, token, served); unary <- result{err, time.Since(sent)} }()

	// Within seconds (well before maxWait) the status says why.
	pod := root + "-0"
	eventually(t, maxWait, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionTopologyReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonWakeFailing {
			return fmt.Errorf("condition TopologyReady %+v, want False with reason %s", c, v1alpha1.ReasonWakeFailing)
		}
		st := mo.Status.Applications[app]
		if !strings.Contains(st.Message, pod) || !strings.Contains(st.Message, "ImagePull") {
			return fmt.Errorf("status.applications.%s.message %q does not name pod %s and its image pull failure", app, st.Message, pod)
		}
		t.Logf("%.0fs after the requests: phase %s, message %q", time.Since(sent).Seconds(), st.Phase, st.Message)
		return nil
	})
	evs, err := env.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=WakeFailing,involvedObject.name=" + name})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no WakeFailing event on the ModelOrchestra (%v)", err)
	}

	for what, ch := range map[string]chan result{"streamed": streamed, "non-streamed": unary} {
		r := <-ch
		if r.err != nil {
			t.Errorf("the %s request waiting on the failing wake: %v", what, r.err)
		} else if r.elapsed < maxWait {
			t.Errorf("the %s request failed after %v, before maxWait (%v)", what, r.elapsed, maxWait)
		}
	}

	// Nothing else is affected: the gateway and the dispatcher neither
	// restarted nor counted failed deliveries, and the gateway still serves.
	if after := stackPods(ctx, t, ns); !maps.Equal(others, after) {
		t.Errorf("the gateway and dispatcher pods changed during the failing wake: before %v, after %v", others, after)
	}
	if grew := grown(before, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
		t.Errorf("the requests that timed out counted as failed deliveries:\n%s", strings.Join(grew, "\n"))
	}
	if err := listsModel(ctx, base, token, served); err != nil {
		t.Errorf("the gateway after the failing wake: %v", err)
	}
}

// stackPods maps the gateway and dispatcher pods to their restart counts.
func stackPods(ctx context.Context, t *testing.T, ns string) map[string]int32 {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component in (gateway,dispatcher)"})
	if err != nil {
		t.Fatalf("listing the gateway and dispatcher pods: %v", err)
	}
	out := map[string]int32{}
	for _, p := range pods.Items {
		var restarts int32
		for _, s := range p.Status.ContainerStatuses {
			restarts += s.RestartCount
		}
		out[p.Name] = restarts
	}
	if len(out) < 2 {
		t.Fatalf("found pods %v; want a gateway and a dispatcher", out)
	}
	return out
}

// wakeTimeoutUnary sends a non-streamed chat and checks that it is
// answered 503 model_waking_timeout with Retry-After, and why the pods
// cannot start.
func wakeTimeoutUnary(ctx context.Context, base, token, model string) error {
	resp, err := postChat(ctx, base, token, model, false)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		return fmt.Errorf("HTTP %d, Retry-After %q: %s; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	return wakingTimeoutError(b)
}

// wakeTimeoutStreamed sends a streamed chat and checks that it gets its
// headers and keep-alive comments while it waits, then the
// model_waking_timeout error as an SSE event, and no [DONE].
func wakeTimeoutStreamed(ctx context.Context, base, token, model string) error {
	resp, err := postChat(ctx, base, token, model, true)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return fmt.Errorf("HTTP %d %s: %s; want 200 and an event stream (keep-alives while waiting)", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	body := string(b)
	if !strings.Contains(body, ": waiting for model") {
		return fmt.Errorf("no keep-alive comment while waiting: %q", body)
	}
	if strings.Contains(body, "[DONE]") {
		return fmt.Errorf("the stream of a request that never reached an engine ended with [DONE]: %q", body)
	}
	var event string
	for line := range strings.Lines(body) {
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data:"); ok {
			event = strings.TrimSpace(d)
		}
	}
	return wakingTimeoutError([]byte(event))
}

// wakingTimeoutError checks an OpenAI error body: code
// model_waking_timeout, naming the pull failure.
func wakingTimeoutError(b []byte) error {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("decoding the error %q: %w", b, err)
	}
	if e.Error.Code != "model_waking_timeout" || !strings.Contains(e.Error.Message, "ImagePull") {
		return fmt.Errorf("error %+v; want code model_waking_timeout and a message naming the image pull failure", e.Error)
	}
	return nil
}

func postChat(ctx context.Context, base, token, model string, stream bool) (*http.Response, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": "wake up"}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// listsModel checks that the gateway answers GET /models with model.
func listsModel(ctx context.Context, base, token, model string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/models", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), model) {
		return fmt.Errorf("GET /models: HTTP %d: %s", resp.StatusCode, b)
	}
	return nil
}
