package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/npmsdk"
	"github.com/model-orchestra/operator/internal/sim"
	"github.com/model-orchestra/operator/internal/ssetest"
)

// The restart load: restartStreams streamed chats at a time, without a
// pause, each answer restartTokens tokens long (the simulator runs at 15 ms
// a token: about 0.6 s an answer).
const (
	restartStreams = 12
	restartTokens  = 40
)

// TestRollingRestart restarts the gateways, the dispatchers and the three
// NATS servers of a stack on real pods, one part after the other, as
// `kubectl rollout restart` does, while streamed chats run through the
// gateway's Service without a pause, and checks what the clients (the
// official OpenAI Go SDK, with its default retries) saw: no stream cut,
// none lost, no 5xx, and every answer the simulator's, word for word
// (docs/reliability.md, "Rolling restarts"). The npm openai SDK's
// Responses API runs against the same stack first, and a response it
// stored is still there after the three rollouts.
func TestRollingRestart(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-restart")
	const name = "roll"

	token := apiToken(ctx, t, ns)
	otherToken, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-other-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := simulatorResource(t, ns, name)
	must(t, unstructured.SetNestedField(obj.Object, int64(2), "spec", "gateway", "replicas"))
	must(t, unstructured.SetNestedField(obj.Object, int64(2), "spec", "dispatcher", "replicas"))
	must(t, unstructured.SetNestedField(obj.Object, int64(1), "spec", "applications", app, "scaling", "replicas"))
	must(t, unstructured.SetNestedStringSlice(obj.Object, []string{"--ttft=20ms", "--itl=15ms"}, "spec", "applications", app, "runtime", "args"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"replicas": int64(3), "storage": map[string]any{"size": "2Gi"}}, "spec", "nats"))
	start := time.Now()
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	waitStackPodsReady(ctx, t, ns, name)
	t.Logf("stack ready and answering in %s", time.Since(start).Round(time.Second))

	var table []string
	defer func() {
		t.Logf("rolling restarts on real pods, %d streamed chats at a time through the gateway Service, %d tokens each:\n"+
			"| Rolled | Requests | Completed | Cut | Lost | 5xx | Retries | Wrong | Rollout (old pods gone) |\n"+
			"| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n%s",
			restartStreams, restartTokens, strings.Join(table, "\n"))
	}()

	ref := newSimReference(served)
	var stored storedResponse
	t.Run("the npm openai SDK's Responses API through the gateway Service", func(t *testing.T) {
		stored = npmResponses(t, ref, base, token, otherToken, served)
	})
	t.Run("the npm openai SDK's Files and Batch APIs through the gateway Service", func(t *testing.T) {
		dir := npmsdk.Dir(t, filepath.Join(env.root, "internal", "gateway", "testdata", "npm-sdk"))
		npmsdk.Batches(t, dir, base, token, otherToken, served, 12)
	})

	cases := []struct {
		label, kind, object, component string
	}{
		{"the gateway Deployment (2 pods)", "Deployment", name + "-gateway", "gateway"},
		{"the dispatcher Deployment (2 pods)", "Deployment", name + "-dispatcher", "dispatcher"},
		{"the NATS StatefulSet (3 servers, one at a time)", "StatefulSet", name + "-nats", "nats"},
	}
	for _, c := range cases {
		ok := t.Run(c.component, func(t *testing.T) {
			load := startRestartLoad(ctx, base, token, served, ref, c.component)
			// Streams in flight on every part before the restart starts.
			time.Sleep(2 * time.Second)
			began := time.Now()
			rolled, gone := rolloutRestart(ctx, t, ns, name, c.kind, c.object, c.component)
			// And some after it, on the new pods only.
			time.Sleep(2 * time.Second)
			rep := load.stop()
			row := fmt.Sprintf("| %s | %s | %s (%s) |", c.label, rep.cells(), rolled.Round(100*time.Millisecond), gone.Round(100*time.Millisecond))
			table = append(table, row)
			t.Logf("%s: %s; rollout %v, old pods gone after %v (from %s)", c.component, rep, rolled.Round(100*time.Millisecond), gone.Round(100*time.Millisecond), began.Format(time.TimeOnly))
			rep.check(t)
			if t.Failed() {
				t.Logf("gateway and dispatcher logs:\n%s", podLogs(ctx, ns, "app.kubernetes.io/instance="+name+",app.kubernetes.io/component in (gateway,dispatcher)", 30))
			}
		})
		if !ok {
			t.FailNow()
		}
		waitStackPodsReady(ctx, t, ns, name)
	}

	t.Run("a response stored before the rollouts is still there", func(t *testing.T) {
		if stored.id == "" {
			t.Skip("the npm SDK case stored nothing")
		}
		requireStoredResponse(ctx, t, base, token, otherToken, stored)
	})
}

