package sidecar_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
	"github.com/model-orchestra/operator/internal/sim"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newEngine(t *testing.T, cfg sidecar.EngineConfig) sidecar.Engine {
	t.Helper()
	cfg.PollInterval = 5 * time.Millisecond
	e, err := sidecar.NewEngine(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestVLLMAdapterLevel1(t *testing.T) {
	f := enginetest.NewVLLM()
	defer f.Close()
	e := newEngine(t, sidecar.EngineConfig{Kind: "vllm", URL: f.URL()})
	ctx := ctxT(t)
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if s, _ := e.Sleeping(ctx); !s {
		t.Fatal("not sleeping after Sleep")
	}
	if err := e.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Crashed() != "" || !f.WeightsValid() {
		t.Fatalf("engine crashed=%q weightsValid=%v", f.Crashed(), f.WeightsValid())
	}
}

func TestVLLMAdapterLevel2UsesTheDocumentedSequence(t *testing.T) {
	f := enginetest.NewVLLM()
	defer f.Close()
	e := newEngine(t, sidecar.EngineConfig{Kind: "vllm", URL: f.URL()})
	ctx := ctxT(t)
	if err := e.Sleep(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if f.WeightsValid() {
		t.Fatal("the fake kept its weights at level 2")
	}
	if err := e.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if !f.WeightsValid() {
		t.Fatal("woke from level 2 on garbage weights: reload_weights was not called")
	}
	var wake []string
	for _, c := range f.Calls() {
		if strings.HasPrefix(c, "POST") && !strings.HasPrefix(c, "POST /sleep") {
			wake = append(wake, c)
		}
	}
	want := []string{"POST /wake_up?tags=weights", "POST /collective_rpc", "POST /wake_up?tags=kv_cache", "POST /reset_prefix_cache"}
	if diff := cmp.Diff(want, wake); diff != "" {
		t.Fatalf("wake sequence (-want +got):\n%s", diff)
	}
}

func TestVLLMAdapterRefusesToSleepWithRequestsInFlight(t *testing.T) {
	f := enginetest.NewVLLM()
	defer f.Close()
	f.SetInFlight(2)
	e := newEngine(t, sidecar.EngineConfig{Kind: "vllm", URL: f.URL()})
	err := e.Sleep(ctxT(t), 1)
	if !errors.Is(err, sidecar.ErrBusy) {
		t.Fatalf("Sleep with 2 requests in flight: %v, want ErrBusy", err)
	}
	if f.Crashed() != "" {
		t.Fatalf("the fake crashed: %s (the adapter called /sleep with requests in flight)", f.Crashed())
	}
}

func TestVLLMFakeReproducesTheCrashes(t *testing.T) {
	// The fakes must fail like vLLM, or the adapter tests prove nothing.
	t.Run("sleep with requests in flight (#45520)", func(t *testing.T) {
		f := enginetest.NewVLLM()
		defer f.Close()
		f.SetInFlight(1)
		resp, err := http.Post(f.URL()+"/sleep?level=1", "", nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("/sleep: %v %v, want 200 as vLLM answers", resp, err)
		}
		_ = resp.Body.Close()
		if f.Crashed() == "" {
			t.Fatal("the fake survived")
		}
		// The adapter notices: is_sleeping no longer answers.
		e := newEngine(t, sidecar.EngineConfig{Kind: "vllm", URL: f.URL()})
		if _, err := e.Sleeping(ctxT(t)); err == nil {
			t.Fatal("a dead engine answered is_sleeping")
		}
	})
	t.Run("request while asleep (#15483)", func(t *testing.T) {
		f := enginetest.NewVLLM()
		defer f.Close()
		e := newEngine(t, sidecar.EngineConfig{Kind: "vllm", URL: f.URL()})
		if err := e.Sleep(ctxT(t), 1); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(f.URL()+"/v1/completions", "application/json", strings.NewReader("{}"))
		if err == nil {
			_ = resp.Body.Close()
			t.Fatal("a request to the sleeping fake got an answer")
		}
		if !strings.Contains(f.Crashed(), "15483") {
			t.Fatalf("crashed = %q", f.Crashed())
		}
	})
}

// The simulator speaks the same contract as the vLLM fake.
func TestVLLMAdapterAgainstTheSimulator(t *testing.T) {
	for _, level := range []int{1, 2} {
		cfg := sim.Default()
		cfg.TimeToFirstToken, cfg.InterTokenLatency = 0, 0
		cfg.Weights.Bytes = 1 << 20
		cfg.Sleep = sim.Sleep{Enabled: true, HotDir: t.TempDir()}
		s := sim.New(cfg)
		if err := s.LoadWeights(); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		e := newEngine(t, sidecar.EngineConfig{Kind: "simulator", URL: srv.URL})
		ctx := ctxT(t)
		if n, err := e.InFlight(ctx); err != nil || n != 0 {
			t.Fatalf("InFlight = %d, %v", n, err)
		}
		if err := e.Sleep(ctx, level); err != nil {
			t.Fatalf("level %d: %v", level, err)
		}
		if st := s.WeightsStatus(); st.ResidentBytes != 0 || st.Level != level {
			t.Fatalf("level %d asleep: %+v", level, st)
		}
		if err := e.Wake(ctx); err != nil {
			t.Fatalf("level %d wake: %v", level, err)
		}
		if st := s.WeightsStatus(); st.Sleeping || !st.Loaded || st.Verified != 1 {
			t.Fatalf("level %d awake: %+v", level, st)
		}
		srv.Close()
		s.Close()
	}
}

func TestOllamaAdapter(t *testing.T) {
	f := enginetest.NewOllama("llama3:8b")
	defer f.Close()
	f.LoadDelay = 200 * time.Millisecond
	e := newEngine(t, sidecar.EngineConfig{Kind: "ollama", URL: f.URL(), Model: "llama3:8b", KeepAlive: "-1"})
	ctx := ctxT(t)
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if s, _ := e.Sleeping(ctx); !s {
		t.Fatal("still listed in /api/ps after the unload")
	}
	// The caller gives up as soon as the load has started: the preload
	// must still complete (ollama#7408 aborts loads whose client leaves).
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		<-f.LoadStarted()
		cancel()
	}()
	if err := e.Wake(wctx); err != nil {
		t.Fatalf("wake: %v", err)
	}
	if f.Aborted() != 0 {
		t.Fatalf("%d loads aborted by a disconnect", f.Aborted())
	}
	if s, _ := e.Sleeping(ctx); s {
		t.Fatal("not loaded after the wake")
	}
	if ka := f.KeepAlive("llama3:8b"); ka != float64(-1) {
		t.Fatalf("keep_alive of the preload = %v, want -1", ka)
	}
}

func TestLlamaCPPAdapter(t *testing.T) {
	f := enginetest.NewLlamaCPP("qwen", "other")
	defer f.Close()
	f.LoadDelay = 30 * time.Millisecond
	e := newEngine(t, sidecar.EngineConfig{Kind: "llamacpp", URL: f.URL(), Model: "qwen", SlotSave: true})
	ctx := ctxT(t)
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := f.Status("qwen"); got != "unloaded" {
		t.Fatalf("status after sleep %q", got)
	}
	if got := f.Status("other"); got != "loaded" {
		t.Fatalf("the other model was touched: %q", got)
	}
	if err := e.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.Status("qwen"); got != "loaded" {
		t.Fatalf("status after wake %q", got)
	}
	saved, restored := f.SlotCalls()
	if diff := cmp.Diff([]string{"qwen.slot0.bin"}, saved); diff != "" || !cmp.Equal(saved, restored) {
		t.Fatalf("slots saved %v restored %v", saved, restored)
	}
	bad := newEngine(t, sidecar.EngineConfig{Kind: "llamacpp", URL: f.URL(), Model: "absent"})
	if err := bad.Wake(ctx); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("wake of an unknown model: %v", err)
	}
}

func TestUnsupportedEngines(t *testing.T) {
	_, err := sidecar.NewEngine(sidecar.EngineConfig{Kind: "dllama"}, nil)
	if !errors.Is(err, sidecar.ErrUnsupportedEngine) || !strings.Contains(err.Error(), "spec.applications.<app>.runtime.engine") {
		t.Fatalf("dllama: %v, want ErrUnsupportedEngine naming the field", err)
	}
	if _, err := sidecar.NewEngine(sidecar.EngineConfig{Kind: "tgi"}, nil); !errors.Is(err, sidecar.ErrUnsupportedEngine) {
		t.Fatalf("unknown engine: %v", err)
	}
	if _, err := sidecar.NewEngine(sidecar.EngineConfig{Kind: "ollama"}, nil); err == nil {
		t.Fatal("ollama without a model")
	}
}
