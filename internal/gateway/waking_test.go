package gateway

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
