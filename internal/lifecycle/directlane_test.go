package lifecycle_test

// The gateway's direct lane against the lifecycle, in process with real
// NATS: a real gateway (its lifecycle states watched from the bucket), a
// real dispatcher with its lifecycle leader, and the simulator engine.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/lifecyclestate"
)

// directPlane runs the data plane with zeroAfter as the application's idle
// limit, an engine whose natural answer takes about 3 s (short requests
// ask for 2 tokens), and a gateway with the direct lane on and its default
// leaseIdle. It returns the gateway's URL and the dispatcher's registry.
func (e *env) directPlane(zeroAfter time.Duration) (string, *prometheus.Registry) {
	e.t.Helper()
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens, simCfg.InterTokenLatency = 150, 20*time.Millisecond
	client, reg := e.dataPlaneWith(simCfg, func(c *dispatch.Config) {
		c.Lifecycle.Apps[0].ZeroAfter = metav1.Duration{Duration: zeroAfter}
		c.Lifecycle.Apps[0].MaxReplicas = 1
	})
	nc, err := nats.Connect(e.srv.ClientURL())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	states, err := lifecyclestate.Watch(ctx, nc, orch, slog.New(slog.DiscardHandler))
	if err != nil {
		e.t.Fatal(err)
	}
	gcfg := gateway.Default()
	gcfg.Models = []gateway.ModelConfig{{Name: simCfg.Model, App: app, DirectLane: true, MaxWait: metav1.Duration{Duration: 30 * time.Second}}}
	gcfg.Limits.Default = gateway.Limits{}
	gcfg.Log.AccessLog = false
	tokens := gateway.NewStaticTokens(gateway.NewTokenHasher(nil), map[string]*gateway.Principal{dataplanetest.APIKey: {Name: "e2e"}})
	g, err := gateway.New(gcfg, client, gateway.Options{Tokens: tokens, Wake: states})
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	e.t.Cleanup(srv.Close)
	return srv.URL, reg
}

