package nodeagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

func TestNodePromoteReportAndEvict(t *testing.T) {
	cold := t.TempDir()
	w := make([]byte, 1<<20)
	arena.Synthesize(w, 3)
	if err := os.WriteFile(filepath.Join(cold, "model.gguf"), w, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 3 << 20, Warm: 8 << 20},
		},
		ColdDir: cold, MeasureBytes: 1 << 20, RuntimeVersion: "containerd://1.6.20",
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.Measure(context.Background())
	srv := httptest.NewServer(n.Handler(reg))
	defer srv.Close()

	promote := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/promote", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	digest := arena.Sum(w).String()
	if code, body := promote(`{"namespace":"team-a","name":"m","to":"warm","coldPath":"model.gguf","digest":"` + digest + `"}`); code != 200 {
		t.Fatalf("cold→warm: %d %s", code, body)
	}
	if code, body := promote(`{"namespace":"team-a","name":"m","to":"hot"}`); code != 200 {
		t.Fatalf("warm→hot: %d %s", code, body)
	}
	hot, err := os.ReadFile(filepath.Join(cfg.Store.HotDir, "team-a", "m"))
	if err != nil || !bytes.Equal(hot, w) {
		t.Fatalf("hot copy: %v", err)
	}
	for body, want := range map[string]int{
		`{"namespace":"team-a","name":"x","to":"warm","coldPath":"../../etc/passwd"}`:                              400,
		`{"namespace":"Team","name":"x","to":"warm"}`:                                                              400,
		`{"namespace":"team-a","name":"x","to":"cold"}`:                                                            400,
		`{"namespace":"team-a","name":"absent","to":"hot"}`:                                                        404,
		`{"namespace":"team-a","name":"big","to":"hot","coldPath":"model.gguf","digest":"xxh3c:0000000000000000"}`: 409,
		`{"namespace":"team-a","name":"dir","to":"warm","coldPath":".","digest":"` + digest + `"}`:                 500,
	} {
		if code, out := promote(body); code != want {
			t.Errorf("%s: %d %s, want %d", body, code, out, want)
		}
	}

	resp, err := http.Get(srv.URL + "/report")
	if err != nil {
		t.Fatal(err)
	}
	var r nodeapi.NodeReport
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if r.Hot.UsedBytes != 1<<20 || r.Warm.UsedBytes != 1<<20 || r.Hot.Entries != 1 {
		t.Errorf("report tiers: hot %+v warm %+v", r.Hot, r.Warm)
	}
	if r.Memcpy == nil || r.Memcpy.BytesPerSecond <= 0 || r.Warm.Read == nil || r.Hot.Read == nil {
		t.Errorf("report bandwidths missing: %+v %+v %+v", r.Memcpy, r.Hot.Read, r.Warm.Read)
	}
	if r.Runtime.CheckpointSupported || !strings.Contains(r.Runtime.Reason, "containerd 1.6.20 does not implement") {
		t.Errorf("runtime report %+v", r.Runtime)
	}
	if r.ProcessSnapshots || r.ProcessSnapshotsReason == "" {
		t.Errorf("process snapshots %v (%q), want refused with a reason", r.ProcessSnapshots, r.ProcessSnapshotsReason)
	}

	req, _ := http.NewRequest("DELETE", srv.URL+"/tiers/hot/team-a/m", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	resp, _ = http.Get(srv.URL + "/metrics")
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{`orchestra_agent_tier_bytes{tier="Hot"} 0`, `orchestra_agent_promotions_total{result="mismatch",tier="Hot"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestNodeDemotesTheEngineOffloadOverHTTP: POST /demote turns an engine's
// level-1 offload in the hot tier into a verified warm copy; bytes that do
// not hash to the engine's digest are refused (409) and placed nowhere.
func TestNodeDemotesTheEngineOffloadOverHTTP(t *testing.T) {
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 4 << 20, Warm: 4 << 20},
		},
		RuntimeVersion: "containerd://1.6.20",
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(n.Handler(reg))
	defer srv.Close()
	w := make([]byte, 1<<20)
	arena.Synthesize(w, 5)
	if err := os.MkdirAll(filepath.Join(cfg.Store.HotDir, "team-a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Store.HotDir, "team-a", nodeapi.EngineOffloadName("orch-chat")), w, 0o600); err != nil {
		t.Fatal(err)
	}
	// The report counts the engine's offload in the hot tier's use.
	if rep := n.Report(); rep.Hot.EngineOffloadBytes != int64(len(w)) || rep.Hot.UsedBytes != int64(len(w)) || rep.Hot.Entries != 1 {
		t.Errorf("hot tier report %+v; want the %d bytes of the engine's offload used, as one entry", rep.Hot, len(w))
	}
	demote := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/demote", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for body, want := range map[string]int{
		`{"namespace":"team-a","name":"orch-chat"}`:                                       400, // no digest for the engine's offload
		`{"namespace":"team-a","name":"orch-chat","digest":"xxh3c:0000000000000000"}`:     409, // the bytes are not the engine's
		`{"namespace":"team-a","name":"absent","digest":"` + arena.Sum(w).String() + `"}`: 404,
		`{"namespace":"team-a","name":"../x","digest":"` + arena.Sum(w).String() + `"}`:   400,
	} {
		if code, out := demote(body); code != want {
			t.Errorf("%s: %d %s, want %d", body, code, out, want)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.Store.WarmDir, "team-a", "orch-chat")); err == nil {
		t.Fatal("a refused demotion left a warm copy")
	}
	code, out := demote(`{"namespace":"team-a","name":"orch-chat","digest":"` + arena.Sum(w).String() + `"}`)
	if code != 200 {
		t.Fatalf("demotion: %d %s", code, out)
	}
	var res nodeapi.DemoteResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Source != nodeapi.DemoteFromEngine || res.Tier != v1alpha1.TierWarm || res.Digest != arena.Sum(w).String() || res.Bytes != int64(len(w)) {
		t.Errorf("demotion result %+v, want a warm copy of the engine's offload with its digest", res)
	}
	got, err := os.ReadFile(filepath.Join(cfg.Store.WarmDir, "team-a", "orch-chat"))
	if err != nil || !bytes.Equal(got, w) {
		t.Errorf("warm copy: %v", err)
	}
	mfs, _ := reg.Gather()
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "orchestra_agent_demotions_total" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["ok"] != 1 || counts["mismatch"] != 1 {
		t.Errorf("orchestra_agent_demotions_total %v, want ok 1 and mismatch 1", counts)
	}
}

// A pass of the periodic verification shows in the report (the copy
// dropped, with the digests) and in the metrics.
func TestNodeVerifyReportsDroppedCopies(t *testing.T) {
	cold := t.TempDir()
	w := make([]byte, 1<<20)
	arena.Synthesize(w, 4)
	if err := os.WriteFile(filepath.Join(cold, "model.gguf"), w, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 4 << 20, Warm: 4 << 20},
		},
		ColdDir: cold, RuntimeVersion: "containerd://1.6.20", VerifyInterval: time.Hour,
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	key := nodeapi.Key{Namespace: "team-a", Name: "m"}
	if _, err := n.Store().Promote(t.Context(), key, v1alpha1.TierWarm, nodeagent.ColdFile(filepath.Join(cold, "model.gguf")), arena.Sum(w).String(), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.Store().Path(key, v1alpha1.TierWarm), make([]byte, len(w)), 0o600); err != nil {
		t.Fatal(err)
	}
	n.VerifyNow()
	rep := n.Report()
	v := rep.Verification
	if v.IntervalSeconds != 3600 || v.LastTime == nil || v.Copies != 1 || len(v.Dropped) != 1 ||
		v.Dropped[0].Key != key || v.Dropped[0].Digest != arena.Sum(w).String() || !v.Dropped[0].Dropped {
		t.Fatalf("verification report %+v; want one pass over one copy, the warm copy of %s dropped", v, key)
	}
	if rep.Warm.Entries != 0 {
		t.Errorf("the warm tier still lists %d entries", rep.Warm.Entries)
	}
	mfs, _ := reg.Gather()
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "orchestra_agent_verifications_total" {
			for _, m := range mf.GetMetric() {
				found = found || (m.GetCounter().GetValue() == 1 && strings.Contains(m.String(), "dropped"))
			}
		}
	}
	if !found {
		t.Error("orchestra_agent_verifications_total{result=\"dropped\"} is not 1")
	}
}

// TestNodeReadsItsRuntimeVersionFromItsNode: without --runtime-version the
// node agent reads its node's status.nodeInfo.containerRuntimeVersion from
// the API server (one get of its own Node), and the report names that
// version in the checkpoint verdict; a refused read leaves the version
// unknown and says why; --runtime-version overrides the node.
func TestNodeReadsItsRuntimeVersionFromItsNode(t *testing.T) {
	var (
		mu   sync.Mutex
		gets []string
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets = append(gets, r.Method+" "+r.URL.Path)
		mu.Unlock()
		switch r.URL.Path {
		case "/api/v1/nodes/n1":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},"status":{"nodeInfo":{"containerRuntimeVersion":"containerd://1.7.24"}}}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"Forbidden","code":403,"message":"nodes \"n2\" is forbidden"}`)
		}
	}))
	defer api.Close()
	reader, err := nodeagent.NewNodeRuntimeReader(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	measure := func(node, override string) nodeapi.RuntimeReport {
		t.Helper()
		cfg := nodeagent.NodeConfig{
			Store:    nodeagent.StoreConfig{HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"), Budgets: nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20}},
			NodeName: node, RuntimeVersion: override,
		}
		n, err := nodeagent.NewNode(cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		n.SetNodeRuntimeReader(reader, nil)
		return n.Measure(context.Background()).Runtime
	}

	r := measure("n1", "")
	if r.Version != "containerd://1.7.24" || r.Source != "node n1" || r.CheckpointSupported || !strings.Contains(r.Reason, "containerd 1.7.24 does not implement CRI CheckpointContainer") {
		t.Errorf("runtime read from node n1: %+v; want containerd://1.7.24 from the node, unsupported, naming 1.7.24", r)
	}
	mu.Lock()
	if len(gets) != 1 || gets[0] != "GET /api/v1/nodes/n1" {
		t.Errorf("API calls %v; want one get of the agent's own node", gets)
	}
	mu.Unlock()

	// Where containerd --version answers (not in the agent's image), it
	// is the fallback; otherwise the version is unknown and the reason
	// says why the node could not be read.
	if r := measure("n2", ""); r.Source == "" && (r.Version != "" || !strings.Contains(r.Reason, "version unknown") || !strings.Contains(r.Reason, "forbidden") || !strings.Contains(r.Reason, "grant the agent's ServiceAccount get on nodes")) {
		t.Errorf("runtime with the node read refused: %+v; want unknown, naming the refusal", r)
	}

	if _, err := reader.ContainerRuntimeVersion(context.Background(), "n2"); err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "grant the agent's ServiceAccount get on nodes") {
		t.Errorf("a refused read: %v; want it to name the refusal and the grant", err)
	}
	if r := measure("n1", "containerd://2.0.1"); r.Version != "containerd://2.0.1" || r.Source != "--runtime-version" || !r.CheckpointSupported {
		t.Errorf("runtime with an override: %+v; want the override, supported", r)
	}
}

// serveNode starts a node agent on cfg behind a test server, closed when
// the test ends.
func serveNode(t *testing.T, cfg nodeagent.NodeConfig) (*nodeagent.Node, *httptest.Server) {
	t.Helper()
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(n.Handler(reg))
	t.Cleanup(srv.Close)
	return n, srv
}

func restarted(t *testing.T, cfg nodeagent.NodeConfig) *nodeagent.Node {
	t.Helper()
	n, err := nodeagent.NewNode(cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNodesOfTwoNamespacesShareTheTierDirectories runs two agents over the
// same tier directories, each scoped to its namespace as the chart renders
// them: each fills its own budget without evicting the other's copies,
// counts only its own (and its engines' offloads), refuses the other
// namespace's keys with 403, and re-indexes only its own after a restart.
func TestNodesOfTwoNamespacesShareTheTierDirectories(t *testing.T) {
	cold := t.TempDir()
	w := make([]byte, 1<<20)
	arena.Synthesize(w, 5)
	if err := os.WriteFile(filepath.Join(cold, "model.gguf"), w, 0o600); err != nil {
		t.Fatal(err)
	}
	digest := arena.Sum(w).String()
	hot, warm := filepath.Join(t.TempDir(), "hot"), filepath.Join(t.TempDir(), "warm")
	cfg := func(ns string) nodeagent.NodeConfig {
		return nodeagent.NodeConfig{
			Store:   nodeagent.StoreConfig{HotDir: hot, WarmDir: warm, Namespace: ns, Budgets: nodeapi.Budgets{Hot: 2 << 20, Warm: 2 << 20}},
			ColdDir: cold, RuntimeVersion: "containerd://1.6.20",
		}
	}
	call := func(srv *httptest.Server, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	promote := func(srv *httptest.Server, ns, name string) (int, string) {
		return call(srv, "POST", "/promote", `{"namespace":"`+ns+`","name":"`+name+`","to":"hot","coldPath":"model.gguf","digest":"`+digest+`"}`)
	}
	a, srvA := serveNode(t, cfg("team-a"))
	b, srvB := serveNode(t, cfg("team-b"))
	for _, name := range []string{"a1", "a2"} {
		if code, body := promote(srvA, "team-a", name); code != 200 {
			t.Fatalf("team-a's agent, %s to hot: %d %s", name, code, body)
		}
	}
	// team-b's engine offload and copy: its own budget, none of team-a's evicted.
	if err := os.MkdirAll(filepath.Join(hot, "team-b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hot, "team-b", nodeapi.EngineOffloadName("b-engine")), w, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := promote(srvB, "team-b", "b1"); code != 200 {
		t.Fatalf("team-b's agent, b1 to hot beside team-a's full budget: %d %s", code, body)
	}
	for _, name := range []string{"a1", "a2"} {
		if _, err := os.Stat(filepath.Join(hot, "team-a", name)); err != nil {
			t.Errorf("team-a's %s after team-b's admission: %v", name, err)
		}
	}
	if ra, rb := a.Report().Hot, b.Report().Hot; ra.UsedBytes != 2<<20 || ra.Entries != 2 || rb.UsedBytes != 2<<20 || rb.EngineOffloadBytes != 1<<20 {
		t.Errorf("hot tier reports: team-a %+v, team-b %+v; want 2 MiB each, team-b's half its engine's offload", ra, rb)
	}

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/promote", `{"namespace":"team-a","name":"x","to":"hot","coldPath":"model.gguf","digest":"` + digest + `"}`},
		{"POST", "/demote", `{"namespace":"team-a","name":"a1","digest":"` + digest + `"}`},
		{"DELETE", "/tiers/hot/team-a/a1", ""},
		{"POST", "/wakes", `{"namespace":"team-a","name":"a1","time":"2026-11-27T08:00:00Z","tier":"hot"}`},
		{"POST", "/snapshots/team-a/a1?pid=1", ""},
	} {
		code, body := call(srvB, c.method, c.path, c.body)
		if code != http.StatusForbidden || !strings.Contains(body, `this agent keeps the copies of namespace \"team-b\" only`) {
			t.Errorf("team-b's agent, %s %s: %d %s; want 403 naming its namespace", c.method, c.path, code, body)
		}
	}
	if _, err := os.Stat(filepath.Join(hot, "team-a", "a1")); err != nil {
		t.Errorf("team-a's a1 after team-b's agent was asked to remove it: %v", err)
	}

	// Each keeps its own wake histories, in its namespace's warm directory.
	for _, c := range []struct {
		srv *httptest.Server
		ns  string
	}{{srvA, "team-a"}, {srvB, "team-b"}} {
		if code, body := call(c.srv, "POST", "/wakes", `{"namespace":"`+c.ns+`","name":"m","time":"2026-11-27T08:00:00Z","tier":"hot"}`); code != http.StatusNoContent {
			t.Fatalf("%s's wake report: %d %s", c.ns, code, body)
		}
		if _, err := os.Stat(filepath.Join(warm, c.ns, ".wakes.json")); err != nil {
			t.Errorf("%s's wake histories: %v", c.ns, err)
		}
	}
	if got := restarted(t, cfg("team-a")).Report().Hot; got.Entries != 2 || got.UsedBytes != 2<<20 {
		t.Errorf("team-a's agent restarted indexes %+v; want its two copies only", got)
	}
	var hs []nodeagent.WakeHistory
	if raw, err := os.ReadFile(filepath.Join(warm, "team-b", ".wakes.json")); err != nil || json.Unmarshal(raw, &hs) != nil || len(hs) != 1 || hs[0].Namespace != "team-b" {
		t.Errorf("team-b's wake histories %+v (%v); want its own one", hs, err)
	}

	// An agent keeping every namespace wrote its histories beside the
	// namespace directories: a scoped agent without a file of its own
	// starts from its namespace's of them.
	old, err := json.Marshal([]nodeagent.WakeHistory{
		{Key: nodeapi.Key{Namespace: "team-c", Name: "m"}, Wakes: []time.Time{time.Now().Add(-time.Hour)}, NoWarm: true},
		{Key: nodeapi.Key{Namespace: "team-d", Name: "m"}, Wakes: []time.Time{time.Now().Add(-time.Hour)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(warm, ".wakes.json"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	_, srvC := serveNode(t, cfg("team-c"))
	if code, body := call(srvC, "POST", "/wakes", `{"namespace":"team-c","name":"m","time":"`+time.Now().UTC().Format(time.RFC3339)+`","tier":"hot","noWarm":true}`); code != http.StatusNoContent {
		t.Fatalf("team-c's wake report: %d %s", code, body)
	}
	hs = nil
	if raw, err := os.ReadFile(filepath.Join(warm, "team-c", ".wakes.json")); err != nil || json.Unmarshal(raw, &hs) != nil || len(hs) != 1 || hs[0].Namespace != "team-c" || len(hs[0].Wakes) != 2 {
		t.Errorf("team-c's wake histories %+v (%v); want team-c/m with the shared file's wake and the new one", hs, err)
	}
}