// rolloutRestart does what `kubectl rollout restart` does to a Deployment
// or StatefulSet (it stamps the pod template with the annotation
// kubectl.kubernetes.io/restartedAt), waits as `kubectl rollout status`
// does, and then until no pod of the old template is left (terminating
// pods are not counted by the rollout status). It returns both durations.
func rolloutRestart(ctx context.Context, t *testing.T, ns, name, kind, object, component string) (rolled, gone time.Duration) {
	t.Helper()
	p := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	start := time.Now()
	var err error
	switch kind {
	case "Deployment":
		_, err = env.cs.AppsV1().Deployments(ns).Patch(ctx, object, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{})
	case "StatefulSet":
		_, err = env.cs.AppsV1().StatefulSets(ns).Patch(ctx, object, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{})
	}
	if err != nil {
		t.Fatalf("restarting %s %s/%s: %v", kind, ns, object, err)
	}
	eventually(t, 5*time.Minute, func() error {
		switch kind {
		case "Deployment":
			d, err := env.cs.AppsV1().Deployments(ns).Get(ctx, object, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return deploymentRolledOut(d)
		default:
			s, err := env.cs.AppsV1().StatefulSets(ns).Get(ctx, object, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return statefulSetRolledOut(s)
		}
	})
	rolled = time.Since(start)
	eventually(t, 3*time.Minute, func() error {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=" + component})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.CreationTimestamp.Time.Before(start.Truncate(time.Second)) {
				return fmt.Errorf("pod %s of the old template is still there (%s)", p.Name, p.Status.Phase)
			}
		}
		return nil
	})
	return rolled, time.Since(start)
}

// deploymentRolledOut is `kubectl rollout status` for a Deployment.
func deploymentRolledOut(d *appsv1.Deployment) error {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	switch {
	case d.Status.ObservedGeneration < d.Generation:
		return fmt.Errorf("deployment %s: generation %d not observed yet", d.Name, d.Generation)
	case d.Status.UpdatedReplicas < want:
		return fmt.Errorf("deployment %s: %d of %d updated replicas", d.Name, d.Status.UpdatedReplicas, want)
	case d.Status.Replicas > d.Status.UpdatedReplicas:
		return fmt.Errorf("deployment %s: %d old replicas pending termination", d.Name, d.Status.Replicas-d.Status.UpdatedReplicas)
	case d.Status.AvailableReplicas < d.Status.UpdatedReplicas:
		return fmt.Errorf("deployment %s: %d of %d updated replicas available", d.Name, d.Status.AvailableReplicas, d.Status.UpdatedReplicas)
	}
	return nil
}

// statefulSetRolledOut is `kubectl rollout status` for a StatefulSet with
// the RollingUpdate strategy.
func statefulSetRolledOut(s *appsv1.StatefulSet) error {
	want := int32(1)
	if s.Spec.Replicas != nil {
		want = *s.Spec.Replicas
	}
	switch {
	case s.Status.ObservedGeneration < s.Generation:
		return fmt.Errorf("statefulset %s: generation %d not observed yet", s.Name, s.Generation)
	case s.Status.ReadyReplicas < want:
		return fmt.Errorf("statefulset %s: %d of %d pods ready", s.Name, s.Status.ReadyReplicas, want)
	case s.Status.UpdatedReplicas < want || s.Status.UpdateRevision != s.Status.CurrentRevision:
		return fmt.Errorf("statefulset %s: %d of %d pods updated", s.Name, s.Status.UpdatedReplicas, want)
	}
	return nil
}

// simReference answers chats as the simulator pods do, at once: the
// answer a client must get, word for word.
type simReference struct {
	h     http.Handler
	model string
}

func newSimReference(model string) simReference {
	cfg := sim.Default()
	cfg.Model = model
	cfg.TimeToFirstToken, cfg.InterTokenLatency = 0, 0
	return simReference{h: sim.New(cfg).Handler(), model: model}
}

// chat returns the text of the simulator's answer to a streamed chat of
// messages (role, content pairs) with maxTokens (0: none).
func (r simReference) chat(maxTokens int, messages ...string) (string, error) {
	var msgs []map[string]string
	for i := 0; i+1 < len(messages); i += 2 {
		msgs = append(msgs, map[string]string{"role": messages[i], "content": messages[i+1]})
	}
	body := map[string]any{"model": r.model, "stream": true, "messages": msgs}
	if maxTokens > 0 {
		body["max_tokens"] = maxTokens
	}
	data, err := json.Marshal(body)
	if err != nil {
		return "", err
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	r.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return "", fmt.Errorf("the reference simulator answered %d: %s", rec.Code, rec.Body)
	}
	res, err := ssetest.Read(rec.Body, nil)
	if err != nil {
		return "", err
	}
	return res.Content, nil
}

// restartLoad runs streamed chats without a pause until stopped.
type restartLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	rep    restartReport
	// serverErrors and retries are counted by the SDK's middleware.
	serverErrors, retries atomic.Int64
}

