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
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/ssetest"
)

// The chaos load: chaosTotal requests, chaosConcurrency at a time, every
// other one streamed, each answer chaosTokens tokens long (the simulator
// runs at 15 ms a token, so about 0.6 s an answer).
const (
	chaosTotal       = 64
	chaosConcurrency = 16
	chaosTokens      = 40
)

// TestChaos kills one part of a running stack at a time, on real pods,
// while a bounded load runs through it, and checks what the clients saw
// (docs/reliability.md): nothing lost, nothing duplicated, no 5xx, cuts
// only where documented, and the requests in flight at the fault answered
// within 5 s of it. Each kill is a SIGKILL of the container's processes
// on the node (a crash: the kubelet restarts the container in place). The
// operator is killed twice while it installs a release and twice while it
// upgrades one; the releases must converge to Ready, none left pending.
func TestChaos(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-chaos")
	const name = "chaos"

	token := apiToken(ctx, t, ns)
	obj := simulatorResource(t, ns, name)
	must(t, unstructured.SetNestedField(obj.Object, int64(2), "spec", "gateway", "replicas"))
	must(t, unstructured.SetNestedField(obj.Object, int64(2), "spec", "dispatcher", "replicas"))
	must(t, unstructured.SetNestedField(obj.Object, int64(2), "spec", "applications", app, "scaling", "replicas"))
	must(t, unstructured.SetNestedStringSlice(obj.Object, []string{"--ttft=20ms", "--itl=15ms"}, "spec", "applications", app, "runtime", "args"))
	// The load comes from one token: no per-token limits.
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))
	served, _, _ := unstructured.NestedString(obj.Object, "spec", "applications", app, "serving", "servedModelName")

	var table []string
	defer func() {
		t.Logf("chaos on real pods, %d requests per case, %d at a time, half streamed, %d tokens each:\n%s",
			chaosTotal, chaosConcurrency, chaosTokens, strings.Join(table, "\n"))
	}()

	ok := t.Run("the operator killed during an install", func(t *testing.T) {
		killOperatorWhilePending(ctx, t, ns, name, installing, func() {
			if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
				t.Fatal(err)
			}
		})
		waitReady(ctx, t, ns, name)
		requireDeployed(t, ns, name)
		table = append(table, "| the operator killed during the install | converged to Ready, release deployed |")
	})
	if !ok {
		t.FailNow()
	}
	waitStackPodsReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
	load := chaosLoad{token: token, model: served, targets: []string{base}}

	t.Run("no fault", func(t *testing.T) {
		rep := load.run(ctx, t, "none", nil)
		table = append(table, rep.row("none"))
		rep.check(t, 0)
	})

	t.Run("one of two dispatchers killed", func(t *testing.T) {
		pod := stackPod(ctx, t, ns, name, "dispatcher", 0)
		rep := load.run(ctx, t, "dispatcher", func() time.Time {
			return killContainer(ctx, t, ns, pod, "dispatcher")
		})
		table = append(table, rep.row("one of two dispatchers killed"))
		// Streams that had started on the dead dispatcher are cut: at most
		// those in flight.
		rep.check(t, chaosConcurrency/2)
		if d := rep.recovery(); d > 5*time.Second {
			t.Errorf("the requests in flight were answered %v after the dispatcher died, want at most 5s", d)
		}
		waitStackPodsReady(ctx, t, ns, name)
	})

	t.Run("NATS killed", func(t *testing.T) {
		pod := stackPod(ctx, t, ns, name, "nats", 0)
		svc, err := env.cs.CoreV1().Services(ns).Get(ctx, name+"-nats", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// NATS is back when its Service, which the gateways and
		// dispatchers connect to, reaches it again.
		var back, podBack <-chan time.Time
		rep := load.run(ctx, t, "nats", func() time.Time {
			at := killContainer(ctx, t, ns, pod, "nats")
			podBack = reachable(ctx, net.JoinHostPort(pod.Status.PodIP, "4222"))
			back = reachable(ctx, net.JoinHostPort(svc.Spec.ClusterIP, "4222"))
			return at
		})
		backAt, podBackAt := <-back, <-podBack
		rep.note = fmt.Sprintf("NATS back behind its Service %v after the kill (listening after %v)",
			backAt.Sub(rep.faultAt).Round(10*time.Millisecond), podBackAt.Sub(rep.faultAt).Round(10*time.Millisecond))
		table = append(table, rep.row("NATS killed"))
		rep.check(t, 0) // not a stream cut by a NATS restart
		t.Logf("%s; the requests in flight were answered %v after that", rep.note, rep.lastEnded.Sub(backAt).Round(10*time.Millisecond))
		if d := rep.recovery(); d > 5*time.Second {
			t.Errorf("the requests in flight were answered %v after NATS was killed, want at most 5s", d)
		}
		if t.Failed() {
			t.Logf("gateway and dispatcher logs:\n%s", podLogs(ctx, ns, "app.kubernetes.io/instance="+name+",app.kubernetes.io/component in (gateway,dispatcher)", 40))
		}
		waitStackPodsReady(ctx, t, ns, name)
	})

	t.Run("an engine killed mid-stream", func(t *testing.T) {
		pod := stackPod(ctx, t, ns, name, "root", 0)
		rep := load.run(ctx, t, "engine", func() time.Time {
			return killContainer(ctx, t, ns, pod, pod.Spec.Containers[0].Name)
		})
		table = append(table, rep.row("one of two engines killed"))
		// A stream the dead engine had started is cut; everything else is
		// retried on the other engine.
		rep.check(t, chaosConcurrency/2)
		if d := rep.recovery(); d > 5*time.Second {
			t.Errorf("the requests in flight were answered %v after the engine died, want at most 5s", d)
		}
		waitStackPodsReady(ctx, t, ns, name)
	})

	t.Run("one of two gateways killed", func(t *testing.T) {
		// Each client talks to one gateway pod (as behind a load balancer
		// that keeps connections), so that the other gateway's clients can
		// be told apart.
		victim, other := stackPod(ctx, t, ns, name, "gateway", 0), stackPod(ctx, t, ns, name, "gateway", 1)
		l := load
		l.targets = []string{podURL(t, victim), podURL(t, other)}
		rep := l.run(ctx, t, "gateway", func() time.Time {
			return killContainer(ctx, t, ns, victim, "gateway")
		})
		table = append(table, rep.row("one of two gateways killed"))
		if rep.lost != 0 || rep.duplicated != 0 || rep.incomplete != 0 {
			t.Errorf("lost %d, duplicated %d, incomplete %d; want 0 each", rep.lost, rep.duplicated, rep.incomplete)
		}
		if n := rep.cutAt[l.targets[1]] + rep.serverErrorsAt[l.targets[1]]; n != 0 {
			t.Errorf("%d requests to the surviving gateway failed, want 0", n)
		}
		// The killed gateway restarts in place; until it is ready (queue
		// connected, tokens loaded) it answers 503 service_unavailable with
		// Retry-After. Its Service sends nobody to it then; these clients
		// reach it by its pod address.
		if n := rep.serverErrors - rep.cutBy["HTTP 503 service_unavailable"]; n != 0 {
			t.Errorf("%d 5xx other than the restarting gateway's 503 service_unavailable (%v), want 0", n, rep.cutBy)
		}
		if rep.cutAt[l.targets[0]] == 0 {
			t.Error("no request to the killed gateway failed: the test proves nothing")
		}
		if d := rep.recovery(); d > 5*time.Second {
			t.Errorf("the killed gateway's clients waited %v for their error, want at most 5s", d)
		}
		waitStackPodsReady(ctx, t, ns, name)
	})

	for i := range 2 {
		t.Run(fmt.Sprintf("the operator killed during an upgrade, %d of 2", i+1), func(t *testing.T) {
			before := latestRelease(t, ns, name)
			killOperatorWhilePending(ctx, t, ns, name, []string{"pending-upgrade"}, func() {
				// A new limit is a new release revision (and rolls the
				// gateway pods).
				patch(ctx, t, ns, name, fmt.Sprintf(`{"spec":{"gateway":{"limits":{"maxConcurrent":%d}}}}`, 1000+i))
			})
			waitReady(ctx, t, ns, name)
			after := requireDeployed(t, ns, name)
			if after <= before {
				t.Errorf("release revision %d after the upgrade, %d before; want a newer one", after, before)
			}
			table = append(table, fmt.Sprintf("| the operator killed during an upgrade (%d of 2) | converged to Ready, revision %d → %d deployed |", i+1, before, after))
		})
	}

	t.Run("a stack with three NATS servers: the operator killed during its install, one server killed under load", func(t *testing.T) {
		const small = "chaos-b"
		o := simulatorResource(t, ns, small)
		must(t, unstructured.SetNestedField(o.Object, int64(1), "spec", "gateway", "replicas"))
		must(t, unstructured.SetNestedField(o.Object, int64(1), "spec", "applications", app, "scaling", "replicas"))
		must(t, unstructured.SetNestedStringSlice(o.Object, []string{"--ttft=20ms", "--itl=15ms"}, "spec", "applications", app, "runtime", "args"))
		must(t, unstructured.SetNestedMap(o.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))
		must(t, unstructured.SetNestedMap(o.Object, map[string]any{"replicas": int64(3), "storage": map[string]any{"size": "2Gi"}}, "spec", "nats"))
		killOperatorWhilePending(ctx, t, ns, small, installing, func() {
			if _, err := stack.Apply(ctx, env.dyn, o); err != nil {
				t.Fatal(err)
			}
		})
		waitReady(ctx, t, ns, small)
		requireDeployed(t, ns, small)
		table = append(table, "| the operator killed during the install of a second stack (3 NATS servers) | converged to Ready, release deployed |")
		waitStackPodsReady(ctx, t, ns, small)

		base, err := stack.GatewayURL(ctx, env.cs, ns, small)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 8, nil, 30*time.Second); err != nil {
			t.Fatalf("first chat through %s: %v", base, err)
		}
		// The server the dispatcher is connected to: its loss breaks the
		// path of every answer.
		victim := natsServerOf(ctx, t, ns, small, "orchestra-dispatcher")
		l := chaosLoad{token: token, model: served, targets: []string{base}}
		rep := l.run(ctx, t, "nats-cluster", func() time.Time {
			return killContainer(ctx, t, ns, victim, "nats")
		})
		table = append(table, rep.row(fmt.Sprintf("one of three NATS servers killed (%s, the dispatcher's)", victim.Name)))
		rep.check(t, 0)
		if d := rep.recovery(); d > 5*time.Second {
			t.Errorf("the requests in flight were answered %v after the NATS server died, want at most 5s", d)
		}
		if t.Failed() {
			t.Logf("gateway and dispatcher logs:\n%s", podLogs(ctx, ns, "app.kubernetes.io/instance="+small+",app.kubernetes.io/component in (gateway,dispatcher)", 40))
		}

		manifest, err := stack.ReleaseManifest(env.kubeconfig, ns, small)
		if err != nil {
			t.Fatal(err)
		}
		rendered := manifestObjects(t, manifest)
		if err := stack.Delete(ctx, env.dyn, ns, small, 3*time.Minute, t.Logf); err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Minute, func() error {
			if left := leftovers(ctx, ns, small, rendered); len(left) > 0 {
				return fmt.Errorf("objects left after deleting %s/%s: %v", ns, small, left)
			}
			return nil
		})
		table = append(table, "| the second stack deleted | nothing it created left |")
	})
}

