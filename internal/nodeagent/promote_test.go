package nodeagent_test

import (
	"context"
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
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sim"
)

// TestNodePromotesAheadOfAPredictedWake: an engine whose weights were
// demoted to the warm tier sleeps at level 2; the leader has reported
// three wakes an hour apart (POST /wakes), so the next is predicted in a
// moment, closer than the warm → hot copy and its margin take. The agent's
// promotion loop copies the weights into the hot tier, verified, before
// that wake, within the hot budget; the report and the metric say so; and
// the engine's wake then reads the hot copy, not the warm one.
func TestNodePromotesAheadOfAPredictedWake(t *testing.T) {
	const ns, name = "team-a", "orch-chat"
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 3 << 20, Warm: 8 << 20},
		},
		MeasureBytes: 1 << 20, RuntimeVersion: "containerd://1.6.20",
		PromoteInterval: 20 * time.Millisecond, PromoteMargin: 10 * time.Second,
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.Measure(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.Promote(ctx)
	srv := httptest.NewServer(n.Handler(reg))
	defer srv.Close()
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// A sleeping engine whose only copy is the agent's warm one: level 1,
	// demoted by the agent, woken (from the offload) and put back to sleep
	// at level 2, as the leader's demotion does.
	sc := sim.Default()
	sc.TimeToFirstToken, sc.InterTokenLatency, sc.OutputTokens = 0, 0, 4
	sc.Weights.Bytes, sc.Weights.Name = 2<<20, name
	sc.Sleep = sim.Sleep{Enabled: true, HotDir: filepath.Join(cfg.Store.HotDir, ns), WarmDir: filepath.Join(cfg.Store.WarmDir, ns)}
	for _, d := range []string{sc.Sleep.HotDir, sc.Sleep.WarmDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	engine := sim.New(sc)
	if err := engine.LoadWeights(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(engine.Close)
	digest := engine.WeightsStatus().Digest
	if _, err := engine.Sleep(1); err != nil {
		t.Fatal(err)
	}
	if code, out := post("/demote", `{"namespace":"`+ns+`","name":"`+name+`","digest":"`+digest+`"}`); code != 200 {
		t.Fatalf("demotion: %d %s", code, out)
	}
	if _, err := engine.WakeUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Sleep(2); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Store().Lookup(nodeapi.Key{Namespace: ns, Name: name}, v1alpha1.TierHot); ok {
		t.Fatal("a hot copy exists before any wake was predicted")
	}

	// A bad record is refused; three hourly wakes predict the next one
	// five seconds from now, within the margin: the promotion is due at
	// once, and the prediction stays ahead until the test's end (with one
	// second, three history writes on a busy disk outlived it).
	if code, out := post("/wakes", `{"namespace":"`+ns+`","name":"../x","time":"2026-01-01T00:00:00Z"}`); code != 400 {
		t.Errorf("a wake record with a bad name: %d %s, want 400", code, out)
	}
	next := time.Now().Add(5 * time.Second)
	for i := 3; i >= 1; i-- {
		rec := nodeapi.WakeRecord{Key: nodeapi.Key{Namespace: ns, Name: name}, Time: next.Add(-time.Duration(i) * time.Hour), Tier: v1alpha1.TierWarm, Bytes: 2 << 20, Digest: digest}
		b, _ := json.Marshal(rec)
		if code, out := post("/wakes", string(b)); code != 204 {
			t.Fatalf("recording a wake: %d %s", code, out)
		}
	}
	var hot nodeapi.Entry
	eventually(t, 5*time.Second, func() error {
		e, ok := n.Store().Lookup(nodeapi.Key{Namespace: ns, Name: name}, v1alpha1.TierHot)
		if !ok {
			return fmt.Errorf("no hot copy yet; report %+v", n.Report().Promotion)
		}
		hot = e
		return nil
	})
	if time.Now().After(next) {
		t.Errorf("the hot copy was placed %v after the predicted wake", time.Since(next))
	}
	if hot.Digest != digest || hot.VerifiedAt.IsZero() || hot.Bytes != 2<<20 {
		t.Errorf("hot copy %+v; want the weights' %d bytes, verified against %s", hot, 2<<20, digest)
	}
	rep := n.Report()
	if len(rep.Promotion.Done) != 1 || rep.Promotion.Done[0].From != v1alpha1.TierWarm || rep.Promotion.Done[0].To != v1alpha1.TierHot ||
		rep.Promotion.Done[0].Error != "" || rep.Promotion.Done[0].Wake.Pattern != nodeapi.PatternPeriodic {
		t.Errorf("report's promotions %+v; want one periodic warm → hot", rep.Promotion.Done)
	}
	if len(rep.Promotion.Predictions) != 1 || rep.Promotion.Predictions[0].Next.Sub(next).Abs() > time.Millisecond {
		t.Errorf("report's predictions %+v; want the wake at %v", rep.Promotion.Predictions, next)
	}
	if rep.Hot.UsedBytes > rep.Hot.BudgetBytes {
		t.Errorf("the hot tier holds %d bytes, over its budget of %d", rep.Hot.UsedBytes, rep.Hot.BudgetBytes)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := `orchestra_agent_ahead_promotions_total{from="Warm",result="ok",to="Hot"} 1`; !strings.Contains(string(b), want) {
		t.Errorf("metrics lack %s", want)
	}

	// The wake reads the promoted hot copy.
	st, err := engine.WakeUp(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tier != v1alpha1.TierHot || st.Bytes != 2<<20 {
		t.Errorf("the wake read %d bytes from the %s tier (%s); want the promoted hot copy", st.Bytes, st.Tier, st.Source)
	}

	// The histories survive a restart of the agent.
	n2, err := nodeagent.NewNode(cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n2.PromoteAhead()
	if p := n2.Report().Promotion.Predictions; len(p) != 1 || p[0].Wakes != 3 {
		t.Errorf("after a restart the agent predicts %+v; want the wake predicted from the 3 recorded", p)
	}
}

// TestNodeLearnsFromSleeps: the leader reports sleeps (POST /sleeps) beside
// the wakes. While the engines are awake nothing is predicted; once they
// fall asleep again, the steady time from a sleep to the next wake predicts
// the next wake, and the sleeps survive a restart of the agent.
func TestNodeLearnsFromSleeps(t *testing.T) {
	cfg := nodeagent.NodeConfig{Store: nodeagent.StoreConfig{
		HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
		Budgets: nodeapi.Budgets{Hot: 3 << 20, Warm: 8 << 20},
	}, RuntimeVersion: "containerd://1.6.20"}
	n, srv := serveNode(t, cfg)
	post := func(path string, rec any) (int, string) {
		t.Helper()
		b, _ := json.Marshal(rec)
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	key := nodeapi.Key{Namespace: "team-a", Name: "orch-chat"}
	now := time.Now()
	m := time.Minute
	if code, out := post("/sleeps", nodeapi.SleepRecord{Key: key, Time: now, Level: 3}); code != 400 || !strings.Contains(out, "level") {
		t.Errorf("a sleep at level 3: %d %s, want 400 naming the level", code, out)
	}
	if code, out := post("/sleeps", nodeapi.SleepRecord{Key: nodeapi.Key{Namespace: "team-a", Name: "../x"}, Time: now}); code != 400 {
		t.Errorf("a sleep with a bad name: %d %s, want 400", code, out)
	}
	// Busy 5, 40 and 15 minutes, back 20 minutes after each sleep.
	for _, w := range []time.Duration{-140 * m, -115 * m, -55 * m} {
		if code, out := post("/wakes", nodeapi.WakeRecord{Key: key, Time: now.Add(w)}); code != 204 {
			t.Fatalf("recording a wake: %d %s", code, out)
		}
	}
	for _, s := range []time.Duration{-135 * m, -75 * m} {
		if code, out := post("/sleeps", nodeapi.SleepRecord{Key: key, Time: now.Add(s), Level: 2}); code != 204 {
			t.Fatalf("recording a sleep: %d %s", code, out)
		}
	}
	n.PromoteAhead()
	if p := n.Report().Promotion.Predictions; len(p) != 0 {
		t.Errorf("awake since its last wake, the agent predicts %+v; want nothing", p)
	}

	asleep := now.Add(-20*m + time.Second)
	if code, out := post("/sleeps", nodeapi.SleepRecord{Key: key, Time: asleep, Level: 2}); code != 204 {
		t.Fatalf("recording a sleep: %d %s", code, out)
	}
	want := nodeapi.Prediction{Next: asleep.Add(20 * m), Pattern: nodeapi.PatternAfterSleep, Period: 20 * m}
	for _, node := range []*nodeagent.Node{n, restarted(t, cfg)} {
		node.PromoteAhead()
		p := node.Report().Promotion.Predictions
		if len(p) != 1 || !p[0].Next.Equal(want.Next) || p[0].Pattern != want.Pattern || p[0].Period != want.Period {
			t.Errorf("asleep, the agent predicts %+v; want %+v", p, want)
		}
	}

	// The histories cannot be written: the agent's failure, not the caller's.
	histories := filepath.Join(cfg.Store.WarmDir, ".wakes.json")
	if err := os.Remove(histories); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(histories, 0o700); err != nil {
		t.Fatal(err)
	}
	if code, out := post("/wakes", nodeapi.WakeRecord{Key: key, Time: now}); code != 500 || !strings.Contains(out, "persisting the wake histories") {
		t.Errorf("a wake the agent cannot persist: %d %s, want 500 naming the histories", code, out)
	}
}
