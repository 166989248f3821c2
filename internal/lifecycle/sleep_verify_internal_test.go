package lifecycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// A copy a node agent dropped after its periodic re-hash turns the
// ModelCheckpoint's Verified condition False; latestDrop finds the newest
// drop of the application's artifact across the nodes.
func TestLatestDrop(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	drop := func(ns, name string, tier v1alpha1.Tier, sec int) nodeapi.Verification {
		return nodeapi.Verification{Key: nodeapi.Key{Namespace: ns, Name: name}, Tier: tier, Dropped: true, Time: t0.Add(time.Duration(sec) * time.Second)}
	}
	view := func(node string, drops ...nodeapi.Verification) nodeView {
		v := nodeView{agentRef: agentRef{node: node}}
		v.report.Verification.Dropped = drops
		return v
	}
	type result struct {
		Drop  nodeapi.Verification
		Node  string
		Found bool
	}
	for _, c := range []struct {
		name  string
		views []nodeView
		want  result
	}{
		{name: "no agent", want: result{}},
		{name: "nothing dropped", views: []nodeView{view("n1")}, want: result{}},
		{
			name:  "another application's or namespace's copy",
			views: []nodeView{view("n1", drop("team-a", "other", v1alpha1.TierWarm, 1), drop("team-b", "orch-chat", v1alpha1.TierWarm, 2))},
			want:  result{},
		},
		{
			name: "the newest across nodes",
			views: []nodeView{
				view("n1", drop("team-a", "orch-chat", v1alpha1.TierHot, 5)),
				view("n2", drop("team-a", "orch-chat", v1alpha1.TierWarm, 9), drop("team-a", "orch-chat", v1alpha1.TierHot, 3)),
			},
			want: result{Drop: drop("team-a", "orch-chat", v1alpha1.TierWarm, 9), Node: "n2", Found: true},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, node, found := latestDrop(c.views, "team-a", "orch-chat")
			if diff := cmp.Diff(c.want, result{d, node, found}); diff != "" {
				t.Errorf("latestDrop (-want +got):\n%s", diff)
			}
		})
	}
}
