package v1alpha1

import "strings"

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
	for _, t := range []Tier{TierAccelerator, TierHot, TierWarm, TierCold} {
		if strings.EqualFold(s, string(t)) {
			return t
		}
	}
	return Tier(s)
}
