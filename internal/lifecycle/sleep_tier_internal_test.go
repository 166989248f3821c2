package lifecycle

import (
	"testing"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Where sleeping engines' weights rest decides the resident tier and the
// expected resume time: the engines' own offload at level 1; at level 2
// the fastest tier every node holds, the warm tier only when the engines
// mount it (tiers.warm not None).
func TestRestingTier(t *testing.T) {
	hot, warm := v1alpha1.TierHot, v1alpha1.TierWarm
	for _, tc := range []struct {
		name   string
		level  int32
		level1 v1alpha1.Tier // the engine's level-1 tier; "" as rendered before it existed
		warm   bool
		held   []v1alpha1.Tier // the tiers every node's agent holds
		want   v1alpha1.Tier
	}{
		{name: "level 1 rests in the engines' offload", level: 1, warm: true, want: hot},
		{name: "level 1 of the simulator or vLLM rests in RAM", level: 1, level1: hot, warm: true, held: []v1alpha1.Tier{warm}, want: hot},
		{name: "level 1 of Ollama or llama.cpp rests in the model cache", level: 1, level1: v1alpha1.TierCold, warm: true, held: []v1alpha1.Tier{hot, warm}, want: v1alpha1.TierCold},
		{name: "level 1 with warm None", level: 1, warm: false, held: []v1alpha1.Tier{warm}, want: hot},
		{name: "level 2 with a hot copy everywhere", level: 2, warm: true, held: []v1alpha1.Tier{hot, warm}, want: hot},
		{name: "level 2 with a warm copy everywhere", level: 2, warm: true, held: []v1alpha1.Tier{warm}, want: warm},
		{name: "level 2 without copies", level: 2, warm: true, want: v1alpha1.TierCold},
		{name: "warm None: a warm copy the engines cannot read does not count", level: 2, warm: false, held: []v1alpha1.Tier{warm}, want: v1alpha1.TierCold},
		{name: "warm None: a hot copy still does", level: 2, warm: false, held: []v1alpha1.Tier{hot}, want: hot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := restingTier(tc.level, tc.level1, tc.warm, func(t v1alpha1.Tier) bool {
				for _, h := range tc.held {
					if h == t {
						return true
					}
				}
				return false
			})
			if got != tc.want {
				t.Errorf("restingTier(level %d, warm %v, held %v) = %s, want %s", tc.level, tc.warm, tc.held, got, tc.want)
			}
		})
	}
}