// natsServerOf returns the NATS pod of the stack that holds a client
// connection named client (it asks each server's monitoring endpoint).
func natsServerOf(ctx context.Context, t *testing.T, ns, name, client string) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	eventually(t, 30*time.Second, func() error {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=nats"})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(p.Status.PodIP, "8222")+"/connz", nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("asking NATS server %s for its connections: %w", p.Name, err)
			}
			var connz struct {
				Connections []struct {
					Name string `json:"name"`
				} `json:"connections"`
			}
			err = json.NewDecoder(resp.Body).Decode(&connz)
			_ = resp.Body.Close()
			if err != nil {
				return fmt.Errorf("decoding the connections of NATS server %s: %w", p.Name, err)
			}
			for _, c := range connz.Connections {
				if c.Name == client {
					found = p
					return nil
				}
			}
		}
		return fmt.Errorf("no NATS server of %s/%s has a connection named %s", ns, name, client)
	})
	return found
}

// chaosLoad is the bounded load of one chaos case.
type chaosLoad struct {
	token, model string
	// targets are gateway base URLs; request i goes to targets[i%len].
	targets []string
}

// chaosReport is what the clients of one case saw.
type chaosReport struct {
	accepted, completed, cut, lost, duplicated, incomplete, serverErrors int
	// cutUnstarted counts cut requests that had received nothing of their
	// answer: a non-streamed request, or a stream before its first event.
	cutUnstarted int
	// cutBy counts the errors clients saw on cut requests, by kind.
	cutBy map[string]int
	// cutAt and serverErrorsAt count failures by target.
	cutAt, serverErrorsAt map[string]int
	faultAt, lastEnded    time.Time
	elapsed               time.Duration
	note                  string
}

