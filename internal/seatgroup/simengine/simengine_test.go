package simengine_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/seatgroup/simengine"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

const weights = 4 << 20

// start runs a restartable simulator that leaks its memory at every sleep
// (vllm#47654) and a sidecar of kind in front of it.
func start(t *testing.T, kind v1alpha1.Engine) (*simengine.Engine, sidecarapi.Client) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	cfg := sim.Default()
	cfg.Model = "m"
	cfg.Weights = sim.Weights{Bytes: weights, Seed: 7}
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: t.TempDir()}
	cfg.Faults.SleepLeak = true
	eng, err := simengine.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	engSrv := httptest.NewServer(eng)
	t.Cleanup(engSrv.Close)
	ac := agent.Default()
	ac.Sidecar.Engine = sidecar.EngineConfig{Kind: kind, URL: engSrv.URL, PollInterval: 5 * time.Millisecond}
	ac.Sidecar.PollInterval = 5 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h, err := agent.Start(ctx, ac, log)
	if err != nil {
		t.Fatal(err)
	}
	seatSrv := httptest.NewServer(h)
	t.Cleanup(seatSrv.Close)
	seat := sidecarapi.Client{URL: seatSrv.URL}
	eventually(t, 5*time.Second, func() error {
		st, err := seat.State(ctx)
		if err != nil {
			return err
		}
		if st.State != sidecarapi.Awake {
			return errors.New("seat is " + string(st.State))
		}
		return nil
	})
	return eng, seat
}

func memory(t *testing.T, seat sidecarapi.Client) seatgroup.MemoryReading {
	t.Helper()
	r, err := seatgroup.SidecarMemory{Client: seat}.ReadMemory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSidecarRestartsALeakingEngineInPlace: an engine that slept without
// freeing its memory is restarted through its sidecar (POST /restart):
// its memory reads 0 and its seat Asleep at level 2; its next wake starts
// it again with its weights loaded and verified, and it serves. A restart
// is refused while the engine is awake.
func TestSidecarRestartsALeakingEngineInPlace(t *testing.T) {
	eng, seat := start(t, v1alpha1.EngineSimulator)
	ctx := context.Background()
	if r := memory(t, seat); r.ResidentBytes != weights || r.WeightsBytes != weights {
		t.Fatalf("awake: reading %+v, want %d resident of %d", r, weights, weights)
	}
	var se *sidecarapi.Error
	if err := seat.Restart(ctx); !errors.As(err, &se) || se.Status != http.StatusConflict {
		t.Fatalf("restart while awake: %v, want a 409", err)
	}
	if err := seat.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if r := memory(t, seat); r.ResidentBytes != weights {
		t.Fatalf("asleep with the leak: %d bytes resident, want the %d it leaked", r.ResidentBytes, weights)
	}
	if err := seat.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := seat.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != sidecarapi.Asleep || st.Level != 2 || st.Restarts != 1 {
		t.Errorf("after the restart: state %s level %d restarts %d, want Asleep at level 2 after 1 restart", st.State, st.Level, st.Restarts)
	}
	if r := memory(t, seat); r.ResidentBytes != 0 || r.WeightsBytes != weights {
		t.Errorf("after the restart: reading %+v, want 0 resident of %d", r, weights)
	}
	if eng.Simulator() != nil {
		t.Error("the simulated engine still runs after the restart")
	}
	if err := seat.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if r := memory(t, seat); r.ResidentBytes != weights {
		t.Errorf("woken: %d bytes resident, want %d", r.ResidentBytes, weights)
	}
	s := eng.Simulator()
	if s == nil {
		t.Fatal("the wake did not start the engine")
	}
	if ws := s.WeightsStatus(); ws.Load == nil || ws.Digest == "" || ws.Sleeping {
		t.Errorf("woken engine: %+v, want its weights loaded and hashed, awake", ws)
	}
	if restarts, starts := eng.Counts(); restarts != 1 || starts != 2 {
		t.Errorf("counts: %d restarts, %d starts; want 1 and 2", restarts, starts)
	}
}

// TestSeatRefusesARestartItCannotMake: vLLM has no in-place restart; its
// seat answers 501 and stays Asleep.
func TestSeatRefusesARestartItCannotMake(t *testing.T) {
	_, seat := start(t, v1alpha1.EngineVLLM)
	ctx := context.Background()
	if err := seat.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	var se *sidecarapi.Error
	if err := seat.Restart(ctx); !errors.As(err, &se) || se.Status != http.StatusNotImplemented || !strings.Contains(se.Message, "in place") {
		t.Fatalf("restart of vllm: %v, want a 501 saying it cannot restart in place", err)
	}
	if st, err := seat.State(ctx); err != nil || st.State != sidecarapi.Asleep {
		t.Errorf("after the refusal: %+v, %v; want Asleep", st, err)
	}
}

// TestStoppedEngineAnswersAsAsleep: a restarted engine refuses requests
// other than the sleep API's and the health check until it is woken.
func TestStoppedEngineAnswersAsAsleep(t *testing.T) {
	eng, seat := start(t, v1alpha1.EngineSimulator)
	ctx := context.Background()
	if err := seat.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := seat.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/health", http.StatusOK},
		{http.MethodGet, "/is_sleeping", http.StatusOK},
		{http.MethodPost, "/v1/chat/completions", http.StatusServiceUnavailable},
	} {
		rec := httptest.NewRecorder()
		eng.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader("{}")))
		if rec.Code != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, rec.Code, c.want)
		}
	}
}
