package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/ssetest"
)

// The applications of TestOllama's ModelOrchestra: the real Ollama engine
// (the image `make images` builds) on the generated model, fetched from
// the mirror. One always-on root with a warm-up prompt and one request at
// a time, one that sleeps through its sidecar, one that scales to zero.
const (
	ollamaChat    = "ollama"
	ollamaSleepy  = "ollama-sleepy"
	ollamaZero    = "ollama-zero"
	ollamaWarmup  = "Say hello."
	ollamaContext = 256 // the generated tiny model's context
)

// ollamaServed is the name each application serves: Ollama lists it as
// "<name>:latest" and answers to both.
func ollamaServed(app string) string { return app + "-tiny" }

// TestOllama runs the real Ollama engine on real pods behind the gateway,
// JetStream and the dispatcher, with the model the operator's fetch Job
// downloaded from the mirror into the cache: what a user of
// runtime.engine: ollama sees, from the first answer to scale to zero,
// sleep through the sidecar and an engine crash in the middle of a stream.
func TestOllama(t *testing.T) {
	requireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-ollama")
	const name = "engines"
	logf := stepLogf(t)
	token := apiToken(ctx, t, ns)
	if _, err := stack.Apply(ctx, env.dyn, ollamaResource(t, ns, name)); err != nil {
		t.Fatal(err)
	}
	mo := waitReady(ctx, t, ns, name)
	logf("Ready")
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	root := appRoot(ctx, t, ns, name, ollamaChat)
	served := ollamaServed(ollamaChat)

	// Before any request: only the warm-up can have loaded the model.
	t.Run("the warm-up prompt ran before the root was Ready", func(t *testing.T) {
		loaded, err := ollamaLoaded(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		if len(loaded) != 1 || loaded[0] != served+":latest" {
			t.Errorf("GET /api/ps of %s before any request lists %q; want the warmed-up %s:latest", root.Name, loaded, served)
		}
	})

	t.Run("the model came from the mirror through the cache, imported without a copy", func(t *testing.T) {
		var total int64
		for _, data := range stack.TinyModelFiles() {
			total += int64(len(data))
		}
		if m := mo.Status.Applications[ollamaChat].Model; m.Phase != "Complete" || m.BytesTotal != total {
			t.Errorf("status model of %s = phase %q, %d/%d bytes; want Complete with the mirror's %d bytes", ollamaChat, m.Phase, m.Bytes, m.BytesTotal, total)
		}
		tags, err := ollamaGet(ctx, root, "/api/tags")
		if err != nil {
			t.Fatal(err)
		}
		size := int64(len(stack.TinyModelFiles()[stack.DemoFile]))
		var list struct {
			Models []struct {
				Name string `json:"name"`
				Size int64  `json:"size"`
			} `json:"models"`
		}
		if err := json.Unmarshal(tags, &list); err != nil || len(list.Models) != 1 || list.Models[0].Name != served+":latest" || list.Models[0].Size < size {
			t.Errorf("GET /api/tags of %s = %s (%v); want only %s:latest of at least the GGUF's %d bytes", root.Name, tags, err, served, size)
		}
	})

	t.Run("streamed chat: content chunks, a usage chunk and [DONE]", func(t *testing.T) {
		res, err := rawStream(ctx, base, token, "/chat/completions", map[string]any{
			"model": served, "stream": true, "max_tokens": 16, "stream_options": map[string]any{"include_usage": true},
			"messages": []map[string]string{{"role": "user", "content": chatPrompt}},
		})
		if err != nil {
			t.Fatal(err)
		}
		content, finish, usage := res.Content, res.FinishReason, res.Usage
		for _, m := range res.Models {
			if m != served {
				t.Errorf("event model %q; want %q", m, served)
			}
		}
		if content == "" || finish == "" {
			t.Errorf("streamed answer %q, finish_reason %q; want content and a finish reason", content, finish)
		}
		if usage == nil || usage.PromptTokens == 0 || usage.CompletionTokens == 0 || usage.CompletionTokens > 16 {
			t.Errorf("usage chunk %+v; want prompt and 1..16 completion tokens", usage)
		}
	})

	t.Run("non-streamed chat", func(t *testing.T) {
		var out struct {
			Model   string `json:"model"`
			Choices []struct {
				Message      struct{ Content string } `json:"message"`
				FinishReason string                   `json:"finish_reason"`
			} `json:"choices"`
			Usage ssetest.Usage `json:"usage"`
		}
		status, body := postJSON(ctx, t, base, token, "/chat/completions", map[string]any{
			"model": served, "max_tokens": 12, "messages": []map[string]string{{"role": "user", "content": chatPrompt}},
		}, &out)
		if status != http.StatusOK || len(out.Choices) != 1 || out.Choices[0].FinishReason == "" || out.Usage.CompletionTokens == 0 || out.Model != served {
			t.Errorf("HTTP %d: %s; want a finished choice with usage for model %s", status, body, served)
		}
	})

	t.Run("legacy completions", func(t *testing.T) {
		var out struct {
			Object  string `json:"object"`
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage ssetest.Usage `json:"usage"`
		}
		status, body := postJSON(ctx, t, base, token, "/completions", map[string]any{
			"model": served, "max_tokens": 12, "prompt": "Once upon a time",
		}, &out)
		if status != http.StatusOK || out.Object != "text_completion" || len(out.Choices) != 1 || out.Choices[0].FinishReason == "" || out.Usage.CompletionTokens == 0 {
			t.Errorf("HTTP %d: %s; want a finished text_completion with usage", status, body)
		}
	})

	t.Run("chat takes the direct lane once the gateway holds a lease", func(t *testing.T) {
		// The requests above asked for a lease (a request that finds none
		// takes the queue and asks once it is done); within the idle time
		// the gateway keeps it, and the next ones go straight to the
		// engine. Two gateway replicas each hold their own.
		var lanes []string
		eventually(t, 30*time.Second, func() error {
			res, err := rawStream(ctx, base, token, "/chat/completions", map[string]any{
				"model": served, "stream": true, "max_tokens": 8, "stream_options": map[string]any{"include_usage": true},
				"messages": []map[string]string{{"role": "user", "content": chatPrompt}},
			})
			if err != nil {
				return fmt.Errorf("streamed chat: %w", err)
			}
			lane := res.Header.Get(gateway.HeaderLane)
			lanes = append(lanes, lane)
			if !res.Done || res.Content == "" || res.Usage == nil || res.Usage.CompletionTokens == 0 {
				return fmt.Errorf("lane %s: answer %q, done %v, usage %+v; want content, usage and [DONE]", lane, res.Content, res.Done, res.Usage)
			}
			if lane != "direct" {
				return fmt.Errorf("lane %q; want direct", lane)
			}
			return nil
		})
		t.Logf("lanes of the streamed chats until the first direct one: %v", lanes)
	})

	t.Run("an unknown model is 404 model_not_found", func(t *testing.T) {
		_, err := stack.StreamChat(ctx, base, token, "no-such-model", "hi", 4, nil)
		var apiErr *stack.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Code != "model_not_found" {
			t.Errorf("chat with an unknown model: %v; want 404 model_not_found", err)
		}
	})

	t.Run("a client that aborts mid-stream frees the engine", func(t *testing.T) {
		// The root takes one request at a time (maxConcurrency 1): an
		// engine still generating for the gone client would hold the next
		// request for up to 100,000 tokens.
		actx, abort := context.WithCancel(ctx)
		firstDelta := make(chan struct{})
		go func() {
			once := false
			_, _ = stack.StreamChat(actx, base, token, served, "Tell a very long story.", 100000, func(string) {
				if !once {
					once = true
					close(firstDelta)
				}
			})
		}()
		select {
		case <-firstDelta:
		case <-time.After(time.Minute):
			abort()
			t.Fatal("no content from the long stream within a minute")
		}
		abort()
		sent := time.Now()
		if err := unaryChat(ctx, base, token, served, "Are you free?"); err != nil {
			t.Fatalf("the request after the abort: %v", err)
		}
		if d := time.Since(sent); d > 20*time.Second {
			t.Errorf("the request after the abort was answered after %s; the engine kept generating for the gone client", d.Round(time.Millisecond))
		}
	})

	t.Run("sleep and wake through the sidecar with the real process", func(t *testing.T) {
		sleepyRoot := appRoot(ctx, t, ns, name, ollamaSleepy)
		model := ollamaServed(ollamaSleepy)
		if _, err := stack.StreamChatOnceReachable(ctx, base, token, model, "hello", 8, nil, 30*time.Second); err != nil {
			t.Fatalf("first chat: %v", err)
		}
		// The gateway keeps its lease across an idle gap longer than the
		// old 2 s lease idle time (shorter than sleepAfter): the request
		// after the gap still takes the direct lane, and the engine still
		// sleeps at sleepAfter below, the lease held meanwhile.
		lane := func() (string, error) {
			res, err := rawStream(ctx, base, token, "/chat/completions", map[string]any{
				"model": model, "stream": true, "max_tokens": 4,
				"messages": []map[string]string{{"role": "user", "content": chatPrompt}},
			})
			if err != nil {
				return "", err
			}
			if !res.Done || res.Content == "" {
				return "", fmt.Errorf("answer %q, done %v; want content and [DONE]", res.Content, res.Done)
			}
			return res.Header.Get(gateway.HeaderLane), nil
		}
		eventually(t, 30*time.Second, func() error {
			l, err := lane()
			if err != nil {
				return err
			}
			if l != "direct" {
				return fmt.Errorf("lane %q; want direct", l)
			}
			return nil
		})
		time.Sleep(3 * time.Second)
		if l, err := lane(); err != nil || l != "direct" {
			t.Errorf("the chat after a 3 s gap took lane %q (%v); want direct: the gateway kept its lease", l, err)
		}
		eventually(t, 90*time.Second, func() error {
			st, err := appStatus(ctx, ns, name, ollamaSleepy)
			if err != nil {
				return err
			}
			if lc := st.Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleAsleep {
				return fmt.Errorf("lifecycle %s; want Asleep", lifecycleJSON(st.Lifecycle))
			}
			sc, err := sidecarState(ctx, ns, sleepyRoot.Name)
			if err != nil {
				return err
			}
			if sc.State != sidecarapi.Asleep {
				return fmt.Errorf("sidecar %s; want Asleep", sc.State)
			}
			if loaded, err := ollamaLoaded(ctx, sleepyRoot); err != nil || len(loaded) != 0 {
				return fmt.Errorf("asleep, Ollama still has %q loaded (%v)", loaded, err) //nolint:errorlint // err may be nil: what the poll saw
			}
			return inEndpointSlice(ctx, ns, name+"-"+ollamaSleepy, sleepyRoot.Name)
		})
		st, _ := appStatus(ctx, ns, name, ollamaSleepy)
		wakes := st.Lifecycle.Wakes
		sent := time.Now()
		res, err := stack.StreamChat(ctx, base, token, model, "wake up", 8, nil)
		if err != nil || !res.Done {
			t.Fatalf("the chat sent to the sleeping engine: %v", err)
		}
		t.Logf("the chat that woke Ollama was answered in %s", time.Since(sent).Round(time.Millisecond))
		eventually(t, 30*time.Second, func() error {
			st, err := appStatus(ctx, ns, name, ollamaSleepy)
			if err != nil {
				return err
			}
			if lc := st.Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleAwake || lc.Wakes != wakes+1 {
				return fmt.Errorf("lifecycle %s; want Awake after wake %d", lifecycleJSON(st.Lifecycle), wakes+1)
			}
			if loaded, err := ollamaLoaded(ctx, sleepyRoot); err != nil || len(loaded) != 1 {
				return fmt.Errorf("awake, Ollama has %q loaded (%v); want the model", loaded, err) //nolint:errorlint // err may be nil: what the poll saw
			}
			return nil
		})
	})

	t.Run("scale to zero and wake on the first requests, none lost", func(t *testing.T) {
		model := ollamaServed(ollamaZero)
		sel := "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + ollamaZero + ",app.kubernetes.io/component=root"
		eventually(t, 3*time.Minute, func() error {
			pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return err
			}
			if len(pods.Items) > 0 {
				return fmt.Errorf("%d root pods of %s; want none", len(pods.Items), ollamaZero)
			}
			st, err := appStatus(ctx, ns, name, ollamaZero)
			if err != nil {
				return err
			}
			if st.Phase != v1alpha1.PhaseIdle {
				return fmt.Errorf("phase %s; want Idle", st.Phase)
			}
			return nil
		})
		before := failedDeliveriesOf(ctx, t, ns, ollamaZero)
		sent := time.Now()
		if errs := burst(ctx, base, token, model, "zero", 8); len(errs) > 0 {
			t.Fatalf("%d of 8 requests sent at zero were not answered completely:\n%s", len(errs), strings.Join(errs, "\n"))
		}
		t.Logf("8 requests sent at zero pods answered within %s", time.Since(sent).Round(time.Millisecond))
		if grew := grown(before, failedDeliveriesOf(ctx, t, ns, ollamaZero)); len(grew) > 0 {
			t.Errorf("requests sent at zero were not all delivered once:\n%s", strings.Join(grew, "\n"))
		}
	})

	// Last: it restarts the engine.
	t.Run("an Ollama crash mid-stream cuts that stream only", func(t *testing.T) {
		for attempt := 1; ; attempt++ {
			restarts, others, cut := crashMidStream(ctx, t, ns, base, token, root, served)
			waitContainerRestarted(ctx, t, ns, root.Name, "engine", restarts)
			if cut == nil {
				if attempt < 3 {
					t.Logf("attempt %d: the stream ended before the kill landed; again", attempt)
					continue
				}
				t.Fatal("three streams ended before the engine's kill landed")
			}
			var apiErr *stack.APIError
			if !errors.As(cut, &apiErr) || apiErr.Code != "stream_interrupted" {
				t.Errorf("the stream in flight at the crash ended with %v; want the documented stream_interrupted error event, no [DONE]", cut)
			}
			if len(others) > 0 {
				t.Errorf("requests queued behind it were lost:\n%s", strings.Join(others, "\n"))
			}
			break
		}
		if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, "back?", 8, nil, 2*time.Minute); err != nil {
			t.Errorf("after the restart: %v", err)
		}
	})
}

