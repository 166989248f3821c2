package lifecycle_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestADroppedCopyIsReportedAndTheWakeReadsTheTierBelow: the warm copy of
// a demoted engine changes on the node; the node agent's verification pass
// drops it, the leader turns the ModelCheckpoint's Verified condition
// False naming the copy, the resident tier becomes Cold, and the next
// request wakes the engine from the cold tier, verified, which turns the
// condition True again.
func TestADroppedCopyIsReportedAndTheWakeReadsTheTierBelow(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	park := func(s *lifecycle.SleepConfig) { s.ParkAfter.Duration, s.ColdPath = 300*time.Millisecond, "" }
	p := newSleepPlane(t, planeOptions{sleep: park})
	p.startLeader("leader-a", p.config(park))
	p.asleep(2, v1alpha1.TierWarm)

	// One byte of the warm copy flips on the node.
	warm := filepath.Join(filepath.Dir(p.agentHot), "agent-warm", ns, "demo-chat")
	f, err := os.OpenFile(warm, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^b[0]}, 4096); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	resp, err := p.agentCall(http.MethodPost, "/verify")
	if err != nil {
		t.Fatal(err)
	}
	var res []nodeapi.Verification
	err = json.NewDecoder(resp.Body).Decode(&res)
	_ = resp.Body.Close()
	if err != nil || len(res) != 1 || !res[0].Dropped || res[0].Tier != v1alpha1.TierWarm {
		t.Fatalf("verification pass: %+v (%v); want the warm copy dropped", res, err)
	}

	p.asleep(2, v1alpha1.TierCold)
	eventually(t, 5*time.Second, holds("the ModelCheckpoint's Verified condition False naming the dropped copy", func() bool {
		c := meta.FindStatusCondition(p.checkpointStatus().Conditions, "Verified")
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "CopyDropped" &&
			strings.Contains(c.Message, "node-a") && strings.Contains(c.Message, string(v1alpha1.TierWarm)) && strings.Contains(c.Message, "hash mismatch")
	}))
	for _, pl := range p.checkpointStatus().Placements {
		if pl.Tier == v1alpha1.TierWarm {
			t.Errorf("the dropped warm copy is still a placement: %+v", pl)
		}
	}

	if err := sendBatch(p.client, "after-drop", 2); err != nil {
		t.Fatalf("requests sent after the warm copy was dropped were lost or failed:\n%v", err)
	}
	p.lastWake("a wake from the cold tier", func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierCold && lw.Bytes == weightsBytes
	})
	if w := p.sim.WeightsStatus(); w.LastWake == nil || w.LastWake.Tier != v1alpha1.TierCold || !w.LastWake.Verified {
		t.Errorf("engine's last wake %+v, want a verified wake from the cold tier (the changed warm copy never read)", w.LastWake)
	}
	eventually(t, 5*time.Second, holds("the Verified condition True after the verified wake", func() bool {
		return hasCondition(p.checkpointStatus().Conditions, "Verified", metav1.ConditionTrue)
	}))
	if r := p.refused(); r != 0 {
		t.Errorf("the engine refused %v requests while asleep", r)
	}
}
