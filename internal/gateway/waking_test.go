package gateway

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/queue"
)

// fakeWake is a WakeStates whose answer the test sets.
type fakeWake struct {
	waking  atomic.Bool
	problem atomic.Value // string
}

func (f *fakeWake) Waking(string) (bool, string) {
	p, _ := f.problem.Load().(string)
	return f.waking.Load(), p
}

// newWakeHarness serves a gateway whose model "llama-3-8b" has a lifecycle
// with maxWait, over engine; wake tells whether it is waking.
func newWakeHarness(t *testing.T, maxWait time.Duration, engine engineFunc) (*harness, *fakeWake) {
	t.Helper()
	cfg := testConfig()
	cfg.Models[0].MaxWait.Duration = maxWait
	cfg.Timeouts.WakeKeepAlive.Duration = 50 * time.Millisecond
	tokens := NewStaticTokens(NewTokenHasher(nil), map[string]*Principal{aliceToken: {Name: "alice"}})
	logs := &syncBuffer{}
	q := &fakeQueue{engine: engine}
	wake := &fakeWake{}
	g, err := New(cfg, q, Options{Tokens: tokens, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Wake: wake})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return &harness{g: g, srv: srv, q: q, logs: logs}, wake
}

// heldEngine answers once release is closed, as an engine does once its
// application woke and the dispatcher took the request.
func heldEngine(release <-chan struct{}) engineFunc {
	answer := newEngine(engineOptions{})
	return func(ctx context.Context, job queue.Job, send func(queue.Chunk) bool) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return answer(ctx, job, send)
	}
}