// mirroredOrchestra is a ModelOrchestra of apps behind one gateway on a
// NodePort without request limits, its models fetched from the test
// mirror.
func mirroredOrchestra(t *testing.T, ns, name string, apps map[string]any) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       v1alpha1.Kind,
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"gateway": map[string]any{
				"replicas": int64(1),
				"service":  map[string]any{"type": "NodePort"},
				"limits":   map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)},
			},
			"applications": apps,
		},
	}}
	must(t, stack.MirrorModel(obj, env.hub))
	return obj
}

// ollamaResource is TestOllama's ModelOrchestra: three Ollama applications
// on the mirrored generated model, each small enough to share the node.
func ollamaResource(t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	image, err := stack.ImageRef(filepath.Join(env.root, "_output", "images", "ollama.tar"))
	if err != nil {
		t.Fatal(err)
	}
	app := func(maxConcurrency int64, lifecycle map[string]any, warmup bool) map[string]any {
		a := map[string]any{
			"runtime": map[string]any{
				"engine": "ollama",
				"image":  image,
				"resources": map[string]any{
					"requests": map[string]any{"cpu": "100m", "memory": "256Mi"},
					"limits":   map[string]any{"memory": "1Gi"},
				},
			},
			"serving": map[string]any{"maxConcurrency": maxConcurrency, "contextLength": int64(ollamaContext)},
		}
		if warmup {
			a["serving"].(map[string]any)["warmupPrompts"] = []any{ollamaWarmup}
		}
		if lifecycle != nil {
			a["lifecycle"] = lifecycle
		}
		return a
	}
	apps := map[string]any{
		ollamaChat:   app(1, nil, true),
		ollamaSleepy: app(4, map[string]any{"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "8s", "maxWait": "2m"}, false),
		ollamaZero:   app(4, map[string]any{"minReplicas": int64(0), "maxReplicas": int64(1), "zeroAfter": "5s", "maxWait": "3m"}, false),
	}
	for a, spec := range apps {
		spec.(map[string]any)["serving"].(map[string]any)["servedModelName"] = ollamaServed(a)
	}
	obj := mirroredOrchestra(t, ns, name, apps)
	return obj
}

// appRoot is the running root pod of an application.
func appRoot(ctx context.Context, t *testing.T, ns, name, application string) *corev1.Pod {
	t.Helper()
	var root *corev1.Pod
	eventually(t, 2*time.Minute, func() error {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + application + ",app.kubernetes.io/component=root"})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
				root = p
				return nil
			}
		}
		return fmt.Errorf("no running root pod of %s", application)
	})
	return root
}

