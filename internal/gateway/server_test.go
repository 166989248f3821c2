package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// servedGateway runs serve on loopback listeners and returns their URLs
// and the result of serve.
func servedGateway(t *testing.T, cfg Config, engine engineFunc) (*harness, string, string, context.CancelFunc, <-chan error) {
	t.Helper()
	h := newHarness(t, cfg, engine)
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- h.g.serve(ctx, api, ops) }()
	return h, "http://" + api.Addr().String(), "http://" + ops.Addr().String(), cancel, done
}

// openStream starts a streaming chat request and returns the response
// once its first event arrived.
func openStream(t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first stream line = %q, %v", line, err)
	}
	return resp, r
}

func TestGracefulDrain(t *testing.T) {
	cfg := testConfig()
	cfg.Server.DrainDelay.Duration = 200 * time.Millisecond
	cfg.Server.DrainTimeout.Duration = 10 * time.Second
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	h, apiURL, opsURL, stop, done := servedGateway(t, cfg, newEngine(engineOptions{hold: hold}))

	resp, stream := openStream(t, apiURL)
	defer func() { _ = resp.Body.Close() }()
	stop() // SIGTERM

	eventually(t, 5*time.Second, holds("readyz to fail while draining", func() bool {
		r, err := http.Get(opsURL + "/readyz")
		if err != nil {
			return false
		}
		defer func() { _ = r.Body.Close() }()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode == http.StatusServiceUnavailable && string(b) == "draining\n"
	}))
	eventually(t, 5*time.Second, holds("the API listener to close", func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(apiURL, "http://"), time.Second)
		if err != nil {
			return true
		}
		_ = c.Close()
		return false
	}))
	select {
	case err := <-done:
		t.Fatalf("serve returned (%v) while a stream was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}

	release()
	rest, err := io.ReadAll(stream)
	if err != nil {
		t.Fatalf("reading the rest of the stream: %v", err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("the in-flight stream did not complete: %q", rest)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after the last stream ended")
	}
	if h.q.lastReply(t).complete.Load() != true {
		t.Error("the drained stream's reply did not complete")
	}
}

func TestDrainTimeoutCancelsStreams(t *testing.T) {
	cfg := testConfig()
	cfg.Server.DrainTimeout.Duration = 100 * time.Millisecond
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	h, apiURL, _, stop, done := servedGateway(t, cfg, newEngine(engineOptions{hold: hold}))

	resp, _ := openStream(t, apiURL)
	defer func() { _ = resp.Body.Close() }()
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after the drain timeout")
	}
	reply := h.q.lastReply(t)
	if !reply.closed.Load() || reply.complete.Load() {
		t.Errorf("after the drain timeout: reply closed=%v complete=%v, want closed and incomplete",
			reply.closed.Load(), reply.complete.Load())
	}
	select {
	case <-reply.engineCtx.Done():
	default:
		t.Error("the engine's request was not cancelled")
	}
}
