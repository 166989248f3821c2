package lifecycle

import (
	"testing"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// A seat-group member's status names where its weights rest: Ollama and
// llama.cpp unload the model at any sleep level, so a level-1 sleep leaves
// them in the cold tier, not the hot one.
func TestSeatMemberTier(t *testing.T) {
	for _, c := range []struct {
		state  v1alpha1.LifecycleState
		level  int32
		level1 v1alpha1.Tier
		want   v1alpha1.Tier
	}{
		{v1alpha1.LifecycleAwake, 1, v1alpha1.TierCold, v1alpha1.TierAccelerator},
		{v1alpha1.LifecycleDraining, 2, "", v1alpha1.TierAccelerator},
		{v1alpha1.LifecycleAsleep, 1, v1alpha1.TierHot, v1alpha1.TierHot},   // vLLM, the simulator: their own offload
		{v1alpha1.LifecycleAsleep, 1, "", v1alpha1.TierHot},                 // a configuration from before the field
		{v1alpha1.LifecycleAsleep, 1, v1alpha1.TierCold, v1alpha1.TierCold}, // Ollama, llama.cpp: unloaded
		{v1alpha1.LifecycleAsleep, 2, v1alpha1.TierHot, ""},
		{v1alpha1.LifecycleWaking, 1, v1alpha1.TierHot, ""},
	} {
		if got := seatMemberTier(c.state, c.level, c.level1); got != c.want {
			t.Errorf("seatMemberTier(%s, level %d, level-1 tier %q) = %q, want %q", c.state, c.level, c.level1, got, c.want)
		}
	}
}
