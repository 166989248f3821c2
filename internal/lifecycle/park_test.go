package lifecycle_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestParkingScalesThePodsAwayAndKeepsTheCopies (issue 27 §4): with
// minReplicas 0, after parkAfter asleep the engine's level-1 offload is
// demoted to the node agent's warm tier (verified) and the root is then
// scaled to zero pods, freeing its accelerator: state Zero, status.parked
// naming the warm copy on its node and the node label, residentTier Warm,
// the ModelCheckpoint recording the copy, the offload gone from the node's
// RAM and the warm copy kept by the agent. When the agent loses the copy
// the parked status follows; a request then wakes the application from
// zero (one replica written), and the parked status is cleared.
func TestParkingScalesThePodsAwayAndKeepsTheCopies(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	const label = "weights.modelorchestra.io/ns.demo-chat"
	park := func(s *lifecycle.SleepConfig) {
		s.ParkAfter.Duration, s.ColdPath, s.NodeLabel = 300*time.Millisecond, "", label
	}
	p := newSleepPlane(t, planeOptions{sleep: park})
	cfg := p.config(park)
	cfg.Apps[0].MinReplicas = 0
	p.startLeader("leader-a", cfg)

	eventually(t, 20*time.Second, func() error {
		st := p.e.state()
		if st.State != v1alpha1.LifecycleZero || st.Parked == nil {
			return fmt.Errorf("state %s, parked %+v; want Zero, parked", st.State, st.Parked)
		}
		return nil
	})
	if err := p.e.atReplicas(0)(); err != nil {
		t.Fatal(err)
	}
	st := p.e.state()
	if diff := cmp.Diff([]v1alpha1.NodeCopy{{Node: "node-a", Tier: v1alpha1.TierWarm}}, st.Parked.Copies); diff != "" {
		t.Errorf("parked copies (-want +got):\n%s", diff)
	}
	if st.ResidentTier != v1alpha1.TierWarm || st.Parked.NodeLabel != label || st.Parked.Since == nil {
		t.Errorf("parked status %+v, resident tier %s; want Warm, the node label %s and since", st.Parked, st.ResidentTier, label)
	}
	if !p.e.consumer().Paused {
		t.Error("parked, but the consumer is not paused")
	}
	if _, err := os.Stat(filepath.Join(p.agentHot, ns, nodeapi.EngineOffloadName("demo-chat"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the engine's level-1 offload is still in the node's hot tier after parking: %v", err)
	}
	if _, err := os.Stat(filepath.Join(p.agentWarm, ns, "demo-chat")); err != nil {
		t.Errorf("the node agent's warm copy is gone after parking: %v", err)
	}
	eventually(t, 5*time.Second, func() error {
		mc := p.checkpointStatus()
		for _, pl := range mc.Placements {
			if pl.Node == "node-a" && pl.Tier == v1alpha1.TierWarm && pl.Digest != "" {
				if mc.ResidentTier != v1alpha1.TierWarm {
					return fmt.Errorf("ModelCheckpoint resident tier %s, want Warm", mc.ResidentTier)
				}
				return nil
			}
		}
		return fmt.Errorf("ModelCheckpoint placements %+v, want the warm copy on node-a", mc.Placements)
	})
	if c := counter(t, p.registry("leader-a"), "orchestra_lifecycle_parks_total", map[string]string{"app": app}); c != 1 {
		t.Errorf("orchestra_lifecycle_parks_total = %v, want 1", c)
	}

	// The agent loses the warm copy (evicted, or dropped by a failed
	// re-verification): the parked status says so.
	resp, err := p.agentCall(http.MethodDelete, "/tiers/warm/"+ns+"/demo-chat")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	eventually(t, 5*time.Second, func() error {
		st := p.e.state()
		if st.Parked == nil || len(st.Parked.Copies) != 0 || st.ResidentTier != v1alpha1.TierCold {
			return fmt.Errorf("parked %+v in tier %s; want no copies, Cold", st.Parked, st.ResidentTier)
		}
		return nil
	})

	// A request wakes it from zero.
	p.e.publish(1)
	eventually(t, 5*time.Second, p.e.atReplicas(1))
	eventually(t, 5*time.Second, func() error {
		st := p.e.state()
		if st.State == v1alpha1.LifecycleZero || st.Parked != nil || st.LastWake == nil || st.LastWake.Trigger != "request" {
			return fmt.Errorf("state %s, parked %+v, last wake %+v; want a wake from zero by the request, not parked", st.State, st.Parked, st.LastWake)
		}
		return nil
	})
}
