package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
)

// TestScaleToZeroAndWake runs a simulator application with a short
// zeroAfter on real pods: it reaches zero engine pods, then concurrent
// requests (half streamed) sent while it is at zero are all answered 2xx,
// also when the dispatcher (the lifecycle leader) is killed mid-wake.
func TestScaleToZeroAndWake(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-zero")
	const name = "zero"

	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := simulatorResource(t, ns, name)
	// The bursts come from one token: no per-token limits.
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))

	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(0), "maxReplicas": int64(2), "zeroAfter": "10s", "maxWait": "5m",
	}, "spec", "applications", app, "lifecycle"))
	served, _, _ := unstructured.NestedString(obj.Object, "spec", "applications", app, "serving", "servedModelName")
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}

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

	t.Run("the dispatcher killed in the middle of a wake", func(t *testing.T) {
		waitZeroPods(ctx, t, ns, name)
		done := make(chan []string, 1)
		go func() { done <- burst(ctx, base, token, served, "kill", 64) }()
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
			t.Fatalf("%d of 64 requests sent at zero, with the dispatcher killed mid-wake, were not answered completely:\n%s", len(errs), strings.Join(errs, "\n"))
		}
		// The consumer is paused while the application wakes, so the
		// killed dispatcher held none of them: the new one delivers each
		// once.
		if grew := grown(nil, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
			t.Errorf("requests sent at zero were not all delivered once; the new dispatcher counted:\n%s", strings.Join(grew, "\n"))
		}
	})
}

// failedDeliveries reads the dispatchers' failed attempts and redeliveries
// of the application from their /metrics (through the API server's pod
// proxy): series, prefixed by the pod, to value.
func failedDeliveries(ctx context.Context, t *testing.T, ns string) map[string]float64 {
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
			if !strings.Contains(line, `app="`+app+`"`) {
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

	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}
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
	served, _, _ := unstructured.NestedString(obj.Object, "spec", "applications", app, "serving", "servedModelName")
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
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
	var spec, ready int32
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		spec, ready, err = sts(ctx)
		return err == nil && ready >= maxReplicas, nil
	})
	close(stopLoad)
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d requests under the backlog were not answered completely:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	if err != nil {
		t.Fatalf("%d concurrent clients did not scale the application to %d ready roots: %d written, %d ready (%v)", clients, maxReplicas, spec, ready, err)
	}
	t.Logf("%d ready roots after %d answers", ready, answered.Load())

	// The backlog has drained: back to one root, after the stabilization
	// window (min(zeroAfter, 1m) = 10s), its pods gone.
	sel := "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + app + ",app.kubernetes.io/component=root"
	var pods int
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if spec, ready, err = sts(ctx); err != nil {
			return false, nil //nolint:nilerr // polled until the timeout
		}
		list, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, nil //nolint:nilerr // polled until the timeout
		}
		pods = len(list.Items)
		return spec == 1 && ready == 1 && pods == 1, nil
	})
	if err != nil {
		t.Fatalf("the drained application did not scale back to one root: %d written, %d ready, %d root pods (%v)", spec, ready, pods, err)
	}
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
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel + ",app.kubernetes.io/component in (root,worker)"})
		if err != nil || len(pods.Items) > 0 {
			return false, nil //nolint:nilerr // polled until the timeout
		}
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return false, nil //nolint:nilerr // polled until the timeout
		}
		st := mo.Status.Applications[app]
		if st.Lifecycle != nil {
			wakes = st.Lifecycle.Wakes
		}
		return st.Phase == v1alpha1.PhaseIdle && stack.Ready(mo), nil
	})
	if err != nil {
		t.Fatalf("the idle application did not reach zero engine pods, phase Idle and Ready: %v", err)
	}
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
