package sidecar_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"
)

// sidecarEnv is a sidecar served over HTTP in front of an in-process
// simulator with real weights and sleep mode.
type sidecarEnv struct {
	t     *testing.T
	sim   *sim.Simulator
	eng   *httptest.Server
	agent *httptest.Server
}

func startSidecar(t *testing.T, mut func(*sim.Config, *agent.Config)) *sidecarEnv {
	t.Helper()
	sc := sim.Default()
	sc.TimeToFirstToken, sc.InterTokenLatency, sc.OutputTokens = 0, 0, 4
	sc.Weights.Bytes = 2 << 20
	sc.Sleep = sim.Sleep{Enabled: true, HotDir: t.TempDir()}
	ac := agent.Default()
	ac.Sidecar.PollInterval, ac.Sidecar.DrainTimeout = 5*time.Millisecond, 5*time.Second
	if mut != nil {
		mut(&sc, &ac)
	}
	s := sim.New(sc)
	if err := s.LoadWeights(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	eng := httptest.NewServer(s.Handler())
	t.Cleanup(eng.Close)
	ac.Sidecar.Engine = sidecar.EngineConfig{Kind: "simulator", URL: eng.URL}
	e := &sidecarEnv{t: t, sim: s, eng: eng, agent: serveAgent(t, ac)}
	e.waitState(sidecarapi.Awake)
	return e
}

// serveAgent serves an agent with ac until the test ends.
func serveAgent(t *testing.T, ac agent.Config) *httptest.Server {
	t.Helper()
	if err := ac.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h, err := agent.Start(ctx, ac, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	agent := httptest.NewServer(h)
	t.Cleanup(agent.Close)
	return agent
}

func (e *sidecarEnv) do(method, path string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.agent.URL+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *sidecarEnv) state() sidecarapi.Status {
	e.t.Helper()
	_, body := e.do("GET", "/state")
	var st sidecarapi.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		e.t.Fatalf("%v: %s", err, body)
	}
	return st
}

func (e *sidecarEnv) waitState(want sidecarapi.State) {
	e.t.Helper()
	eventually(e.t, 10*time.Second, func() error {
		if got := e.state().State; got != want {
			return fmt.Errorf("state %s, want %s", got, want)
		}
		return nil
	})
}

func TestSidecarSleepWakeAndReadiness(t *testing.T) {
	e := startSidecar(t, nil)
	if code, _ := e.do("GET", "/readyz"); code != http.StatusOK {
		t.Fatalf("readyz while awake: %d", code)
	}
	if code, body := e.do("POST", "/sleep?level=1"); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	st := e.state()
	if st.State != sidecarapi.Asleep || st.Level != 1 || st.Sleeps != 1 {
		t.Fatalf("after sleep: %+v", st)
	}
	if e.sim.WeightsStatus().ResidentBytes != 0 {
		t.Fatal("the engine still holds its weights")
	}
	code, body := e.do("GET", "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "Asleep") {
		t.Fatalf("readyz while asleep: %d %s, want 503 so the root leaves the EndpointSlice", code, body)
	}
	code, body = e.do("POST", "/wake")
	if code != http.StatusOK {
		t.Fatalf("wake: %d %s", code, body)
	}
	// The answer carries the engine's digest: the leader sends it to the
	// node agent with the wake, and the agent's promotions verify by it.
	var woke sidecarapi.Status
	if err := json.Unmarshal([]byte(body), &woke); err != nil {
		t.Fatalf("wake answer %s: %v", body, err)
	}
	if w := e.sim.WeightsStatus(); woke.Digest == "" || woke.Digest != w.Digest {
		t.Fatalf("wake answer digest %q, want the engine's %q", woke.Digest, w.Digest)
	}
	st = e.state()
	if st.State != sidecarapi.Awake || st.Wakes != 1 || st.LastWake == nil {
		t.Fatalf("after wake: %+v", st)
	}
	// The engine's own report of what the wake moved reaches the state, for
	// the lifecycle's status (from tier, bytes, bandwidth).
	if tr := st.LastWake.Transfer; tr == nil || tr.Tier != v1alpha1.TierHot || tr.Bytes != 2<<20 || !tr.Verified {
		t.Fatalf("last wake transfer %+v, want 2 MiB from the hot tier, verified", tr)
	}
	if w := e.sim.WeightsStatus(); w.Verified != 1 || w.Sleeping {
		t.Fatalf("engine after wake: %+v", w)
	}
	if code, _ := e.do("GET", "/readyz"); code != http.StatusOK {
		t.Fatalf("readyz after wake: %d", code)
	}
	_, metrics := e.do("GET", "/metrics")
	for _, want := range []string{`orchestra_agent_sidecar_state{state="Awake"} 1`, `orchestra_agent_sidecar_transitions_total{op="sleep",result="ok"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestSidecarWakeDuringDrainAbandonsTheSleep(t *testing.T) {
	e := startSidecar(t, func(c *sim.Config, _ *agent.Config) { c.TimeToFirstToken = time.Hour })
	// A request in flight keeps the drain waiting.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", e.eng.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	for e.sim.WeightsStatus().InFlight != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	sleepDone := make(chan [2]any, 1)
	go func() {
		code, body := e.do("POST", "/sleep")
		sleepDone <- [2]any{code, body}
	}()
	e.waitState(sidecarapi.Draining)
	if code, body := e.do("POST", "/wake"); code != http.StatusOK {
		t.Fatalf("wake during drain: %d %s", code, body)
	}
	r := <-sleepDone
	if r[0] != http.StatusConflict || !strings.Contains(r[1].(string), "abandoned") {
		t.Fatalf("the overtaken sleep answered %v %v, want 409 abandoned", r[0], r[1])
	}
	if st := e.state(); st.State != sidecarapi.Awake {
		t.Fatalf("state %s after the abandoned sleep", st.State)
	}
	if e.sim.IsSleeping() {
		t.Fatal("the engine was put to sleep with a request in flight")
	}
}

func TestSidecarDrainTimeoutKeepsTheEngineAwake(t *testing.T) {
	e := startSidecar(t, func(c *sim.Config, a *agent.Config) {
		c.TimeToFirstToken = time.Hour
		a.Sidecar.DrainTimeout = 100 * time.Millisecond
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", e.eng.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	for e.sim.WeightsStatus().InFlight != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	code, body := e.do("POST", "/sleep")
	if code != http.StatusConflict || !strings.Contains(body, "did not drain") {
		t.Fatalf("sleep: %d %s, want 409 drain timeout", code, body)
	}
	if st := e.state(); st.State != sidecarapi.Awake {
		t.Fatalf("state %s", st.State)
	}
}

func TestSidecarFailedWakeStaysAsleep(t *testing.T) {
	e := startSidecar(t, func(c *sim.Config, _ *agent.Config) { c.Faults.WakeFail = true })
	if code, body := e.do("POST", "/sleep"); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	code, body := e.do("POST", "/wake")
	if code != http.StatusInternalServerError || !strings.Contains(body, "injected wake failure") {
		t.Fatalf("wake: %d %s", code, body)
	}
	if st := e.state(); st.State != sidecarapi.Asleep || !strings.Contains(st.LastError, "injected") {
		t.Fatalf("after a failed wake: %+v, want Asleep with the error", st)
	}
	if code, _ := e.do("GET", "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz after a failed wake: %d", code)
	}
}

func TestSidecarAdoptsTheEngineState(t *testing.T) {
	e := startSidecar(t, nil)
	// Someone else put the engine to sleep (llama.cpp's idle sleep does).
	if _, err := e.sim.Sleep(2); err != nil {
		t.Fatal(err)
	}
	e.waitState(sidecarapi.Asleep)
	e.eng.Close()
	e.waitState(sidecarapi.Unknown)
	if code, body := e.do("POST", "/wake"); code != http.StatusConflict || !strings.Contains(body, "has not answered") {
		t.Fatalf("wake of an unreachable engine: %d %s, want 409", code, body)
	}
	if code, _ := e.do("POST", "/sleep"); code != http.StatusConflict {
		t.Fatalf("sleep of an unreachable engine: %d, want 409", code)
	}
}

// TestSeatStateReportsTheEnginesResidentMemory: GET /state carries the
// simulator's weights digest and the memory its weights hold, so a caller
// can check that a sleep freed it.
func TestSidecarStateReportsTheEnginesResidentMemory(t *testing.T) {
	e := startSidecar(t, nil)
	st := e.state()
	w := e.sim.WeightsStatus()
	if st.ResidentBytes == nil || *st.ResidentBytes != 2<<20 || st.Digest == "" || st.Digest != w.Digest {
		t.Fatalf("awake: residentBytes %v, digest %q; want %d resident bytes and the engine's digest %q", st.ResidentBytes, st.Digest, 2<<20, w.Digest)
	}
	if code, body := e.do("POST", "/sleep?level=1"); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	if st := e.state(); st.ResidentBytes == nil || *st.ResidentBytes != 0 {
		t.Errorf("asleep: residentBytes %v, want 0 (the sleep freed the weights)", st.ResidentBytes)
	}
}
