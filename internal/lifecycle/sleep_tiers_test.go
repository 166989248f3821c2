package lifecycle_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sim"
)

// TestSleepingEnginesAreDemotedAndWakeFromEachTier: after parkAfter asleep
// in the hot tier the weights are demoted (the node agent copies the
// engine's level-1 offload from its hot tier into its warm tier, verified
// against the engine's digest; the engine sleeps at level 2, releasing the
// hot copy) and the next request wakes them from the warm tier; with the
// warm copy gone the wake reads the cold tier. Each wake's bytes verify,
// the status names the tier, and the ModelCheckpoint records the copies.
// As on the chart, the agent has no cold tier to copy from (no coldPath).
func TestSleepingEnginesAreDemotedAndWakeFromEachTier(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	park := func(s *lifecycle.SleepConfig) { s.ParkAfter.Duration, s.ColdPath = 300*time.Millisecond, "" }
	p := newSleepPlane(t, planeOptions{sleep: park})
	p.startLeader("leader-a", p.config(park))

	p.asleep(2, v1alpha1.TierWarm)
	if _, err := os.Stat(filepath.Join(p.agentHot, ns, nodeapi.EngineOffloadName("demo-chat"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the engine's level-1 offload is still in the hot tier after the demotion: %v", err)
	}
	if c := p.agentMetric(`orchestra_agent_demotions_total{result="ok"}`); c != 1 {
		t.Errorf("orchestra_agent_demotions_total{result=ok} = %v, want the warm copy placed by the agent's demotion", c)
	}
	mc := p.checkpointStatus()
	var warm *v1alpha1.Placement
	for i := range mc.Placements {
		if mc.Placements[i].Tier == v1alpha1.TierWarm {
			warm = &mc.Placements[i]
		}
	}
	if mc.ResidentTier != v1alpha1.TierWarm || warm == nil || warm.Node != "node-a" || warm.Bytes != weightsBytes || warm.Digest == "" || warm.ReadBytesPerSecond <= 0 {
		t.Fatalf("ModelCheckpoint status %+v, want resident Warm with the warm copy on node-a, its digest and measured read bandwidth", mc)
	}
	if st := p.e.state(); st.ExpectedResumeSeconds == "" || mc.ExpectedResumeSeconds != st.ExpectedResumeSeconds {
		t.Errorf("expected resume %q in the lifecycle status and %q in the ModelCheckpoint, want the same estimate from the warm tier's bandwidth", st.ExpectedResumeSeconds, mc.ExpectedResumeSeconds)
	}

	wake := func(prefix string, tier v1alpha1.Tier, wakes int) {
		t.Helper()
		if err := sendBatch(p.client, prefix, 4); err != nil {
			t.Fatalf("requests sent to engines asleep in the %s tier were lost or failed:\n%v", tier, err)
		}
		p.lastWake(fmt.Sprintf("%d bytes from the %s tier", weightsBytes, tier), func(lw *v1alpha1.WakeStatus) bool {
			return lw.FromTier == tier && lw.Bytes == weightsBytes
		})
		w := p.sim.WeightsStatus()
		if w.Wakes != wakes || w.Verified != wakes || w.LastWake == nil || w.LastWake.Tier != tier || !w.LastWake.Verified {
			t.Errorf("engine: %d wakes, %d verified, last %+v; want %d verified wakes, the last from %s", w.Wakes, w.Verified, w.LastWake, wakes, tier)
		}
		// The gate opens first; the status follows.
		eventually(t, 5*time.Second, func() error {
			if c := p.checkpointStatus().Conditions; !hasCondition(c, "Verified", metav1.ConditionTrue) {
				return fmt.Errorf("the ModelCheckpoint's conditions after the wake %+v, want Verified True", c)
			}
			return nil
		})
	}
	// The demotion itself woke the engine once, from the hot tier.
	wake("warm", v1alpha1.TierWarm, 2)

	// Hot, then warm again; then the agent loses the warm copy: cold.
	p.asleep(2, v1alpha1.TierWarm)
	resp, err := p.agentCall(http.MethodDelete, "/tiers/warm/"+ns+"/demo-chat")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("removing the warm copy: %d", resp.StatusCode)
	}
	p.asleep(2, v1alpha1.TierCold)
	wake("cold", v1alpha1.TierCold, 4)

	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep", r)
	}
	if c := counter(t, p.registry("leader-a"), "orchestra_lifecycle_demotions_total", map[string]string{"result": "ok"}); c < 2 {
		t.Errorf("orchestra_lifecycle_demotions_total{result=ok} = %v, want 2", c)
	}
}