// recovery is the time from the fault to the end of the last request that
// was in flight at the fault.
func (r *chaosReport) recovery() time.Duration {
	if r.faultAt.IsZero() || r.lastEnded.Before(r.faultAt) {
		return 0
	}
	return r.lastEnded.Sub(r.faultAt)
}

func (r *chaosReport) String() string {
	return fmt.Sprintf("accepted %d, completed %d, cut %d %v, lost %d, duplicated %d, incomplete %d, 5xx %d, recovery %v, %v for all",
		r.accepted, r.completed, r.cut, r.cutBy, r.lost, r.duplicated, r.incomplete, r.serverErrors,
		r.recovery().Round(10*time.Millisecond), r.elapsed.Round(10*time.Millisecond))
}

// row is the report as a row of the table in docs/reliability.md.
func (r *chaosReport) row(fault string) string {
	var kinds []string
	for k, n := range r.cutBy {
		kinds = append(kinds, fmt.Sprintf("%d `%s`", n, k))
	}
	sort.Strings(kinds)
	cut := strconv.Itoa(r.cut)
	if len(kinds) > 0 {
		cut += " (" + strings.Join(kinds, ", ") + ")"
	}
	rec := r.recovery().Round(10 * time.Millisecond).String()
	if r.note != "" {
		rec += "; " + r.note
	}
	return fmt.Sprintf("| %s | %d | %d | %s | %d | %d | %d | %s |", fault, r.accepted, r.completed, cut, r.lost, r.duplicated, r.serverErrors, rec)
}

