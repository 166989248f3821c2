package dispatch_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
)

// TestOpsEndpointsOverHTTP runs the dispatcher as orchestra-dispatcher does
// (dispatch.Serve is dispatch.Run on a given listener) and checks what
// Kubernetes probes and Prometheus see: /healthz always, /readyz only while
// the consumers are provisioned and NATS is connected, /metrics with the
// queue and engine series after a request.
func TestOpsEndpointsOverHTTP(t *testing.T) {
	engine, err := dataplanetest.StartEngine(dataplanetest.FastSim())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(engine.Close)
	natsPort := freePort(t)
	cfg := dispatch.Default()
	cfg.Orchestra = "test"
	cfg.NATS.URL = fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	cfg.Apps = []dispatch.App{{Name: app, Endpoints: []string{engine.URL}, Port: 8000, MaxConcurrency: 8}}
	cfg.AckWait = metav1.Duration{Duration: 2 * time.Second}
	cfg.HeartbeatInterval = metav1.Duration{Duration: 100 * time.Millisecond}
	cfg.ShutdownTimeout = metav1.Duration{Duration: 2 * time.Second}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dispatch.Serve(ctx, cfg, "", testLogger(t), ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	})

	// NATS is not running yet: alive, not ready.
	eventually(t, 10*time.Second, holds("/healthz to answer 200", func() bool { return status(t, base+"/healthz") == http.StatusOK }))
	consistently(t, 250*time.Millisecond, func() error {
		if code := status(t, base+"/readyz"); code != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz without NATS = %d, want 503", code)
		}
		return nil
	})

	srv, err := dataplanetest.StartNATS(t.TempDir(), natsPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	eventually(t, 20*time.Second, holds("/readyz to answer 200 once NATS is up", func() bool { return status(t, base+"/readyz") == http.StatusOK }))

	// Serve one request through the queue.
	e := &env{t: t, srv: srv, engine: engine, cfg: cfg}
	c := e.client(nil)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	r, err := c.Submit(rctx, chatJob("job-ops", "measure me", false))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _, err := collect(rctx, r); err != nil || code != http.StatusOK {
		t.Fatalf("answer: status %d, %v", code, err)
	}
	_ = r.Close()

	chat := `{app="chat"}`
	var m map[string]float64
	// The request counts as completed a moment before it leaves the
	// in-flight gauge.
	eventually(t, 5*time.Second, holds("completed_total to count the request and inflight to drop it", func() bool {
		m = scrape(t, base+"/metrics")
		return m[`orchestra_dispatcher_completed_total{app="chat",code="200"}`] == 1 && m[`orchestra_dispatcher_inflight{app="chat"}`] == 0
	}))
	for _, check := range []struct {
		series string
		ok     func(float64) bool
		want   string
	}{
		{"orchestra_dispatcher_backlog" + chat, func(v float64) bool { return v == 0 }, "0 (nothing left queued)"},
		{"orchestra_dispatcher_ack_pending" + chat, func(v float64) bool { return v >= 0 }, ">= 0"},
		{"orchestra_dispatcher_inflight" + chat, func(v float64) bool { return v == 0 }, "0 (the request finished)"},
		{"orchestra_dispatcher_dispatched_total" + chat, func(v float64) bool { return v == 1 }, "1"},
		{"orchestra_dispatcher_queue_wait_seconds_count" + chat, func(v float64) bool { return v == 1 }, "1"},
		{"orchestra_dispatcher_queue_wait_seconds_sum" + chat, func(v float64) bool { return v >= 0 && v < 10 }, "between 0 and 10 seconds"},
		{"orchestra_dispatcher_engine_request_seconds_count" + chat, func(v float64) bool { return v == 1 }, "1"},
		{fmt.Sprintf(`orchestra_dispatcher_root_healthy{app="chat",root=%q}`, engine.URL), func(v float64) bool { return v == 1 }, "1 (the root answered)"},
	} {
		v, ok := m[check.series]
		if !ok || !check.ok(v) {
			t.Errorf("%s = %v (present %v), want %s", check.series, v, ok, check.want)
		}
	}

	// NATS goes away: still alive, no longer ready.
	srv.Shutdown()
	eventually(t, 10*time.Second, holds("/readyz to answer 503 without NATS", func() bool { return status(t, base+"/readyz") == http.StatusServiceUnavailable }))
	if code := status(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz without NATS = %d, want 200", code)
	}
}

// freePort returns a TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// status GETs url and returns the status code (0 when it cannot connect).
func status(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		return 0
	}
	defer func() { _ = res.Body.Close() }()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode
}

// scrape reads a Prometheus text exposition into series -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
