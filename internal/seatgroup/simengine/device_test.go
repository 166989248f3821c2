package simengine_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/seatgroup/simengine"
	"github.com/model-orchestra/operator/internal/sim"
)

// post sends an empty POST to url and returns the status and body.
func post(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Two engines of one seat-group pod on one shared device with room for one
// model's weights: an engine that leaks its memory at sleep (vllm#47654)
// keeps the other from waking until it is restarted.
func TestSharedDeviceLeakBlocksTheNextWakeUntilRestart(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	path := filepath.Join(t.TempDir(), "device")
	engine := func(model string, leak bool) (*simengine.Engine, string) {
		dev, err := arena.OpenSharedDevice(path, weights, model)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dev.Close)
		cfg := sim.Default()
		cfg.Model = model
		cfg.Weights = sim.Weights{Bytes: weights, Seed: 7}
		cfg.Sleep = sim.Sleep{Enabled: true, HotDir: t.TempDir()}
		cfg.Faults.SleepLeak = leak
		eng, err := simengine.New(cfg, log, sim.WithDevice(dev))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(eng.Close)
		srv := httptest.NewServer(eng)
		t.Cleanup(srv.Close)
		return eng, srv.URL
	}
	delta, deltaURL := engine("delta", true)
	alpha, alphaURL := engine("alpha", false)

	if n, _ := alpha.ResidentBytes(context.Background()); n != 0 {
		t.Fatalf("alpha holds %d bytes at start; the device is delta's, so alpha should start asleep", n)
	}
	if n, _ := delta.ResidentBytes(context.Background()); n != weights {
		t.Fatalf("delta holds %d bytes at start, want %d", n, weights)
	}

	if code, body := post(t, deltaURL+"/sleep?level=1"); code != http.StatusOK {
		t.Fatalf("delta's sleep: %d %s", code, body)
	}
	code, body := post(t, alphaURL+"/wake_up")
	if code == http.StatusOK || !strings.Contains(body, "device memory exhausted: need 4MiB, free 0 of 4MiB, held by delta (4MiB)") {
		t.Fatalf("alpha's wake while delta leaks: %d %s; want device memory exhausted, held by delta", code, body)
	}

	if code, body := post(t, deltaURL+simengine.RestartPath); code != http.StatusOK {
		t.Fatalf("delta's restart: %d %s", code, body)
	}
	if code, body := post(t, alphaURL+"/wake_up"); code != http.StatusOK {
		t.Fatalf("alpha's wake after delta's restart: %d %s", code, body)
	}
	if n, _ := alpha.ResidentBytes(context.Background()); n != weights {
		t.Errorf("awake alpha holds %d bytes, want %d", n, weights)
	}
}