// check asserts the figures the cases behind one gateway share: nothing
// lost, duplicated or incomplete, no 5xx, every request either completed
// or cut, at most maxCut cut, and only streams that had started: a request
// that had received nothing completes elsewhere without the client
// noticing.
func (r *chaosReport) check(t *testing.T, maxCut int) {
	t.Helper()
	if r.lost != 0 || r.duplicated != 0 || r.incomplete != 0 || r.serverErrors != 0 {
		t.Errorf("lost %d, duplicated %d, incomplete %d, 5xx %d; want 0 each", r.lost, r.duplicated, r.incomplete, r.serverErrors)
	}
	if r.cutUnstarted != 0 {
		t.Errorf("%d requests were cut before any of their answer arrived; want them completed elsewhere", r.cutUnstarted)
	}
	if r.cut > maxCut {
		t.Errorf("%d requests cut (%v), want at most %d", r.cut, r.cutBy, maxCut)
	}
	if r.completed+r.cut != chaosTotal {
		t.Errorf("completed %d + cut %d != %d requests", r.completed, r.cut, chaosTotal)
	}
}

// run sends the load and, once the first wave is in flight and half of its
// streams have sent part of their answers, calls fault (which returns when
// the fault happened). A nil fault runs the load alone.
func (l chaosLoad) run(ctx context.Context, t *testing.T, label string, fault func() time.Time) *chaosReport {
	t.Helper()
	rep := &chaosReport{cutBy: map[string]int{}, cutAt: map[string]int{}, serverErrorsAt: map[string]int{}}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	sem := make(chan struct{}, chaosConcurrency)
	streaming := make(chan struct{}, chaosTotal)
	start := time.Now()
	for i := range chaosTotal {
		if i == chaosConcurrency && fault != nil {
			for range chaosConcurrency / 4 {
				select {
				case <-streaming:
				case <-time.After(30 * time.Second):
					t.Fatal("the first wave's streams sent nothing within 30s")
				}
			}
			at := fault()
			mu.Lock()
			rep.faultAt = at
			mu.Unlock()
		}
		sem <- struct{}{}
		target := l.targets[i%len(l.targets)]
		stream := i%2 == 1
		wg.Go(func() {
			defer func() { <-sem }()
			began := time.Now()
			o := l.one(ctx, target, fmt.Sprintf("chaos %s %d", label, i), stream, func() { streaming <- struct{}{} })
			ended := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if !rep.faultAt.IsZero() && began.Before(rep.faultAt) && ended.After(rep.lastEnded) {
				rep.lastEnded = ended
			}
			rep.add(target, o)
		})
	}
	wg.Wait()
	rep.elapsed = time.Since(start)
	t.Logf("%s: %v", label, rep)
	return rep
}