// chat sends a chat request, streamed, with maxTokens (0: the engine's
// natural length), and returns the status, the lane the answer took and
// whether the stream ended with [DONE].
func chat(t *testing.T, url string, maxTokens int) (status int, lane string, done bool) {
	t.Helper()
	body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]`
	if maxTokens > 0 {
		body += fmt.Sprintf(`,"max_tokens":%d`, maxTokens)
	}
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader([]byte(body+"}")))
	req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get(gateway.HeaderLane), strings.Contains(string(b), "data: [DONE]")
}

// leaseHeld waits until the gateway holds a lease, sending a short request
// now and then (the one that finds none asks for one).
func (e *env) leaseHeld(url string, reg *prometheus.Registry) {
	e.t.Helper()
	eventually(e.t, 15*time.Second, func() error {
		if sum(e.t, reg, "orchestra_dispatcher_leases") == 1 {
			return nil
		}
		if status, _, _ := chat(e.t, url, 2); status != 200 {
			e.t.Fatalf("request: status %d", status)
		}
		time.Sleep(100 * time.Millisecond)
		return fmt.Errorf("no lease held yet")
	})
}

// zeroWritesBetween lists the scales to zero written in [from, to].
func (e *env) zeroWritesBetween(from, to time.Time) []time.Time {
	var out []time.Time
	for _, w := range e.c.writes() {
		if w.replicas == 0 && !w.at.Before(from) && !w.at.After(to) {
			out = append(out, w.at)
		}
	}
	return out
}

// TestDirectLaneAcrossIdleGaps: at concurrency 1 with gaps longer than the
// old 2 s lease idle time, every request after the first takes the direct
// lane; the application still goes to zero at its idle limit after the
// last request while the gateway holds its lease, which the gateway gives
// back for the drain.
func TestDirectLaneAcrossIdleGaps(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process data plane with idle gaps of seconds; skipped with -short")
	}
	const zeroAfter = 4 * time.Second
	e := newEnv(t, 1)
	url, reg := e.directPlane(zeroAfter)
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleAwake))
	e.leaseHeld(url, reg)
	var last time.Time
	for i := range 2 {
		time.Sleep(2500 * time.Millisecond)
		status, lane, done := chat(t, url, 2)
		last = time.Now()
		if status != 200 || !done || lane != "direct" {
			t.Fatalf("request %d after a 2.5 s gap: status %d, lane %q, complete %v; want 200 on the direct lane", i, status, lane, done)
		}
	}
	if n := sum(t, reg, "orchestra_dispatcher_leases"); n != 1 {
		t.Fatalf("%v leases held after the last request, want the gateway's 1", n)
	}
	eventually(t, zeroAfter+10*time.Second, e.atReplicas(0))
	zero := e.zeroWritesBetween(last, time.Now())
	if len(zero) != 1 {
		t.Fatalf("scales to zero after the last request: %v, want 1", zero)
	}
	if idle := zero[0].Sub(last); idle < zeroAfter-100*time.Millisecond {
		t.Errorf("went to zero %v after the last request, before its idle limit %v", idle, zeroAfter)
	}
	if n := sum(t, reg, "orchestra_dispatcher_leases"); n != 0 {
		t.Errorf("%v leases held at zero, want none", n)
	}
	if st := e.state(); st.State != v1alpha1.LifecycleZero {
		t.Errorf("state %q, want Zero", st.State)
	}
	// The gateway reported its leases' use to the leader.
	if n := sum(t, reg, "orchestra_lifecycle_direct_lease_reports_total"); n < 2 {
		t.Errorf("%v lease use reports received, want at least 2 (the end of each direct request)", n)
	}
}

// TestALongDirectRequestHoldsOffTheDrain: a direct request that runs
// longer than the idle limit is not cut (it streams to its end) and keeps
// the application up; the application goes to zero at its idle limit
// after it ends.
func TestALongDirectRequestHoldsOffTheDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process data plane with requests of seconds; skipped with -short")
	}
	const zeroAfter = 1500 * time.Millisecond
	e := newEnv(t, 1)
	url, reg := e.directPlane(zeroAfter)
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleAwake))
	e.leaseHeld(url, reg)
	start := time.Now()
	status, lane, done := chat(t, url, 0) // about 3 s, twice the idle limit
	end := time.Now()
	if status != 200 || !done || lane != "direct" {
		t.Fatalf("long request: status %d, lane %q, complete %v; want 200 to [DONE] on the direct lane", status, lane, done)
	}
	if d := end.Sub(start); d < 2*zeroAfter {
		t.Fatalf("the long request took %v; the test needs one longer than twice the idle limit %v", d, zeroAfter)
	}
	if z := e.zeroWritesBetween(start, end); len(z) > 0 {
		t.Fatalf("scaled to zero at %v while a direct request ran (%v to %v)", z, start, end)
	}
	eventually(t, zeroAfter+10*time.Second, e.atReplicas(0))
	if z := e.zeroWritesBetween(end, time.Now()); len(z) != 1 || z[0].Sub(end) < zeroAfter-100*time.Millisecond {
		t.Errorf("scales to zero after the request: %v (it ended at %v); want one, at least %v later", z, end, zeroAfter)
	}
}

// TestADirectRequestRacingTheDrainCompletes: requests started around the
// moment the leader decides to go to zero (just before, at, and just after
// the idle limit) all complete: a request that finds the application
// draining takes the queue and cancels the drain; one that started on the
// lease holds the drain off until it ends; no scale to zero is written
// while one runs.
func TestADirectRequestRacingTheDrainCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process data plane racing the drain; skipped with -short")
	}
	const zeroAfter = time.Second
	e := newEnv(t, 1)
	url, reg := e.directPlane(zeroAfter)
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleAwake))
	for _, offset := range []time.Duration{-80 * time.Millisecond, -30 * time.Millisecond, 0, 20 * time.Millisecond, 60 * time.Millisecond} {
		if e.c.replicas() == 0 {
			eventually(t, 15*time.Second, func() error {
				if status, _, _ := chat(t, url, 2); status != 200 {
					return fmt.Errorf("waking request: status %d", status)
				}
				return e.inState(v1alpha1.LifecycleAwake)()
			})
		}
		e.leaseHeld(url, reg)
		status, _, _ := chat(t, url, 2)
		if status != 200 {
			t.Fatalf("request before the gap: status %d", status)
		}
		time.Sleep(zeroAfter + offset)
		start := time.Now()
		status, lane, done := chat(t, url, 40) // about 0.8 s
		end := time.Now()
		if status != 200 || !done {
			t.Fatalf("offset %v: status %d, lane %q, complete %v; want 200 to [DONE]", offset, status, lane, done)
		}
		if z := e.zeroWritesBetween(start, end); len(z) > 0 {
			t.Fatalf("offset %v: scaled to zero at %v while a request on lane %q ran (%v to %v)", offset, z, lane, start, end)
		}
		t.Logf("offset %v: lane %s, state %s", offset, lane, e.state().State)
	}
	t.Logf("drains cancelled: %v; scales to zero: %v", counter(t, reg, "orchestra_lifecycle_drains_total", map[string]string{"outcome": "cancelled"}),
		counter(t, reg, "orchestra_lifecycle_drains_total", map[string]string{"outcome": "zero"}))
}
