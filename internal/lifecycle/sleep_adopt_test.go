package lifecycle_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestANewLeaderAsksForTheHotCopyOfEnginesAlreadyAsleep: an Ollama engine
// that loads copies of its model file falls asleep under a leader, which
// has the node agent place the hot copy and goes; the copy is lost (the
// agent's tmpfs emptied, or the leader went before asking: the same for
// the next one). The next leader takes the sleeping engine over and asks
// for it again, so the status says Hot and the wake opens the hot copy,
// not the model cache. A third leader asks again, and the agent, holding
// the copy, only marks it used: the file is not written again.
func TestANewLeaderAsksForTheHotCopyOfEnginesAlreadyAsleep(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	loader := &copyLoader{}
	copies := func(s *lifecycle.SleepConfig) {
		s.ModelCopies, s.ColdPath, s.Level1Tier = true, "chat/weights.bin", v1alpha1.TierCold
	}
	p := newSleepPlane(t, planeOptions{sleep: copies, ollama: loader})
	hot := filepath.Join(p.agentHot, ns, "demo-chat")
	const promoted = `orchestra_agent_promotions_total{result="ok",tier="Hot"}`
	asleepIn := func(tier v1alpha1.Tier) {
		t.Helper()
		eventually(t, 15*time.Second, func() error {
			if st := p.e.state(); st.State != v1alpha1.LifecycleAsleep || st.ResidentTier != tier {
				return fmt.Errorf("state %s in tier %s; want Asleep in %s", st.State, st.ResidentTier, tier)
			}
			return nil
		})
	}

	stop := p.startLeader("leader-a", p.config(copies))
	asleepIn(v1alpha1.TierHot)
	stop()
	resp, err := p.agentCall(http.MethodDelete, nodeapi.PathTiers+"/hot/"+ns+"/demo-chat")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if _, err := os.Stat(hot); resp.StatusCode >= 300 || !os.IsNotExist(err) {
		t.Fatalf("removing the hot copy: %s, then %v", resp.Status, err)
	}

	stop = p.startLeader("leader-b", p.config(copies))
	eventually(t, 15*time.Second, func() error {
		if c := p.agentMetric(promoted); c != 2 {
			return fmt.Errorf("%s = %v; want the leader that took the engine over to ask for the hot copy again", promoted, c)
		}
		return nil
	})
	asleepIn(v1alpha1.TierHot)
	fi, err := os.Stat(hot)
	if err != nil {
		t.Fatalf("no hot copy after the takeover: %v", err)
	}
	stop()

	p.startLeader("leader-c", p.config(copies))
	eventually(t, 15*time.Second, func() error {
		if c := p.agentMetric(promoted); c != 3 {
			return fmt.Errorf("%s = %v; want the third leader to ask again", promoted, c)
		}
		return nil
	})
	asleepIn(v1alpha1.TierHot)
	again, err := os.Stat(hot)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := fi.Sys().(*syscall.Stat_t), again.Sys().(*syscall.Stat_t); a.Ino != b.Ino || !fi.ModTime().Equal(again.ModTime()) {
		t.Errorf("the hot copy was written again (inode %d -> %d, modified %v -> %v); want the held copy only marked used", a.Ino, b.Ino, fi.ModTime(), again.ModTime())
	}

	if err := sendBatch(p.client, "adopted", 2); err != nil {
		t.Fatalf("requests sent to the adopted engine were lost or failed:\n%v", err)
	}
	p.lastWake(fmt.Sprintf("%d bytes from the hot tier", weightsBytes), func(lw *v1alpha1.WakeStatus) bool {
		return lw.FromTier == v1alpha1.TierHot && lw.Bytes == weightsBytes
	})
	if got, n, wrong := loader.lastLoad(); got != hot || wrong != 0 {
		t.Errorf("the engine's last load (of %d) opened %s (%d not the model file); want the hot copy %s", n, got, wrong, hot)
	}
}
