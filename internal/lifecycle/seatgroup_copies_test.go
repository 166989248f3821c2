package lifecycle_test

import (
	"github.com/model-orchestra/operator/api/v1alpha1"

	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSeatGroupMembersGetACopyWhenTheyFallAsleep: a member of a seat group
// whose engine loads copies of its model (modelCopies) gets one as an
// application does: when the group puts it to sleep to free the seat, the
// leader asks the node agent of the pod's node for a hot copy, through the
// app path's one placement (here from the agent's cold tier), before any
// wake pattern exists for the agent to promote ahead of. A member without
// modelCopies gets none.
func TestSeatGroupMembersGetACopyWhenTheyFallAsleep(t *testing.T) {
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, nil, 1, func(o *seatPlaneOptions) {
		o.agent, o.fromCold, o.copies = true, map[string]bool{"alpha": true, "beta": true}, map[string]bool{"alpha": true}
	})
	eventually(t, 30*time.Second, holds("the group to come within its budget of one awake engine", func() bool {
		return len(p.awake()) == 1
	}))
	// Beta takes the seat: alpha falls asleep, and its copy is placed.
	if err := p.send("beta", 0, 1, 4); err != nil {
		t.Fatal(err)
	}
	hot := filepath.Join(p.agentHot, ns)
	eventually(t, 15*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(hot, "demo-alpha")); err != nil {
			return fmt.Errorf("alpha asleep, the agent's hot copy: %w", err)
		}
		if n := seatAgentMetric(t, p.agent.URL, `orchestra_agent_promotions_total{result="ok",tier="Hot"}`); n < 1 {
			return fmt.Errorf("orchestra_agent_promotions_total{tier=hot,result=ok} = %v; want the leader's placement", n)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(hot, "demo-beta")); !os.IsNotExist(err) {
		t.Errorf("beta, which does not load copies, has a hot copy placed (%v)", err)
	}
	// Alpha's next wake reads the hot copy.
	if err := p.send("alpha", 1, 1, 4); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holds("alpha to hold the seat", func() bool {
		st := p.status("alpha")
		return st.Seat != nil && st.Seat.Holding
	}))
	st, err := p.engines["alpha"].seatState()
	if err != nil {
		t.Fatal(err)
	}
	if w := st.LastWake; w == nil || w.Transfer == nil || w.Transfer.Tier != v1alpha1.TierHot || !w.Transfer.Verified {
		t.Errorf("alpha's wake restored %+v; want the verified hot copy", w)
	}
}

// seatAgentMetric is one series of the node agent's metrics at base (0
// when absent).
func seatAgentMetric(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