func TestStreamGetsHeadersAndKeepAlivesWhileTheModelWakes(t *testing.T) {
	release := make(chan struct{})
	h, wake := newWakeHarness(t, time.Minute, heldEngine(release))
	wake.waking.Store(true)

	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	// A client that gives up when no response headers arrive in time.
	client := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 2 * time.Second}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("no response headers while the model wakes: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, Content-Type %q; want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	comments := 0
	for comments < 2 { // the first at once, the next a keep-alive period later
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading keep-alives: %v", err)
		}
		if strings.HasPrefix(line, ": waiting for model llama-3-8b to wake") {
			comments++
		}
	}
	wake.waking.Store(false)
	close(release)
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"content":"Hello"`) || !strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") {
		t.Errorf("after the wake the stream is %q, want the answer ending with [DONE]", rest)
	}
}

func TestPastMaxWaitTheRequestFailsWithWakingTimeout(t *testing.T) {
	h, wake := newWakeHarness(t, 300*time.Millisecond, heldEngine(make(chan struct{})))
	wake.waking.Store(true)
	wake.problem.Store(`pod demo-chat-0 container engine: ImagePullBackOff`)
	res, body := h.do(t, http.MethodPost, "/v1/chat/completions", aliceToken, chatBody)
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "10" {
		t.Fatalf("status %d, Retry-After %q; want 503 with Retry-After 10", res.StatusCode, res.Header.Get("Retry-After"))
	}
	for _, want := range []string{`"code":"model_waking_timeout"`, "was not ready within 300ms", "ImagePullBackOff"} {
		if !strings.Contains(body, want) {
			t.Errorf("body %s lacks %s", body, want)
		}
	}
	// The request leaves the queue: its reply was closed (which cancels it).
	if r := h.q.lastReply(t); !r.closed.Load() {
		t.Error("the timed-out request's reply was not closed, so it stays queued")
	}
}

func TestStreamPastMaxWaitEndsWithAnErrorEvent(t *testing.T) {
	h, wake := newWakeHarness(t, 300*time.Millisecond, heldEngine(make(chan struct{})))
	wake.waking.Store(true)
	res, body := h.do(t, http.MethodPost, "/v1/chat/completions", aliceToken, streamBody)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 (the stream started with keep-alives)", res.StatusCode)
	}
	if !strings.Contains(body, `data: {"error":`) || !strings.Contains(body, "model_waking_timeout") || strings.Contains(body, "[DONE]") {
		t.Errorf("stream %q: want a model_waking_timeout error event and no [DONE]", body)
	}
}

func TestAnAwakeModelIsNotBoundByMaxWait(t *testing.T) {
	release := make(chan struct{})
	h, _ := newWakeHarness(t, 100*time.Millisecond, heldEngine(release))
	// Awake (not waking): a slow answer is no wake, maxWait does not apply.
	time.AfterFunc(500*time.Millisecond, func() { close(release) })
	res, body := h.do(t, http.MethodPost, "/v1/chat/completions", aliceToken, chatBody)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", res.StatusCode, body)
	}
}

// statusWake is a fakeWake that also knows the lifecycle status.
type statusWake struct {
	fakeWake
	status atomic.Value // v1alpha1.LifecycleStatus
}

func (s *statusWake) Lookup(string) (v1alpha1.LifecycleStatus, bool) {
	st, ok := s.status.Load().(v1alpha1.LifecycleStatus)
	return st, ok
}

// TestWakeProgressComments checks that a stream waiting for a wake is told
// what happens, at once when it changes, and when the model is ready.
func TestWakeProgressComments(t *testing.T) {
	release := make(chan struct{})
	h, _ := newWakeHarness(t, time.Minute, heldEngine(release))
	wake := &statusWake{}
	wake.waking.Store(true)
	wake.status.Store(v1alpha1.LifecycleStatus{State: v1alpha1.LifecycleZero, ExpectedResumeSeconds: "4.5"})
	h.g.wake = wake
	h.g.cfg.Timeouts.WakeKeepAlive.Duration = time.Hour // only changes are said

	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	r := bufio.NewReader(resp.Body)
	readComment := func() string {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("reading comments: %v", err)
			}
			if strings.HasPrefix(line, ": ") {
				return strings.TrimSpace(line)
			}
		}
	}
	if c := readComment(); !strings.HasPrefix(c, ": waiting for model llama-3-8b to wake: queued; the application is scaled to zero, its pods are being started (") ||
		!strings.Contains(c, "expected 4.5 s") {
		t.Errorf("first comment %q", c)
	}
	wake.status.Store(v1alpha1.LifecycleStatus{State: v1alpha1.LifecycleWaking, LastWake: &v1alpha1.WakeStatus{FromTier: v1alpha1.Tier("Warm")}})
	if c := readComment(); !strings.Contains(c, "the pods are starting and the model is loading from the Warm tier") {
		t.Errorf("comment after the change %q", c)
	}
	wake.waking.Store(false)
	close(release)
	if c := readComment(); !strings.HasPrefix(c, ": model llama-3-8b is ready after ") {
		t.Errorf("comment when ready %q", c)
	}
	rest, _ := io.ReadAll(r)
	if !strings.HasPrefix(strings.TrimLeft(string(rest), "\n"), "data: ") || !strings.Contains(string(rest), "data: [DONE]") {
		t.Errorf("the answer after the ready comment: %q", rest)
	}
}

// fakePods is a PodProgress whose sentence the test sets.
type fakePods struct{ said atomic.Value }

func (f *fakePods) PodProgress(string) string { s, _ := f.said.Load().(string); return s }

// TestWakeProgressSaysWhatThePodsDo: the comments carry what the
// dispatchers see of the pods, and each change is said at once.
func TestWakeProgressSaysWhatThePodsDo(t *testing.T) {
	release := make(chan struct{})
	h, _ := newWakeHarness(t, time.Minute, heldEngine(release))
	wake := &statusWake{}
	wake.waking.Store(true)
	wake.status.Store(v1alpha1.LifecycleStatus{State: v1alpha1.LifecycleWaking})
	h.g.wake = wake
	pods := &fakePods{}
	pods.said.Store("pod r-0 is waiting to be scheduled")
	h.g.pods = pods
	h.g.cfg.Timeouts.WakeKeepAlive.Duration = time.Hour // only changes are said

	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	r := bufio.NewReader(resp.Body)
	readComment := func() string {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("reading comments: %v", err)
			}
			if strings.HasPrefix(line, ": ") {
				return strings.TrimSpace(line)
			}
		}
	}
	for _, said := range []string{
		"pod r-0 is waiting to be scheduled",
		"pod r-0 is scheduled on node a; starting container engine (ContainerCreating)",
		"pod r-0 is scheduled on node a; the engine is running and loading the model",
		"pod r-0 is ready",
	} {
		pods.said.Store(said)
		want := ": waiting for model llama-3-8b to wake: the pods are starting and the model is loading; " + said + " ("
		if c := readComment(); !strings.HasPrefix(c, want) {
			t.Errorf("comment %q, want it to start with %q", c, want)
		}
	}
	wake.waking.Store(false)
	close(release)
	if c := readComment(); !strings.HasPrefix(c, ": model llama-3-8b is ready after ") {
		t.Errorf("comment when ready %q", c)
	}
}

// TestNonStreamedWakeWaitIsInAHeaderAndMetrics checks the
// X-Orchestra-Wake-Wait header and the wake metrics of a non-streamed
// request that waited for a wake.
func TestNonStreamedWakeWaitIsInAHeaderAndMetrics(t *testing.T) {
	release := make(chan struct{})
	h, wake := newWakeHarness(t, time.Minute, heldEngine(release))
	wake.waking.Store(true)
	time.AfterFunc(300*time.Millisecond, func() { wake.waking.Store(false); close(release) })
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	v, err := strconv.ParseFloat(resp.Header.Get("X-Orchestra-Wake-Wait"), 64)
	if err != nil || v < 0.2 || v > 30 {
		t.Errorf("X-Orchestra-Wake-Wait = %q, want the ~0.3 s waited", resp.Header.Get("X-Orchestra-Wake-Wait"))
	}
	if n := testutil.CollectAndCount(h.g.metrics.wakeWait); n != 1 {
		t.Errorf("wake_wait_seconds has %d series, want 1", n)
	}
	if got := testutil.ToFloat64(h.g.metrics.wakeWaiting.WithLabelValues("llama-3-8b")); got != 0 {
		t.Errorf("wake_waiting_requests = %v after the answer, want 0", got)
	}
	// An awake model's answer has no header.
	resp, _ = h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	if resp.Header.Get("X-Orchestra-Wake-Wait") != "" {
		t.Errorf("an awake model's answer has X-Orchestra-Wake-Wait %q", resp.Header.Get("X-Orchestra-Wake-Wait"))
	}
}