// TestDemotionFallsBackToTheColdTier: when the node agent cannot demote
// the engine's offload (it is not in the agent's hot tier), a demotion with
// coldPath places the warm copy from the agent's cold tier instead, and the
// next wake still reads the warm tier.
func TestDemotionFallsBackToTheColdTier(t *testing.T) {
	park := func(s *lifecycle.SleepConfig) { s.ParkAfter.Duration = 300 * time.Millisecond }
	p := newSleepPlane(t, planeOptions{sleep: park, offloadElsewhere: true})
	p.startLeader("leader-a", p.config(park))

	p.asleep(2, v1alpha1.TierWarm)
	if c := p.agentMetric(`orchestra_agent_demotions_total{result="failed"}`); c != 1 {
		t.Errorf("orchestra_agent_demotions_total{result=failed} = %v, want the demotion of an offload the agent does not hold refused once", c)
	}
	if c := p.agentMetric(`orchestra_agent_promotions_total{result="ok",tier="Warm"}`); c != 1 {
		t.Errorf("orchestra_agent_promotions_total{tier=warm,result=ok} = %v, want the warm copy placed from the cold tier", c)
	}
	if err := sendBatch(p.client, "warm", 2); err != nil {
		t.Fatalf("requests sent to engines asleep in the warm tier were lost or failed:\n%v", err)
	}
	p.lastWake("a wake from the warm tier", func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierWarm && lw.Bytes == weightsBytes
	})
}

// TestDemotionFallsBackToTheS3ColdTier: as above with the application's
// cold tier in S3: the leader names the agent's S3 source (coldS3) and the
// engine's digest, the agent copies the object into its warm tier,
// verified, and reports the rate it read S3 at; the next wake reads the
// warm copy.
func TestDemotionFallsBackToTheS3ColdTier(t *testing.T) {
	park := func(s *lifecycle.SleepConfig) {
		s.ParkAfter.Duration, s.ColdPath, s.ColdS3 = 300*time.Millisecond, "", app
	}
	p := newSleepPlane(t, planeOptions{sleep: park, offloadElsewhere: true, coldS3: true})
	p.startLeader("leader-a", p.config(park))

	p.asleep(2, v1alpha1.TierWarm)
	if c := p.agentMetric(`orchestra_agent_promotions_total{result="ok",tier="Warm"}`); c != 1 {
		t.Errorf("orchestra_agent_promotions_total{tier=warm,result=ok} = %v, want the warm copy placed from S3", c)
	}
	if bps := p.agentMetric(`orchestra_agent_read_bytes_per_second{tier="cold/chat"}`); bps <= 0 {
		t.Errorf("orchestra_agent_read_bytes_per_second{tier=cold/chat} = %v, want the rate of the copy from S3", bps)
	}
	if err := sendBatch(p.client, "warm", 2); err != nil {
		t.Fatalf("requests sent to engines asleep in the warm tier were lost or failed:\n%v", err)
	}
	p.lastWake("a wake from the warm tier", func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierWarm && lw.Bytes == weightsBytes
	})
}

