package v1alpha1

import (
	"slices"
	"strings"
)

// tierOrder is the one speed order of the tiers, fastest first.
var tierOrder = [...]Tier{TierAccelerator, TierHot, TierWarm, TierCold}

// nodeTiers are the tiers a node agent stores copies in, fastest first:
// Hot (node RAM) and Warm (node-local disk).
var nodeTiers = [...]Tier{TierHot, TierWarm}

// Tiers returns every tier, fastest first.
func Tiers() []Tier { return slices.Clone(tierOrder[:]) }

// NodeTiers returns the tiers a node agent stores copies in, fastest
// first: Hot and Warm.
func NodeTiers() []Tier { return slices.Clone(nodeTiers[:]) }

// OnNode reports whether t is a tier a node agent stores copies in.
func (t Tier) OnNode() bool { return slices.Contains(nodeTiers[:], t) }

// SlowerThan reports whether t is slower than u in the speed order
// Accelerator, Hot, Warm, Cold. A value that names no tier (one of a
// later release) counts as slower than every tier.
func (t Tier) SlowerThan(u Tier) bool { return t.rank() > u.rank() }

func (t Tier) rank() int {
	if i := slices.Index(tierOrder[:], t); i >= 0 {
		return i
	}
	return len(tierOrder)
}

// UnmarshalText reads a tier case-insensitively: "hot" is TierHot. It is
// the one tier vocabulary of the status, the node agent's and the
// sidecar's wire types and the simulator's reports; earlier releases
// spelled the tiers in lowercase on the agents' wire ("hot", "warm",
// "cold"), and an agent and a dispatcher of different releases talk to
// each other while a release rolls, so both spellings decode (JSON values
// and map keys, URL path segments through ParseTier). Remove the lowercase
// acceptance a release after the one that introduced the capitalized wire.
// A value that names no tier is kept as it is.
func (t *Tier) UnmarshalText(b []byte) error {
	*t = ParseTier(string(b))
	return nil
}

// ParseTier returns the tier s names case-insensitively, or s unchanged
// when it names none.
func ParseTier(s string) Tier {
	for _, t := range tierOrder {
		if strings.EqualFold(s, string(t)) {
			return t
		}
	}
	return Tier(s)
}
