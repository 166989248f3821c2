package nodeagent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
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

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/s3cred"
	"github.com/model-orchestra/operator/internal/fetch/s3test"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// s3Credentials writes a credentials directory as the agent chart mounts
// an application's credentials Secret.
func s3Credentials(t *testing.T, access string) string {
	t.Helper()
	dir := t.TempDir()
	for name, v := range map[string]string{s3cred.AccessKeyName: access + "\n", s3cred.SecretKeyName: "s3cr3t\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestNodePromotesFromTheS3ColdTier runs the node agent against the S3
// fake: a POST /promote naming the application's S3 source copies the
// object into the warm tier, verified against the digest, and the report
// shows the rate; a corrupted object places nothing; missing credentials, a
// refused key and a missing object fail with what is wrong; a promotion
// ahead of a predicted wake reads S3 too.
func TestNodePromotesFromTheS3ColdTier(t *testing.T) {
	s3 := s3test.New("AKTEST")
	t.Cleanup(s3.Close)
	w := make([]byte, 1<<20+123)
	arena.Synthesize(w, 7)
	s3.Put("models", "llama/weights.bin", fetchtest.Bytes(w))
	digest := arena.Sum(w).String()

	good := s3Credentials(t, "AKTEST")
	src := func(name, url, creds string) nodeagent.ColdS3Source {
		return nodeagent.ColdS3Source{Name: name, URL: url, Endpoint: s3.URL(), Credentials: creds}
	}
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 4 << 20, Warm: 4 << 20},
		},
		ColdS3: []nodeagent.ColdS3Source{
			src("chat", "s3://models/llama/weights.bin", good),
			src("nocreds", "s3://models/llama/weights.bin", t.TempDir()),
			src("refused", "s3://models/llama/weights.bin", s3Credentials(t, "OTHER")),
			src("gone", "s3://models/llama/absent.bin", good),
		},
		MeasureBytes: 1 << 20, RuntimeVersion: "containerd://1.6.20", PromoteMargin: time.Minute,
	}
	if err := (agent.Config{Role: agent.RoleNode, Addr: ":0", Node: cfg}).Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.Measure(t.Context()) // the warm tier's read rate plans the promotions ahead
	srv := httptest.NewServer(n.Handler(reg))
	t.Cleanup(srv.Close)
	promote := func(name, source, digest string) (int, string) {
		t.Helper()
		body := fmt.Sprintf(`{"namespace":"team-a","name":%q,"to":"warm","coldS3":%q,"digest":%q}`, name, source, digest)
		resp, err := http.Post(srv.URL+"/promote", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	warmFile := func(name string) string { return filepath.Join(cfg.Store.WarmDir, "team-a", name) }
	coldReport := func(source string) nodeapi.ColdReport {
		t.Helper()
		for _, c := range n.Report().Cold {
			if c.Source == source {
				return c
			}
		}
		t.Fatalf("the report lists no cold source %q: %+v", source, n.Report().Cold)
		return nodeapi.ColdReport{}
	}

	if code, body := promote("chat", "chat", digest); code != http.StatusOK {
		t.Fatalf("promoting from S3: %d %s", code, body)
	}
	if got, err := os.ReadFile(warmFile("chat")); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("the warm copy is not the object's bytes (err %v)", err)
	}
	e, ok := n.Store().Lookup(nodeapi.Key{Namespace: "team-a", Name: "chat"}, v1alpha1.TierWarm)
	if !ok || e.Digest != digest || e.Bytes != int64(len(w)) {
		t.Errorf("warm entry %+v, want %d bytes with digest %s", e, len(w), digest)
	}
	c := coldReport("chat")
	if c.Kind != nodeapi.ColdS3 || !strings.Contains(c.Location, "s3://models/llama/weights.bin") || c.Read == nil ||
		c.Read.Bytes != int64(len(w)) || c.Read.BytesPerSecond <= 0 || c.LastError != "" {
		t.Errorf("report of the S3 cold source: %+v (read %+v)", c, c.Read)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(metrics), `orchestra_agent_read_bytes_per_second{tier="cold/chat"}`) {
		t.Errorf("the metrics carry no read rate of the S3 cold source:\n%s", metrics)
	}

	// A corrupted object: the copy does not hash to the digest, nothing is
	// placed, and the report says why.
	bad := bytes.Clone(w)
	bad[len(bad)/2] ^= 0xff
	s3.Put("models", "llama/weights.bin", fetchtest.Bytes(bad))
	code, body := promote("chat2", "chat", digest)
	if code != http.StatusConflict || !strings.Contains(body, "mismatch") || !strings.Contains(body, digest) {
		t.Errorf("promoting a corrupted object: %d %s, want a 409 naming the mismatch and the digest", code, body)
	}
	if _, err := os.Stat(warmFile("chat2")); !os.IsNotExist(err) {
		t.Errorf("a corrupted object placed a warm copy (stat: %v)", err)
	}
	if left, _ := filepath.Glob(filepath.Join(cfg.Store.WarmDir, "team-a", ".chat2.tmp-*")); len(left) > 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
	if c := coldReport("chat"); !strings.Contains(c.LastError, "mismatch") {
		t.Errorf("the report's last error %q does not name the mismatch", c.LastError)
	}
	s3.Put("models", "llama/weights.bin", fetchtest.Bytes(w))

	for _, tc := range []struct {
		name, source, digest string
		code                 int
		says                 []string
	}{
		{"no credentials", "nocreds", digest, http.StatusForbidden, []string{"no S3 credentials", "AWS_ACCESS_KEY_ID is missing", "credentialsSecretRef"}},
		{"refused key", "refused", digest, http.StatusForbidden, []string{"s3://models/llama/weights.bin", "403", "access denied"}},
		{"missing object", "gone", digest, http.StatusNotFound, []string{"s3://models/llama/absent.bin", "404", "not found"}},
		{"unknown source", "other", digest, http.StatusBadRequest, []string{`no S3 cold source`, "other"}},
		{"no digest", "chat", "", http.StatusBadRequest, []string{"needs the digest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := promote("x-"+tc.source, tc.source, tc.digest)
			if code != tc.code {
				t.Errorf("%d %s, want %d", code, body, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(body, s) {
					t.Errorf("%s does not say %q", body, s)
				}
			}
			if _, err := os.Stat(warmFile("x-" + tc.source)); !os.IsNotExist(err) {
				t.Errorf("a failed promotion placed a warm copy (stat: %v)", err)
			}
		})
	}

	// Ahead of a predicted wake: three hourly wakes name the S3 source, the
	// next is a second away, and the plan copies the object from S3.
	now := time.Now()
	for i := 3; i >= 1; i-- {
		rec := nodeapi.WakeRecord{Key: nodeapi.Key{Namespace: "team-a", Name: "ahead"}, Time: now.Add(-time.Duration(i)*time.Hour + time.Second),
			Tier: v1alpha1.TierWarm, Bytes: int64(len(w)), Digest: digest, ColdS3: "chat"}
		if err := n.RecordWake(rec); err != nil {
			t.Fatal(err)
		}
	}
	done := n.PromoteAhead()
	if len(done) != 1 || done[0].From != v1alpha1.TierCold || done[0].To != v1alpha1.TierWarm || done[0].Error != "" {
		t.Fatalf("promotions ahead: %+v (deferred %+v), want one from cold to warm", done, n.Report().Promotion.Deferred)
	}
	if got, err := os.ReadFile(warmFile("ahead")); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("the copy ahead of the wake is not the object's bytes (err %v)", err)
	}
	if r := n.Report(); r.Warm.UsedBytes > cfg.Store.Budgets.Warm {
		t.Errorf("warm tier holds %d bytes, over its budget %d", r.Warm.UsedBytes, cfg.Store.Budgets.Warm)
	}

	// An application without a warm tier (tiers.warm: None; the leader's
	// wakes say noWarm): the plan copies the object from S3 straight into
	// the hot tier and writes no warm copy, now or later.
	noWarm := nodeapi.Key{Namespace: "team-a", Name: "nowarm"}
	for i := 3; i >= 1; i-- {
		rec := nodeapi.WakeRecord{Key: noWarm, Time: now.Add(-time.Duration(i)*time.Hour + time.Second),
			Tier: v1alpha1.TierCold, Bytes: int64(len(w)), Digest: digest, ColdS3: "chat", NoWarm: true}
		b, _ := json.Marshal(rec)
		resp, err := http.Post(srv.URL+"/wakes", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("recording a wake: %d", resp.StatusCode)
		}
	}
	for range 2 {
		var mine []nodeapi.PromotionDone
		for _, d := range n.PromoteAhead() {
			if d.Key == noWarm {
				mine = append(mine, d)
			}
		}
		if _, hot := n.Store().Lookup(noWarm, v1alpha1.TierHot); !hot && len(mine) == 0 {
			t.Fatalf("no promotion ahead without a warm tier (deferred %+v)", n.Report().Promotion.Deferred)
		}
		for _, d := range mine {
			if d.From != v1alpha1.TierCold || d.To != v1alpha1.TierHot || d.Error != "" {
				t.Errorf("promotion ahead without a warm tier: %s from %s to %s (error %q), want cold to hot", d.Key, d.From, d.To, d.Error)
			}
		}
	}
	if got, err := os.ReadFile(filepath.Join(cfg.Store.HotDir, "team-a", "nowarm")); err != nil || !bytes.Equal(got, w) {
		t.Errorf("the hot copy without a warm tier is not the object's bytes (err %v)", err)
	}
	if _, err := os.Stat(warmFile("nowarm")); !os.IsNotExist(err) {
		t.Errorf("an application without a warm tier got a warm copy (stat: %v)", err)
	}
	// Its hot copy is marked, so that an eviction drops it rather than
	// demote it to the warm tier; the mark survives a restart of the agent.
	n2, err := nodeagent.NewNode(cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for i, node := range []*nodeagent.Node{n, n2} {
		var copies int
		for _, e := range node.Store().Entries() {
			if e.Key != noWarm {
				continue
			}
			copies++
			if e.Tier != v1alpha1.TierHot || !e.NoWarm {
				t.Errorf("agent %d: a copy of an application without a warm tier: %s tier, noWarm %v; want hot, marked noWarm", i, e.Tier, e.NoWarm)
			}
		}
		if copies != 1 {
			t.Errorf("agent %d: %d copies of an application without a warm tier, want its hot copy", i, copies)
		}
	}
}