// restartReport is what the clients of one rollout saw.
type restartReport struct {
	requests, completed, cut, lost, failed, wrong int
	// serverErrors counts 5xx answers to any attempt, retried or not;
	// retries the attempts the SDK made again (after a 5xx, 408, 409,
	// 429 or a connection error before an answer).
	serverErrors, retries int
	// errs counts the errors by kind.
	errs map[string]int
}

func (r restartReport) String() string {
	return fmt.Sprintf("requests %d, completed %d, cut %d, lost %d, failed before an answer %d, 5xx %d, retries %d, wrong %d, errors %v",
		r.requests, r.completed, r.cut, r.lost, r.failed, r.serverErrors, r.retries, r.wrong, r.errs)
}

// cells are the report's cells of the table in docs/reliability.md.
func (r restartReport) cells() string {
	return fmt.Sprintf("%d | %d | %d | %d | %d | %d | %d", r.requests, r.completed, r.cut+r.failed, r.lost, r.serverErrors, r.retries, r.wrong)
}

func (r restartReport) check(t *testing.T) {
	t.Helper()
	if r.cut != 0 || r.lost != 0 || r.failed != 0 || r.serverErrors != 0 || r.wrong != 0 {
		t.Errorf("cut %d, lost %d, failed %d, 5xx %d, wrong %d; want 0 each (errors: %v)", r.cut, r.lost, r.failed, r.serverErrors, r.wrong, r.errs)
	}
	if r.completed != r.requests {
		t.Errorf("%d of %d requests completed", r.completed, r.requests)
	}
	if r.requests < 4*restartStreams {
		t.Errorf("only %d requests ran during the rollout: the test proves little", r.requests)
	}
}

// startRestartLoad starts restartStreams clients, each sending streamed
// chats one after the other through base, with the official OpenAI Go SDK
// and its default retries (two, on connection errors and on 408, 409, 429
// and 5xx answers), and comparing each answer with the simulator's.
func startRestartLoad(ctx context.Context, base, token, model string, ref simReference, label string) *restartLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &restartLoad{cancel: cancel, rep: restartReport{errs: map[string]int{}}}
	client := openai.NewClient(
		option.WithBaseURL(base), option.WithAPIKey(token), option.WithMaxRetries(2),
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			if n, _ := strconv.Atoi(req.Header.Get("X-Stainless-Retry-Count")); n > 0 {
				l.retries.Add(1)
			}
			resp, err := next(req)
			if err == nil && resp.StatusCode >= 500 {
				l.serverErrors.Add(1)
			}
			return resp, err
		}))
	for w := range restartStreams {
		l.wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				prompt := fmt.Sprintf("rolling restart of the %s, client %d, chat %d", label, w, i)
				want, err := ref.chat(restartTokens, "user", prompt)
				o := restartOne(context.WithoutCancel(ctx), client, model, prompt)
				l.mu.Lock()
				l.rep.add(o, want, err)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// stop lets every client finish its chat in flight and returns the report.
func (l *restartLoad) stop() restartReport {
	l.cancel()
	l.wg.Wait()
	l.rep.serverErrors, l.rep.retries = int(l.serverErrors.Load()), int(l.retries.Load())
	return l.rep
}

// restartOutcome is what one chat's client saw.
type restartOutcome struct {
	text     string
	finish   string
	started  bool // an event of the answer arrived
	err      error
	timedOut bool
}

// restartOne sends one streamed chat (bounded to 60 s: past that it is
// lost).
func restartOne(ctx context.Context, client openai.Client, model, prompt string) restartOutcome {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens: openai.Int(restartTokens),
	})
	defer func() { _ = stream.Close() }()
	var o restartOutcome
	var b strings.Builder
	for stream.Next() {
		o.started = true
		for _, c := range stream.Current().Choices {
			b.WriteString(c.Delta.Content)
			if c.FinishReason != "" {
				o.finish = c.FinishReason
			}
		}
	}
	o.text, o.err, o.timedOut = b.String(), stream.Err(), ctx.Err() != nil
	return o
}

func (r *restartReport) add(o restartOutcome, want string, refErr error) {
	r.requests++
	var apiErr *openai.Error
	switch {
	case o.timedOut:
		r.lost++
		r.errs["no answer within 60s"]++
	case o.err != nil && !o.started && !errors.As(o.err, &apiErr):
		r.failed++ // no answer at all, after the SDK's retries
		r.errs[errorKind(o.err)]++
	case o.err != nil && !o.started:
		r.failed++
		r.errs[fmt.Sprintf("HTTP %d %s", apiErr.StatusCode, apiErr.Code)]++
	case o.err != nil:
		r.cut++
		r.errs[errorKind(o.err)]++
	case refErr != nil || o.text != want || o.finish != "length":
		r.wrong++
		r.errs[fmt.Sprintf("answer differs (finish %q, %d of %d bytes)", o.finish, len(o.text), len(want))]++
	default:
		r.completed++
	}
}
