package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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
		if errs := burst(ctx, base, token, served, "zero", 256); len(errs) > 0 {
			t.Fatalf("%d of 256 requests sent at zero were not answered completely:\n%s", len(errs), strings.Join(errs, "\n"))
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
	})
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
