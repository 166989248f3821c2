package nodeagent_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/engineproc"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestNodeAgentRefusesForbiddenCalls tries each of the node agent's
// mutating calls without the release's caller token, with another token,
// and before the token is mounted: each is refused and changes nothing.
// With the token, a call on another namespace's copies is refused, and so
// is a process snapshot of a process that is not an engine's, or of an
// engine's that does not run in a container of a pod of the release.
func TestNodeAgentRefusesForbiddenCalls(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets:   nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20},
			Namespace: "ns", // the chart's --namespace
		},
		RuntimeVersion: "containerd://1.6.20", CRIU: fakeCRIU(t, "Looks good.", 0), SnapshotDir: t.TempDir(),
		CallerTokenFile: tokenFile, Release: "rel", NodeName: "node-a",
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
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
	// The release's token does not open another namespace's copies.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/promote", `{"namespace":"other","name":"m","to":"hot"}`},
		{"POST", "/demote", `{"namespace":"other","name":"m"}`},
		{"POST", "/wakes", `{"namespace":"other","name":"m"}`},
		{"POST", "/sleeps", `{"namespace":"other","name":"m"}`},
		{"POST", "/snapshots/other/m?pid=" + self, ``},
		{"POST", "/snapshots/other/m/restore", ``},
		{"DELETE", "/tiers/hot/other/m", ``},
	} {
		if code, body := do(c.method, c.path, c.body, "release-token"); code != http.StatusForbidden || !strings.Contains(body, "not this agent's namespace") {
			t.Errorf("%s %s (namespace other) with the release's token: %d %s, want 403", c.method, c.path, code, body)
		}
	}

	// An engine's serving process (by its command line) that runs in a
	// pod of another release, in no pod, or in our pod's sandbox: 403.
	engine := exec.Command("sleep", "60")
	engine.Args[0] = "/orchestra-sim"
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = engine.Process.Kill(); _ = engine.Wait() }()
	pid := strconv.Itoa(engine.Process.Pid)
	const ourUID, otherUID = "6f1c2a4e-0b7d-4c1e-9a51-3d2f8e7b6a10", "0aa3c0de-51b2-4e8f-b7c4-9e0d1f2a3b4c"
	cid := strings.Repeat("ab", 32)
	procRoot := t.TempDir()
	setCgroup := func(text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(procRoot, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(procRoot, pid, "cgroup"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n.SetProcessOwner(nodeagent.ReleaseProcesses{Proc: engineproc.ProcFS{Root: procRoot}, Pods: podList{
		{Name: "m-0", UID: ourUID, Containers: map[string]string{cid: "engine"}},
	}})
	for name, cg := range map[string]string{
		"a pod of another release": "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(otherUID, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n",
		"no pod (a host process)":  "0::/system.slice/containerd.service\n",
		"our pod's sandbox":        "0::/kubepods/burstable/pod" + ourUID + "/" + strings.Repeat("cd", 32) + "\n",
	} {
		setCgroup(cg)
		if code, body := do("POST", "/snapshots/ns/m?pid="+pid, "", "release-token"); code != http.StatusForbidden || !strings.Contains(body, "not a process of this release's engines") {
			t.Errorf("a snapshot of an engine process in %s: %d %s, want 403", name, code, body)
		}
	}
	// In a container of our pod, the check passes and criu runs (the fake
	// criu writes no images, so the dump itself fails with 500).
	setCgroup("0::/kubepods/burstable/pod" + ourUID + "/" + cid + "\n")
	if code, body := do("POST", "/snapshots/ns/m?pid="+pid, "", "release-token"); code == http.StatusForbidden || code == http.StatusUnauthorized {
		t.Errorf("a snapshot of our engine's process: %d %s, want it past the checks", code, body)
	}

	if code, body := do("GET", "/report", "", ""); code != http.StatusOK {
		t.Errorf("GET /report without a token: %d %s, want 200 (reads stay open)", code, body)
	}
	if code, body := do("DELETE", "/tiers/hot/ns/m", "", "release-token"); code != http.StatusNotFound {
		t.Errorf("DELETE with the release's token: %d %s, want 404 (passes the check, nothing to delete)", code, body)
	}
}

// podList is a fixed list of the release's pods on the node.
type podList []nodeagent.ReleasePod

func (p podList) ReleasePods(context.Context) ([]nodeagent.ReleasePod, error) { return p, nil }
