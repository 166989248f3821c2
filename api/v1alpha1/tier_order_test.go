package v1alpha1

import (
	"slices"
	"testing"
)

func TestTierSpeedOrder(t *testing.T) {
	for _, tc := range []struct {
		t, u Tier
		want bool
	}{
		{TierWarm, TierHot, true},
		{TierCold, TierWarm, true},
		{TierHot, TierAccelerator, true},
		{TierHot, TierWarm, false},
		{TierHot, TierHot, false},
		{Tier("Tape"), TierCold, true}, // unknown tiers count as slowest
	} {
		if got := tc.t.SlowerThan(tc.u); got != tc.want {
			t.Errorf("%q.SlowerThan(%q) = %v, want %v", tc.t, tc.u, got, tc.want)
		}
	}
	if got := NodeTiers(); !slices.Equal(got, []Tier{TierHot, TierWarm}) {
		t.Errorf("NodeTiers() = %v", got)
	}
	for _, tier := range Tiers() {
		if tier.OnNode() != (tier == TierHot || tier == TierWarm) {
			t.Errorf("%q.OnNode() = %v", tier, tier.OnNode())
		}
	}
	Tiers()[0] = TierCold // callers get a copy
	if Tiers()[0] != TierAccelerator {
		t.Error("Tiers() shares its backing array")
	}
}