// chaosOutcome is what one client saw.
type chaosOutcome struct {
	status int    // 0: no HTTP answer
	err    string // the error the client saw, if any
	hung   bool   // no outcome within the bound
	tokens int    // tokens of the answer received
	// started is true when part of the answer reached the client (for a
	// stream, an event: the role may come before the first token).
	started bool
	done    bool // a whole answer: finish_reason, and [DONE] for a stream
}

func (r *chaosReport) add(target string, o chaosOutcome) {
	switch {
	case o.hung:
		r.lost++
	case o.status >= 500:
		r.serverErrors++
		r.serverErrorsAt[target]++
		r.cutBy[fmt.Sprintf("HTTP %d %s", o.status, o.err)]++
	case o.status == 0 || o.err != "":
		if o.status != 0 {
			r.accepted++
		}
		r.cut++
		r.cutAt[target]++
		r.cutBy[o.err]++
		if !o.started {
			r.cutUnstarted++
		}
	case o.done && o.tokens == chaosTokens:
		r.accepted++
		r.completed++
	case o.tokens > chaosTokens:
		r.accepted++
		r.duplicated++
	default:
		r.accepted++
		r.incomplete++
	}
}

// one sends one chat and classifies what came back; onStreaming is called
// when a stream has received its first token.
func (l chaosLoad) one(ctx context.Context, base, prompt string, stream bool, onStreaming func()) chaosOutcome {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]any{
		"model": l.model, "stream": stream, "max_tokens": chaosTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return chaosOutcome{err: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+l.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return chaosOutcome{err: errorKind(err), hung: ctx.Err() != nil}
	}
	defer func() { _ = resp.Body.Close() }()
	o := chaosOutcome{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct {
				Code any `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		o.err = fmt.Sprint(e.Error.Code)
		return o
	}
	if !stream {
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			o.err, o.hung = errorKind(err), ctx.Err() != nil
			return o
		}
		var c struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &c); err != nil || len(c.Choices) != 1 {
			o.err = "malformed answer"
			return o
		}
		o.tokens, o.done, o.started = c.Usage.CompletionTokens, c.Choices[0].FinishReason != "", true
		return o
	}
	res, err := ssetest.Read(resp.Body, func(string) {
		if o.tokens++; o.tokens == 1 {
			onStreaming()
		}
	})
	o.started = res != nil && res.Events > 0
	var apiErr *stack.APIError
	switch {
	case errors.As(err, &apiErr):
		o.err = apiErr.Code // an error event: stream_interrupted
	case err != nil:
		o.err, o.hung = errorKind(err), ctx.Err() != nil
	default:
		o.done = true
	}
	return o
}

// errorKind names a connection error without its addresses.
func errorKind(err error) string {
	s := err.Error()
	for _, k := range []string{"connection refused", "connection reset", "unexpected EOF", "EOF", "no route to host", "timeout", "without [DONE]"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	return s
}

// stackPod returns the i-th (by name) running pod of a component of the
// stack.
func stackPod(ctx context.Context, t *testing.T, ns, name, component string, i int) *corev1.Pod {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=" + component,
	})
	if err != nil {
		t.Fatal(err)
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	sort.Slice(running, func(a, b int) bool { return running[a].Name < running[b].Name })
	if len(running) <= i {
		t.Fatalf("%d running %s pods of %s/%s, want at least %d", len(running), component, ns, name, i+1)
	}
	return &running[i]
}

// podURL is the OpenAI base URL of one gateway pod, reached by its pod IP.
func podURL(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "http" {
				return fmt.Sprintf("http://%s/v1", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port.ContainerPort))))
			}
		}
	}
	t.Fatalf("gateway pod %s has no http port", p.Name)
	return ""
}

// killContainer SIGKILLs a container's processes and returns when.
func killContainer(ctx context.Context, t *testing.T, ns string, p *corev1.Pod, container string) time.Time {
	t.Helper()
	if _, err := stack.KillContainer(ctx, env.cs, ns, p.Name, container); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// reachable returns a channel that receives the time addr first accepts a
// TCP connection (polled every 20 ms).
func reachable(ctx context.Context, addr string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		// The kill takes a moment to close the listener.
		for dialable(addr) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		for ctx.Err() == nil {
			if dialable(addr) {
				ch <- time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		ch <- time.Time{}
	}()
	return ch
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// waitStackPodsReady waits until every pod of the stack (but the fetch
// Job's) is running and ready, so that each case starts from a whole
// stack.
func waitStackPodsReady(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	eventually(t, 3*time.Minute, func() error {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Labels["app.kubernetes.io/component"] == "model-fetch" || p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			if !podReady(&p) || p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s is not ready (%s)", p.Name, p.Status.Phase)
			}
		}
		return nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// installing are the statuses of a release record written by an install
// before its objects exist.
var installing = []string{"pending-install", "deployed"}

// killOperatorWhilePending runs act and SIGKILLs the operator as soon as
// the release of ns/name is stored with one of the statuses want: the
// operator dies in the middle of the Helm action. An install of a chart
// without hooks stores its record once, as deployed, before it creates
// any object (pending-install with hooks); an upgrade stores
// pending-upgrade first.
func killOperatorWhilePending(ctx context.Context, t *testing.T, ns, name string, want []string, act func()) {
	t.Helper()
	w, err := env.cs.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	act()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch of the release Secrets ended")
			}
			s, isSecret := ev.Object.(*corev1.Secret)
			if ev.Type == watch.Deleted || !isSecret || !slices.Contains(want, s.Labels["status"]) {
				continue
			}
			op := operatorPod(ctx, t)
			if _, err := stack.KillContainer(ctx, env.cs, operatorNamespace, op.Name, op.Spec.Containers[0].Name); err != nil {
				t.Fatal(err)
			}
			// The pod goes too, so that its replacement starts at once:
			// the kubelet would restart the same container after a
			// growing back-off (10 s, 20 s, ...) the second time.
			zero := int64(0)
			if err := env.cs.CoreV1().Pods(operatorNamespace).Delete(ctx, op.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			t.Logf("operator %s killed while release %s revision %s was %s", op.Name, name, s.Labels["version"], s.Labels["status"])
			return
		case <-timeout:
			t.Fatalf("release %s/%s never reached %s", ns, name, strings.Join(want, " or "))
		}
	}
}

func operatorPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return p
		}
	}
	t.Fatalf("no running operator pod in %s", operatorNamespace)
	return nil
}

// latestRelease returns the newest revision of the release ns/name.
func latestRelease(t *testing.T, ns, name string) int {
	t.Helper()
	rev, _ := releaseState(t, ns, name)
	return rev
}

// requireDeployed checks that no revision of the release ns/name is left
// pending and the newest is deployed, and returns it.
func requireDeployed(t *testing.T, ns, name string) int {
	t.Helper()
	rev, statuses := releaseState(t, ns, name)
	for r, st := range statuses {
		if strings.HasPrefix(st, "pending-") {
			t.Errorf("release %s/%s revision %d is left %s", ns, name, r, st)
		}
	}
	if statuses[rev] != "deployed" {
		t.Errorf("release %s/%s revision %d is %s, want deployed (all: %v)", ns, name, rev, statuses[rev], statuses)
	}
	return rev
}

func releaseState(t *testing.T, ns, name string) (int, map[int]string) {
	t.Helper()
	secrets, err := env.cs.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "owner=helm,name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[int]string{}
	latest := 0
	for _, s := range secrets.Items {
		v, err := strconv.Atoi(s.Labels["version"])
		if err != nil {
			continue
		}
		statuses[v] = s.Labels["status"]
		latest = max(latest, v)
	}
	if latest == 0 {
		t.Fatalf("release %s/%s has no revision", ns, name)
	}
	return latest, statuses
}

// podLogs returns the last lines of the logs of the pods selected.
func podLogs(ctx context.Context, ns, selector string, tail int64) string {
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		logs, err := env.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p.Name, err)
			continue
		}
		fmt.Fprintf(&b, "--- %s:\n%s\n", p.Name, logs)
	}
	return b.String()
}
