package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/queue"
)

// TestAnonymousModeAcceptsAnyToken: in anonymous mode a request with any
// token, or none, is served (the official SDKs always send one); a known
// token keeps its own principal.
func TestAnonymousModeAcceptsAnyToken(t *testing.T) {
	cfg := testConfig()
	cfg.Auth.Anonymous = true
	cfg.Limits.Default = Limits{RequestsPerMinute: 1}
	tokens := NewStaticTokens(NewTokenHasher(nil), map[string]*Principal{aliceToken: {Name: "alice"}})
	h := newHarnessWithTokens(t, cfg, newEngine(engineOptions{}), tokens)
	if resp, body := h.do(t, "POST", "/v1/chat/completions", "sk-whatever-the-sdk-sends", chatBody); resp.StatusCode != 200 {
		t.Errorf("anonymous request with an unknown token: %d %s", resp.StatusCode, body)
	}
	// Anonymous callers share one budget, whatever token they send...
	if resp, body := h.do(t, "POST", "/v1/chat/completions", "", chatBody); resp.StatusCode != 429 {
		t.Errorf("second anonymous request: %d %s, want 429 from the shared budget", resp.StatusCode, body)
	}
	// ...and a known token is its own principal, with its own limits.
	if resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody); resp.StatusCode != 200 {
		t.Errorf("known token in anonymous mode: %d %s", resp.StatusCode, body)
	}
	if resp, body := h.do(t, "GET", "/v1/models", "sk-unknown", ""); resp.StatusCode != 200 {
		t.Errorf("GET /v1/models with an unknown token: %d %s", resp.StatusCode, body)
	}
}

// loadingTokens is a token source that has not loaded its Secrets yet.
type loadingTokens struct{ synced bool }

func (l *loadingTokens) Authenticate(string) (*Principal, bool) { return nil, false }
func (l *loadingTokens) HasSynced() bool                        { return l.synced }

// TestTokensNotLoadedYetIs503: before the token Secrets are loaded a token
// cannot be judged, so it gets 503 with Retry-After (SDKs retry it), not
// 401 (which SDKs treat as final).
func TestTokensNotLoadedYetIs503(t *testing.T) {
	tokens := &loadingTokens{}
	h := newHarnessWithTokens(t, testConfig(), newEngine(engineOptions{}), tokens)
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	wantError(t, resp, body, 503,
		`{"error":{"message":"The gateway is starting and has not loaded its API keys yet; retry the request.","type":"server_error","param":null,"code":"service_unavailable"}}`)
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After = %q, want 1", ra)
	}
	// No token at all is still a final 401, and once loaded an unknown
	// token is too.
	if resp, _ := h.do(t, "POST", "/v1/chat/completions", "", chatBody); resp.StatusCode != 401 {
		t.Errorf("no token while loading: %d, want 401", resp.StatusCode)
	}
	tokens.synced = true
	if resp, _ := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody); resp.StatusCode != 401 {
		t.Errorf("unknown token once loaded: %d, want 401", resp.StatusCode)
	}
}

// TestBodyReadTimeoutHidesAddresses: a client too slow to send its body
// gets a 408 that does not name the sockets (in a pod, the pod's IP).
func TestBodyReadTimeoutHidesAddresses(t *testing.T) {
	g, err := New(testConfig(), &fakeQueue{engine: newEngine(engineOptions{})}, Options{
		Tokens: NewStaticTokens(NewTokenHasher(nil), map[string]*Principal{aliceToken: {Name: "alice"}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":", aliceToken)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	wantError(t, &answer{StatusCode: resp.StatusCode, Header: resp.Header}, string(body), http.StatusRequestTimeout,
		`{"error":{"message":"Timed out reading the request body; send it faster or in a smaller request.","type":"invalid_request_error","param":null,"code":"request_timeout"}}`)
	if strings.Contains(string(body), "127.0.0.1") {
		t.Errorf("the error names a socket address: %s", body)
	}
}

// sizedQueue is a fake queue that carries bodies up to max bytes.
type sizedQueue struct {
	fakeQueue
	max int64
}

func (q *sizedQueue) MaxBodyBytes() int64 { return q.max }

func (q *sizedQueue) Submit(ctx context.Context, job queue.Job) (queue.Reply, error) {
	if int64(len(job.Body)) > q.max {
		return nil, fmt.Errorf("%w: %d bytes", queue.ErrTooLarge, len(job.Body))
	}
	return q.fakeQueue.Submit(ctx, job)
}

// TestBodyLimitMustFitTheQueue: a gateway whose body limit the queue
// cannot carry does not start, and a body the queue refuses as too large
// is a 413, never a 503 that tells the client to retry forever.
func TestBodyLimitMustFitTheQueue(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.MaxBodyBytes = 4096
	small := &sizedQueue{fakeQueue: fakeQueue{engine: newEngine(engineOptions{})}, max: 4095}
	_, err := New(cfg, small, Options{Tokens: &loadingTokens{synced: true}})
	if err == nil || !strings.Contains(err.Error(), "limits.maxBodyBytes is 4096 but the queue carries bodies of at most 4095 bytes") {
		t.Errorf("New with a body limit above the queue's = %v, want a clear error", err)
	}

	// The queue's limit shrank after start (NATS reconfigured): 413.
	q := &sizedQueue{fakeQueue: fakeQueue{engine: newEngine(engineOptions{})}, max: 0}
	tokens := NewStaticTokens(NewTokenHasher(nil), map[string]*Principal{aliceToken: {Name: "alice"}})
	g, err := New(cfg, q, Options{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	q.max = 100
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	h := &harness{g: g, srv: srv}
	big := `{"model":"llama-3-8b","messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}]}`
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, big)
	wantError(t, resp, body, http.StatusRequestEntityTooLarge,
		`{"error":{"message":"The request body is too large to be queued; send a smaller request.","type":"invalid_request_error","param":null,"code":"request_too_large"}}`)
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After = %q on a request that retrying cannot help", ra)
	}
}
