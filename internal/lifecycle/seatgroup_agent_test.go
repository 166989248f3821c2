package lifecycle_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestSeatGroupSwapsReachTheNodeAgent: the leader reports each swap of a
// seat group to the node agent of the group pod's node, as it reports an
// application's sleeps and wakes. Two applications take the one seat in
// turn, at a steady pace: the agent's history holds each swap's sleeps and
// wakes with the bytes and tier of the restore, knows which engine is
// awake (the one swapped in last, however quickly it was swapped out and
// back in before), and predicts the next wake of the one asleep from the
// pattern. Alpha sleeps at level 2 and loads a model file the agent can read
// (its cold tier): the agent promotes it to the hot tier ahead of its
// predicted turn, and alpha's next wake reads that copy. An agent that
// does not answer holds no swap up: its reports are counted as failed,
// and the applications are still swapped and served.
func TestSeatGroupSwapsReachTheNodeAgent(t *testing.T) {
	p := newSeatGroupPlane(t, []string{"alpha", "beta"}, nil, 1, func(o *seatPlaneOptions) {
		o.agent, o.fromCold = true, map[string]bool{"alpha": true}
	})
	eventually(t, 30*time.Second, holds("the group to come within its budget of one awake engine", func() bool {
		return len(p.awake()) == 1
	}))
	holding := func(app string) func() error {
		return holds(app+" to hold the seat", func() bool {
			st := p.status(app)
			return st.Seat != nil && st.Seat.Holding && st.State == v1alpha1.LifecycleAwake
		})
	}
	// Alpha is asked for every period, beta half a period later, for at
	// least four rounds and until the wakes the agent recorded keep the
	// pace (its own predictor finds the pattern in them): on a loaded
	// machine a slow swap shifts one wake by more than the pattern's
	// tolerance, and the agent rightly predicts nothing from that history.
	const period, minRounds, maxRounds = time.Second, 4, 12
	var alpha, beta *nodeagent.WakeHistory
	start := time.Now()
	rounds := 0
	for ; ; rounds++ {
		for i, app := range []string{"alpha", "beta"} {
			time.Sleep(time.Until(start.Add(time.Duration(rounds)*period + time.Duration(i)*period/2)))
			if err := p.send(app, rounds, 2, 8); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, holding(app))
		}
		if rounds+1 < minRounds {
			continue
		}
		// Beta holds the seat; alpha was swapped out after its last turn.
		eventually(t, 5*time.Second, func() error {
			alpha, beta = p.history("alpha"), p.history("beta")
			switch {
			case alpha == nil || beta == nil:
				return fmt.Errorf("the agent's histories: alpha %+v, beta %+v", alpha, beta)
			case len(alpha.Wakes) < rounds || len(alpha.Sleeps) < rounds:
				return fmt.Errorf("alpha: %d wakes and %d sleeps reported, want at least %d of each", len(alpha.Wakes), len(alpha.Sleeps), rounds)
			case alpha.Awake() || !beta.Awake():
				return fmt.Errorf("the agent holds alpha awake %v and beta awake %v; want alpha asleep, beta awake", alpha.Awake(), beta.Awake())
			}
			return nil
		})
		if _, steady := alpha.Predict(time.Now()); steady {
			rounds++
			break
		}
		if rounds+1 == maxRounds {
			t.Fatalf("after %d rounds alpha's wakes never kept a pace of %v on this machine: %v", maxRounds, period, alpha.Wakes)
		}
	}
	if alpha.Bytes != 4<<20 || alpha.Digest == "" {
		t.Errorf("alpha's history: %d bytes, digest %q; want the 4 MiB the swaps restored and the engine's digest", alpha.Bytes, alpha.Digest)
	}
	// Swapped out and back in quickly: every wake after the first comes
	// after a sleep, and every sleep after the wake before it.
	for i := 1; i < len(alpha.Wakes); i++ {
		if alpha.Sleeps[0].After(alpha.Wakes[i]) {
			continue
		}
		n := 0
		for _, s := range alpha.Sleeps {
			if s.After(alpha.Wakes[i-1]) && s.Before(alpha.Wakes[i]) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("alpha's history has %d sleeps between its wakes %d and %d, want 1 (one swap out between two swaps in): %+v", n, i-1, i, alpha)
		}
	}

	// The agent predicts alpha's next wake from the pattern; beta is awake.
	resp, err := http.Post(p.agent.URL+"/promote-ahead", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	// The agent plans every 100 ms with a margin of an hour, so alpha's
	// prediction may already have been acted on: listed under Done, as the
	// wake its promotion was for, and no longer among the predictions (the
	// promoted copy changes nothing in the history, but a plan that runs
	// after the predicted turn passed drops a broken pattern). Either one
	// made after alpha's last reported wake is the agent's prediction; it
	// is checked against the moment it was made.
	lastWake := alpha.Wakes[len(alpha.Wakes)-1]
	predicted, made := predictionOf(t, p.agentReport().Promotion, "demo-alpha", "demo-beta", lastWake)
	if predicted == nil {
		r := p.agentReport().Promotion
		var done []string
		for _, d := range r.Done {
			done = append(done, fmt.Sprintf("%s at %s for a wake at %s (%s)", d.Name, d.Time.Format("15:04:05.000"), d.Wake.Next.Format("15:04:05.000"), d.Wake.Pattern))
		}
		t.Fatalf("the agent predicts no wake of alpha from %d wakes %v and %d sleeps %v at a steady pace: last plan at %v, done %v",
			len(alpha.Wakes), alpha.Wakes, len(alpha.Sleeps), alpha.Sleeps, r.LastTime, done)
	}
	// The next turn, or the one after when the next passed before the
	// prediction was made.
	next := predicted.Next.Sub(lastWake)
	turns := (next + period/2) / period
	if off := next - turns*period; turns < 1 || off < -period*3/10 || off > period*3/10 || predicted.Next.Before(made.Add(-period*3/10)) {
		t.Errorf("alpha's next wake predicted %v after its last one (%s pattern), want a coming turn: a multiple of the period %v", next, predicted.Pattern, period)
	}

	// With a margin of an hour, a prediction makes alpha's promotion due
	// at once: the agent copies its model file from the cold tier up to the
	// hot tier, verified, and alpha's next wake reads the hot copy.
	eventually(t, 10*time.Second, func() error {
		r := p.agentReport().Promotion
		for _, d := range r.Done {
			if d.Name == "demo-alpha" && d.To == v1alpha1.TierHot && d.Error == "" {
				return nil
			}
		}
		return fmt.Errorf("the agent's promotions %+v, want alpha's weights promoted to the hot tier", r)
	})
	if err := p.send("alpha", rounds, 2, 8); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holding("alpha"))
	if w := p.engines["alpha"].weights(); w.LastWake == nil || w.LastWake.Tier != v1alpha1.TierHot || !w.LastWake.Verified {
		t.Errorf("alpha's last wake %+v, want a verified wake from the hot copy the agent promoted", w.LastWake)
	}

	// An agent that answers no report holds no swap up.
	if c := counter(t, p.reg, "orchestra_lifecycle_agent_reports_total", map[string]string{"app": "alpha", "result": "failed"}); c != 0 {
		t.Errorf("%v reports of alpha's swaps failed while the agent answered", c)
	}
	p.agentHangs.Store(true)
	for round := rounds + 1; round < rounds+3; round++ {
		for _, app := range []string{"alpha", "beta"} {
			sent := time.Now()
			if err := p.send(app, round, 2, 8); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, holding(app))
			// A report waits up to 2 s for the agent's answer: a swap
			// that waited for one would take longer.
			if took := time.Since(sent); took >= 2*time.Second {
				t.Errorf("swapping %s in took %v while the agent did not answer; the swap waited for the report", app, took)
			}
		}
	}
	eventually(t, 10*time.Second, func() error {
		if c := counter(t, p.reg, "orchestra_lifecycle_agent_reports_total", map[string]string{"result": "failed"}); c < 2 {
			return fmt.Errorf("orchestra_lifecycle_agent_reports_total{result=failed} = %v, want the reports the agent did not answer counted", c)
		}
		return nil
	})
}

// predictionOf is the node agent's prediction of the next wake of the
// artifact named app, made after its wake at since, and when it was made:
// from the last plan's predictions, else from the newest promotion made
// ahead of it (the prediction already acted on). A prediction of other,
// which is awake, is an error.
func predictionOf(t *testing.T, r nodeapi.PromotionReport, app, other string, since time.Time) (*nodeapi.Prediction, time.Time) {
	t.Helper()
	for _, pw := range r.Predictions {
		if pw.Name == other {
			t.Errorf("the agent predicts a wake of %s, which is awake: %+v", other, pw)
		}
	}
	for _, pw := range r.Predictions {
		if pw.Name == app && r.LastTime != nil {
			return &pw.Prediction, *r.LastTime
		}
	}
	for i := len(r.Done) - 1; i >= 0; i-- {
		if d := r.Done[i]; d.Name == app && d.Time.After(since) {
			return &d.Wake, d.Time
		}
	}
	return nil, time.Time{}
}
