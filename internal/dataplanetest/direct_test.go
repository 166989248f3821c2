package dataplanetest_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/polltest"
)

// gatewayMetric returns the value of one series of the first gateway's
// /metrics, 0 when absent.
func gatewayMetric(t *testing.T, s *dataplanetest.Stack, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	s.GatewayOps.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			_, _ = fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

func laneCount(t *testing.T, s *dataplanetest.Stack, endpoint, lane string) float64 {
	return gatewayMetric(t, s, `orchestra_gateway_requests_total{code="200",endpoint="`+endpoint+`",lane="`+lane+`",model="sim-model"}`)
}

// send posts body to path and returns the status and the answer.
func send(t *testing.T, url, path, body string) (int, string) {
	t.Helper()
	status, answer, _ := sendLane(t, url, path, body, "")
	return status, answer
}

// sendLane is send with a lane asked for ("" for none); it also returns
// the lane the answer says it took.
func sendLane(t *testing.T, url, path, body, lane string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, bytes.NewReader([]byte(body)))
	if lane != "" {
		req.Header.Set(gateway.HeaderLane, lane)
	}
	req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header.Get(gateway.HeaderLane)
}

func directStack(t *testing.T) (*dataplanetest.Stack, *dataplanetest.Dispatcher) {
	s := startStack(t, dataplanetest.FastSim(), func(c *dataplanetest.StackConfig) {
		c.Gateway = func(g *gateway.Config) {
			g.Models[0].DirectLane = true
			g.Direct.LeaseIdle.Duration = 500 * time.Millisecond
		}
	})
	return s, dispatcher(t, s)
}

// dispatcherMetric sums the series of a dispatcher metric.
func dispatcherMetric(d *dataplanetest.Dispatcher, name string) float64 {
	mfs, _ := d.Registry().Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func leasesHeld(d *dataplanetest.Dispatcher) float64 {
	return dispatcherMetric(d, "orchestra_dispatcher_leases")
}

// awaitLease sends requests until the gateway holds a lease: the one that
// asks takes the queue, and with one slot a root a lease granted before
// that request is taken back for it (queued requests come first).
func awaitLease(t *testing.T, s *dataplanetest.Stack, d *dataplanetest.Dispatcher) {
	t.Helper()
	polltest.Eventually(t, 10*time.Second, 200*time.Millisecond, func() error {
		if leasesHeld(d) == 1 {
			return nil
		}
		if status, body := send(t, s.Gateway.URL, "/v1/chat/completions", chatBody); status != 200 {
			t.Fatalf("request: %d %s", status, body)
		}
		return fmt.Errorf("no lease held yet")
	})
}

const (
	chatBody       = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`
	chatStream     = `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	completionBody = `{"model":"sim-model","prompt":"hi"}`
	completionSSE  = `{"model":"sim-model","stream":true,"prompt":"hi","stream_options":{"include_usage":true}}`
)

// TestDirectLaneServesOnALease: the first request takes the queue and asks
// for a lease; once it is held, chat and legacy completions, streamed and
// not, go straight to the engine (the dispatcher sends none of them), with
// the same answers and usage; the lease is given back once unused and the
// dispatcher's slot is free again.
func TestDirectLaneServesOnALease(t *testing.T) {
	s, d := directStack(t)
	if status, body := send(t, s.Gateway.URL, "/v1/chat/completions", chatBody); status != 200 {
		t.Fatalf("first request: %d %s", status, body)
	}
	if got := laneCount(t, s, "chat", "queue"); got != 1 {
		t.Fatalf("the first request took the queue %v times, want 1", got)
	}
	eventually(t, 5*time.Second, func() error {
		if leasesHeld(d) != 1 {
			return fmt.Errorf("no lease held yet")
		}
		return nil
	})
	dispatched := dispatcherMetric(d, "orchestra_dispatcher_dispatched_total")
	for i, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", chatBody, `"usage"`},
		{"/v1/chat/completions", chatStream, "data: [DONE]"},
		{"/v1/completions", completionBody, `"usage"`},
		{"/v1/completions", completionSSE, `"usage"`},
	} {
		status, body := send(t, s.Gateway.URL, c.path, c.body)
		if status != 200 || !strings.Contains(body, c.want) {
			t.Fatalf("request %d (%s): %d, want 200 with %s:\n%s", i, c.path, status, c.want, body)
		}
	}
	// A client may ask for the queue (durable) while the lane is open.
	if status, _, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", chatBody, "queue"); status != 200 || lane != "queue" {
		t.Errorf("a request asking for the queue: %d, lane %q", status, lane)
	}
	if _, _, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", chatBody, ""); lane != "direct" {
		t.Errorf("the answer says lane %q, want direct", lane)
	}
	if got := laneCount(t, s, "chat", "direct") + laneCount(t, s, "completions", "direct"); got != 5 {
		t.Errorf("%v requests took the direct lane, want 5", got)
	}
	if got := dispatcherMetric(d, "orchestra_dispatcher_dispatched_total"); got != dispatched+1 {
		t.Errorf("the dispatcher sent %v requests to the engine, want 1 (the one that asked for the queue)", got-dispatched)
	}
	// Unused, the lease goes back.
	eventually(t, 5*time.Second, func() error {
		if l := leasesHeld(d); l != 0 {
			return fmt.Errorf("%v leases still held", l)
		}
		return nil
	})
}