// TestDemotionWithoutAWarmTier: with tiers.warm None the engine mounts no
// warm tier, so after parkAfter the leader asks the node agent for no warm
// copy (neither from the hot tier nor from the cold one), the engine sleeps
// at level 2 and the status and the ModelCheckpoint say the weights rest
// in the cold tier; the next request wakes the engine from the cold tier,
// and once that wake measured the cold tier's speed, the next demotion
// reports the expected resume time from it.
func TestDemotionWithoutAWarmTier(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	park := func(s *lifecycle.SleepConfig) {
		s.ParkAfter.Duration, s.WarmTier = 300*time.Millisecond, v1alpha1.WarmTierNone
	}
	p := newSleepPlane(t, planeOptions{sleep: park, sim: func(c *sim.Config) { c.Sleep.WarmDir = "" }})
	p.startLeader("leader-a", p.config(park))

	noWarmCopy := func() {
		t.Helper()
		for _, series := range []string{`orchestra_agent_demotions_total{result="ok"}`, `orchestra_agent_demotions_total{result="failed"}`,
			`orchestra_agent_promotions_total{result="ok",tier="Warm"}`} {
			if c := p.agentMetric(series); c != 0 {
				t.Errorf("%s = %v, want no warm copy asked of the node agent", series, c)
			}
		}
		if _, err := os.Stat(filepath.Join(p.agentWarm, ns, "demo-chat")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the node agent holds a warm copy the engine cannot read: %v", err)
		}
		mc := p.checkpointStatus()
		for _, pl := range mc.Placements {
			if pl.Tier != v1alpha1.TierCold {
				t.Errorf("ModelCheckpoint placement %+v, want none in the node tiers after the demotion", pl)
			}
		}
		if mc.ResidentTier != v1alpha1.TierCold {
			t.Errorf("ModelCheckpoint resident tier %s, want Cold", mc.ResidentTier)
		}
	}
	p.asleep(2, v1alpha1.TierCold)
	noWarmCopy()
	if st := p.e.state(); st.ExpectedResumeSeconds != "" {
		t.Errorf("expected resume %q before any wake read the cold tier, want none (its speed is not known yet)", st.ExpectedResumeSeconds)
	}

	if err := sendBatch(p.client, "cold", 2); err != nil {
		t.Fatalf("requests sent to engines asleep in the cold tier were lost or failed:\n%v", err)
	}
	p.lastWake("a wake from the cold tier", func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierCold && lw.Bytes == weightsBytes && lw.BytesPerSecond > 0
	})
	if w := p.sim.WeightsStatus(); w.LastWake == nil || w.LastWake.Tier != v1alpha1.TierCold || !w.LastWake.Verified {
		t.Errorf("engine's last wake %+v, want a verified wake from the cold tier", w.LastWake)
	}
	// The leader's wake report tells the node agent there is no warm tier,
	// so its promotions ahead of a predicted wake skip it (cold → hot).
	eventually(t, 5*time.Second, func() error {
		h, err := agentHistory(p.agentWarm, "demo-chat")
		if err != nil {
			return err
		}
		if len(h.Wakes) == 0 || !h.NoWarm {
			return fmt.Errorf("the agent's history of demo-chat has %d wakes, noWarm %v; want the wake reported without a warm tier", len(h.Wakes), h.NoWarm)
		}
		return nil
	})

	// Idle again: asleep in the hot tier, then demoted to the cold tier,
	// now with the cold tier's measured speed.
	p.asleep(2, v1alpha1.TierCold)
	noWarmCopy()
	eventually(t, 5*time.Second, func() error {
		st, mc := p.e.state(), p.checkpointStatus()
		if st.ExpectedResumeSeconds == "" || mc.ExpectedResumeSeconds != st.ExpectedResumeSeconds {
			return fmt.Errorf("expected resume %q in the lifecycle status and %q in the ModelCheckpoint, want the same estimate from the cold tier's measured speed", st.ExpectedResumeSeconds, mc.ExpectedResumeSeconds)
		}
		return nil
	})
	if c := counter(t, p.registry("leader-a"), "orchestra_lifecycle_demotions_total", map[string]string{"result": "ok"}); c != 2 {
		t.Errorf("orchestra_lifecycle_demotions_total{result=ok} = %v, want 2", c)
	}
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep", r)
	}
}

func hasCondition(conds []metav1.Condition, typ string, status metav1.ConditionStatus) bool {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status == status
		}
	}
	return false
}