func appStatus(ctx context.Context, ns, name, application string) (v1alpha1.ApplicationStatus, error) {
	mo, err := stack.Get(ctx, env.dyn, ns, name)
	if err != nil {
		return v1alpha1.ApplicationStatus{}, err
	}
	return mo.Status.Applications[application], nil
}

// ollamaGet reads path from the Ollama engine of a root pod, by its pod IP.
func ollamaGet(ctx context.Context, p *corev1.Pod, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, b)
	}
	return b, err
}

// ollamaLoaded lists the models Ollama holds in memory (GET /api/ps).
func ollamaLoaded(ctx context.Context, p *corev1.Pod) ([]string, error) {
	b, err := ollamaGet(ctx, p, "/api/ps")
	if err != nil {
		return nil, err
	}
	var ps struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, fmt.Errorf("decoding /api/ps %s: %w", b, err)
	}
	names := []string{}
	for _, m := range ps.Models {
		names = append(names, m.Name)
	}
	return names, nil
}

// rawStream posts a streamed request through the gateway to base+path and
// reads its answer (ssetest.Post).
func rawStream(ctx context.Context, base, token, path string, body map[string]any) (*ssetest.Result, error) {
	_, res, err := ssetest.Post(ctx, base+path, token, nil, body, nil)
	return res, err
}

