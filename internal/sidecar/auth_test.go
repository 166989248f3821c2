package sidecar_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
	"github.com/model-orchestra/operator/internal/sidecarapi"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// TestSidecarRefusesForbiddenCalls puts an Ollama engine's sidecar to
// sleep and wakes it through the one sidecar client, as the lifecycle
// leader does: without the release's caller token mounted every sleep,
// wake and restart is refused (503), with another token too (401), and
// the engine is never touched; the reads stay open; with the token the
// same calls go through.
func TestSidecarRefusesForbiddenCalls(t *testing.T) {
	engine := enginetest.NewOllama("tiny")
	defer engine.Close()
	cfg := agent.Default().Sidecar
	cfg.Engine = sidecar.EngineConfig{Kind: v1alpha1.EngineOllama, URL: engine.URL(), Model: "tiny", KeepAlive: "5m", PollInterval: cfg.Engine.PollInterval}
	cfg.SleepTimeout, cfg.WakeTimeout, cfg.DrainTimeout = 10*time.Second, 10*time.Second, 10*time.Second
	dir := t.TempDir()
	cfg.CallerTokenFile = filepath.Join(dir, "token")
	e, err := sidecar.NewEngine(cfg.Engine, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sc := sidecar.New(cfg, e, reg, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	sc.Sync(ctx)
	srv := httptest.NewServer(sc.Handler(reg))
	defer srv.Close()

	leaderToken := filepath.Join(dir, "leader-token")
	if err := os.WriteFile(leaderToken, []byte("the-release-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	leader := sidecarapi.Client{URL: srv.URL, Token: nodeapi.TokenFile(leaderToken)}
	calls := map[string]func() error{
		"sleep":   func() error { return leader.Sleep(ctx, 1) },
		"wake":    func() error { return leader.Wake(ctx) },
		"restart": func() error { return leader.Restart(ctx) },
	}
	refused := func(when string, status int, says string) {
		t.Helper()
		for op, call := range calls {
			var se *sidecarapi.Error
			if err := call(); !errors.As(err, &se) || se.Status != status || !strings.Contains(se.Message, says) {
				t.Errorf("%s %s: %v; want %d saying %q", when, op, err, status, says)
			}
		}
		if st, err := leader.State(ctx); err != nil || st.State != sidecarapi.Awake {
			t.Errorf("%s GET /state: %+v, %v; want it open, the engine Awake and untouched", when, st, err)
		}
		if ka := engine.KeepAlive("tiny"); ka != float64(-1) && ka != -1 {
			t.Errorf("%s the engine was touched: keep_alive %v", when, ka)
		}
	}

	refused("before the sidecar's token is mounted,", http.StatusServiceUnavailable, "no caller token")
	if err := os.WriteFile(cfg.CallerTokenFile, []byte("another-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused("with another token,", http.StatusUnauthorized, "only the release's lifecycle leader")
	anonymous := sidecarapi.Client{URL: srv.URL}
	if err := anonymous.Sleep(ctx, 1); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a sleep without any token: %v; want 401", err)
	}

	if err := os.WriteFile(cfg.CallerTokenFile, []byte("the-release-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := leader.SleepStatus(ctx, 1); err != nil || st.State != sidecarapi.Asleep {
		t.Fatalf("the leader's sleep with the release's token: %+v, %v; want Asleep", st, err)
	}
	if st, err := leader.WakeStatus(ctx); err != nil || st.State != sidecarapi.Awake {
		t.Fatalf("the leader's wake with the release's token: %+v, %v; want Awake", st, err)
	}
}