// TestDirectLaneFallsBackToTheQueue: an engine that refuses a direct
// request before answering (503) costs the client nothing: the request is
// served through the queue, and the lease is given back at once.
func TestDirectLaneFallsBackToTheQueue(t *testing.T) {
	s, d := directStack(t)
	send(t, s.Gateway.URL, "/v1/chat/completions", chatBody)
	eventually(t, 5*time.Second, func() error {
		if leasesHeld(d) != 1 {
			return fmt.Errorf("no lease held yet")
		}
		return nil
	})
	s.Engine.Refuse.Store(1)
	if status, body := send(t, s.Gateway.URL, "/v1/chat/completions", chatStream); status != 200 || !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("refused direct request: %d %s", status, body)
	}
	if got := laneCount(t, s, "chat", "queue"); got != 2 {
		t.Errorf("%v requests took the queue, want 2 (the first, and the one the engine refused)", got)
	}
	if got := laneCount(t, s, "chat", "direct"); got != 0 {
		t.Errorf("%v requests counted on the direct lane, want 0", got)
	}
	if l := leasesHeld(d); l != 0 {
		t.Errorf("%v leases held after the engine failed on one", l)
	}
}

// TestDirectLaneOffByField: a model without directLane sends everything
// through the queue and asks for no lease.
func TestDirectLaneOffByField(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), nil)
	d := dispatcher(t, s)
	for range 3 {
		if status, body := send(t, s.Gateway.URL, "/v1/chat/completions", chatBody); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	if got := laneCount(t, s, "chat", "queue"); got != 3 {
		t.Errorf("%v requests took the queue, want 3", got)
	}
	if n := dispatcherMetric(d, "orchestra_dispatcher_lease_requests_total"); n != 0 {
		t.Errorf("%v lease requests with the direct lane off", n)
	}
}

// TestALeaseIsTakenBackForQueuedRequests: with one slot a root, a slot lent
// to the gateway's direct lane does not keep queued requests waiting: the
// dispatcher takes the lease back, and the queued request is served.
func TestALeaseIsTakenBackForQueuedRequests(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) { d.Apps[0].MaxConcurrency = 1 }
		c.Gateway = func(g *gateway.Config) {
			g.Models[0].DirectLane = true
			g.Direct.LeaseIdle.Duration = time.Minute // held, unused, all along
		}
	})
	d := dispatcher(t, s)
	awaitLease(t, s, d)
	sent := time.Now()
	status, body, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", chatBody, "queue")
	if status != 200 || lane != "queue" {
		t.Fatalf("the queued request: %d (lane %q) %s", status, lane, body)
	}
	t.Logf("the queued request was answered in %s", time.Since(sent).Round(time.Millisecond))
	eventually(t, 5*time.Second, func() error {
		if l := leasesHeld(d); l != 0 {
			return fmt.Errorf("%v leases held after a queued request needed the only slot", l)
		}
		return nil
	})
	// The gateway saw the revocation: its next request takes the queue
	// (and asks again) instead of the engine on a slot it no longer has.
	if _, _, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", chatBody, ""); lane != "queue" {
		t.Errorf("the request after the revocation took lane %q, want queue", lane)
	}
}