// postJSON posts body through the gateway and decodes a 200 answer into out.
func postJSON(ctx context.Context, t *testing.T, base, token, path string, body map[string]any, out any) (int, string) {
	t.Helper()
	status, raw, err := tryPostJSON(ctx, base, token, path, body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	if status == http.StatusOK {
		if err := json.Unmarshal([]byte(raw), out); err != nil {
			t.Errorf("decoding %s: %v", raw, err)
		}
	}
	return status, raw
}

// tryPostJSON is postJSON's exchange, with a failed connection as an error
// (a poll across a gateway rollout meets one: the old pod closes its
// connections).
func tryPostJSON(ctx context.Context, base, token, path string, body map[string]any) (int, string, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), err
}

// crashMidStream starts a long stream on the root (one request at a time)
// and four short requests queued behind it, SIGKILLs the engine container
// at the stream's first content, and returns the container's restarts
// before the kill, how the stream ended (nil when it completed before the
// kill landed) and the queued requests that were not answered whole.
func crashMidStream(ctx context.Context, t *testing.T, ns, base, token string, root *corev1.Pod, served string) (restarts int32, others []string, cut error) {
	t.Helper()
	firstDelta := make(chan struct{})
	streamDone := make(chan error, 1)
	go func() {
		once := false
		_, err := stack.StreamChat(ctx, base, token, served, "Tell a very long story.", 100000, func(string) {
			if !once {
				once = true
				close(firstDelta)
			}
		})
		streamDone <- err
	}()
	select {
	case <-firstDelta:
	case err := <-streamDone:
		t.Fatalf("the long stream ended before any content: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no content from the long stream within a minute")
	}
	othersDone := make(chan []string, 1)
	go func() { othersDone <- burst(ctx, base, token, served, "queued", 4) }()
	time.Sleep(200 * time.Millisecond) // the four reach the queue behind the stream
	restarts, err := stack.KillContainer(ctx, env.cs, ns, root.Name, "engine")
	if err != nil {
		t.Fatal(err)
	}
	cut = <-streamDone
	return restarts, <-othersDone, cut
}

func waitContainerRestarted(ctx context.Context, t *testing.T, ns, pod, container string, before int32) {
	t.Helper()
	eventually(t, 3*time.Minute, func() error {
		p, err := env.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == container && s.RestartCount > before && s.Ready {
				return nil
			}
		}
		return fmt.Errorf("container %s of %s not restarted and ready yet", container, pod)
	})
}
