package checkpoint_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestNodeAgentRefusesForbiddenCalls tries each of the node agent's
// mutating calls without the release's caller token, with another token,
// and before the token is mounted: each is refused and changes nothing.
// With the token, a process snapshot of a process that is not an engine's
// is refused too.
func TestNodeAgentRefusesForbiddenCalls(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	cfg := checkpoint.NodeConfig{
		Store: checkpoint.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: checkpoint.Budgets{Hot: 1 << 20, Warm: 1 << 20},
		},
		RuntimeVersion: "containerd://1.6.20", CRIU: fakeCRIU(t, "Looks good.", 0), SnapshotDir: t.TempDir(),
		CallerTokenFile: tokenFile,
	}
	reg := prometheus.NewRegistry()
	n, err := checkpoint.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.Measure(context.Background())
	srv := httptest.NewServer(n.Handler(reg))
	defer srv.Close()

	self := strconv.Itoa(os.Getpid()) // the test binary: not an engine
	calls := []struct{ method, path, body string }{
		{"POST", "/promote", `{"namespace":"ns","name":"m","to":"hot"}`},
		{"POST", "/demote", `{"namespace":"ns","name":"m"}`},
		{"POST", "/wakes", `{"namespace":"ns","name":"m"}`},
		{"POST", "/sleeps", `{"namespace":"ns","name":"m"}`},
		{"POST", "/verify", ``},
		{"POST", "/promote-ahead", ``},
		{"POST", "/snapshots/ns/m?pid=" + self, ``},
		{"POST", "/snapshots/ns/m/restore", ``},
		{"DELETE", "/tiers/hot/ns/m", ``},
	}
	do := func(method, path, body, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			nodeapi.Authorize(req, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	for _, c := range calls {
		if code, body := do(c.method, c.path, c.body, "anything"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no caller token") {
			t.Errorf("%s %s before the token is mounted: %d %s, want 503", c.method, c.path, code, body)
		}
	}
	if err := os.WriteFile(tokenFile, []byte("release-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		for _, tok := range []string{"", "another-release-token"} {
			if code, body := do(c.method, c.path, c.body, tok); code != http.StatusUnauthorized || !strings.Contains(body, "only the release's lifecycle leader") {
				t.Errorf("%s %s with token %q: %d %s, want 401", c.method, c.path, tok, code, body)
			}
		}
	}
	if code, body := do("POST", "/snapshots/ns/m?pid="+self, "", "release-token"); code != http.StatusForbidden || !strings.Contains(body, "not an engine's serving process") {
		t.Errorf("a snapshot of the test process (not an engine): %d %s, want 403", code, body)
	}
	if code, body := do("GET", "/report", "", ""); code != http.StatusOK {
		t.Errorf("GET /report without a token: %d %s, want 200 (reads stay open)", code, body)
	}
	if code, body := do("DELETE", "/tiers/hot/ns/m", "", "release-token"); code != http.StatusNotFound {
		t.Errorf("DELETE with the release's token: %d %s, want 404 (passes the check, nothing to delete)", code, body)
	}
}
