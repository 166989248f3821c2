package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
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

// TestDrainClosesKeptAliveConnectionsAfterAnAnswer: during the drain delay
// a client's kept-alive connection still carries its next request, whose
// answer says "Connection: close", so that the client opens its next
// connection elsewhere instead of racing the gateway's close of an idle
// connection.
func TestDrainClosesKeptAliveConnectionsAfterAnAnswer(t *testing.T) {
	cfg := testConfig()
	cfg.Server.DrainDelay.Duration = 3 * time.Second
	_, apiURL, opsURL, stop, _ := servedGateway(t, cfg, newEngine(engineOptions{}))
	client := &http.Client{Transport: &http.Transport{}}
	get := func() (*http.Response, bool) {
		t.Helper()
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", apiURL+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp, reused
	}
	if resp, _ := get(); resp.StatusCode != http.StatusOK || resp.Close { //nolint:bodyclose // get closed it
		t.Fatalf("before the drain: status %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	stop() // SIGTERM
	eventually(t, 2*time.Second, holds("readyz to fail while draining", func() bool {
		r, err := http.Get(opsURL + "/readyz")
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusServiceUnavailable
	}))
	resp, reused := get() //nolint:bodyclose // get closed it
	if resp.StatusCode != http.StatusOK || !reused || !resp.Close {
		t.Errorf("while draining: status %d on a reused connection %v, Connection: close %v; want 200, true, true", resp.StatusCode, reused, resp.Close)
	}
	if _, reused := get(); reused { //nolint:bodyclose // get closed it
		t.Error("the connection answered with Connection: close was used again")
	}
}
