package checkpoint_test

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
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/checkpoint/arena"
)

func TestNodePromoteReportAndEvict(t *testing.T) {
	cold := t.TempDir()
	w := make([]byte, 1<<20)
	arena.Synthesize(w, 3)
	if err := os.WriteFile(filepath.Join(cold, "model.gguf"), w, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := checkpoint.NodeConfig{
		Store: checkpoint.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: checkpoint.Budgets{Hot: 3 << 20, Warm: 8 << 20},
		},
		ColdDir: cold, MeasureBytes: 1 << 20, RuntimeVersion: "containerd://1.6.20",
	}
	reg := prometheus.NewRegistry()
	n, err := checkpoint.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
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
		`{"namespace":"team-a","name":"big","to":"hot","coldPath":"model.gguf","digest":"xxh3c:0000000000000000"}`: 500,
	} {
		if code, out := promote(body); code != want {
			t.Errorf("%s: %d %s, want %d", body, code, out, want)
		}
	}

	resp, err := http.Get(srv.URL + "/report")
	if err != nil {
		t.Fatal(err)
	}
	var r checkpoint.NodeReport
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
	for _, want := range []string{`orchestra_agent_tier_bytes{tier="hot"} 0`, `orchestra_agent_promotions_total{result="mismatch",tier="hot"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestNodeDemotesTheEngineOffloadOverHTTP: POST /demote turns an engine's
// level-1 offload in the hot tier into a verified warm copy; bytes that do
// not hash to the engine's digest are refused (409) and placed nowhere.
func TestNodeDemotesTheEngineOffloadOverHTTP(t *testing.T) {
	cfg := checkpoint.NodeConfig{
		Store: checkpoint.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: checkpoint.Budgets{Hot: 4 << 20, Warm: 4 << 20},
		},
		RuntimeVersion: "containerd://1.6.20",
	}
	reg := prometheus.NewRegistry()
	n, err := checkpoint.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
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
	if err := os.WriteFile(filepath.Join(cfg.Store.HotDir, "team-a", checkpoint.EngineOffloadName("orch-chat")), w, 0o600); err != nil {
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
	var res checkpoint.DemoteResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Source != checkpoint.DemoteFromEngine || res.Tier != checkpoint.TierWarm || res.Digest != arena.Sum(w).String() || res.Bytes != int64(len(w)) {
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
	cfg := checkpoint.NodeConfig{
		Store: checkpoint.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: checkpoint.Budgets{Hot: 4 << 20, Warm: 4 << 20},
		},
		ColdDir: cold, RuntimeVersion: "containerd://1.6.20", VerifyInterval: time.Hour,
	}
	reg := prometheus.NewRegistry()
	n, err := checkpoint.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	key := checkpoint.Key{Namespace: "team-a", Name: "m"}
	if _, err := n.Store().Promote(key, checkpoint.TierWarm, filepath.Join(cold, "model.gguf"), arena.Sum(w).String(), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.Store().Path(key, checkpoint.TierWarm), make([]byte, len(w)), 0o600); err != nil {
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
