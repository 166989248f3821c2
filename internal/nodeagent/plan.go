package nodeagent

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

func budgetOf(b nodeapi.Budgets, t v1alpha1.Tier) int64 {
	if t == v1alpha1.TierHot {
		return b.Hot
	}
	return b.Warm
}

// ErrNoRoom means a copy cannot be admitted without evicting pinned copies
// or copies of a higher priority, or it is larger than the budget.
var ErrNoRoom = errors.New("no room in the tier")

// PlanAdmit plans the evictions that make room for in (in.Tier, in.Bytes)
// within the budgets. Victims are taken lowest priority first and, within
// a priority, least recently used first; a copy with a higher priority than
// in, a pinned copy, or an engine's level-1 offload (Offload: the engine's to
// release, counted in the hot tier's use) is never evicted. An evicted hot copy is demoted to
// warm when warm has no copy of it, its application has a warm tier (not
// NoWarm) and room can be made there under the same rule; otherwise it is
// dropped (the cold tier still holds it). A copy
// of in.Key already in the tier is replaced. The plan is pure: it reads
// entries and returns actions, so the IO that applies it stays separate.
func PlanAdmit(entries []nodeapi.Entry, b nodeapi.Budgets, in nodeapi.Entry) ([]nodeapi.Action, error) {
	if !in.Tier.OnNode() {
		return nil, fmt.Errorf("the agent stores only the hot and warm tiers, not %q", in.Tier)
	}
	p := planner{budgets: b}
	for _, e := range entries {
		if e.Key == in.Key && e.Tier == in.Tier && !e.Offload {
			continue // replaced (an engine's offload of the same name stays)
		}
		p.entries = append(p.entries, e)
	}
	if err := p.makeRoom(in, 0); err != nil {
		return nil, err
	}
	return p.actions, nil
}

type planner struct {
	budgets nodeapi.Budgets
	entries []nodeapi.Entry
	actions []nodeapi.Action
}

func (p *planner) used(t v1alpha1.Tier) int64 {
	var n int64
	for _, e := range p.entries {
		if e.Tier == t {
			n += e.Bytes
		}
	}
	return n
}

func (p *planner) has(k nodeapi.Key, t v1alpha1.Tier) bool {
	return slices.ContainsFunc(p.entries, func(e nodeapi.Entry) bool { return e.Key == k && e.Tier == t && !e.Offload })
}

func (p *planner) remove(k nodeapi.Key, t v1alpha1.Tier) {
	p.entries = slices.DeleteFunc(p.entries, func(e nodeapi.Entry) bool { return e.Key == k && e.Tier == t && !e.Offload })
}

// evictionOrder sorts the candidates for eviction from t.
func evictionOrder(entries []nodeapi.Entry, t v1alpha1.Tier, in nodeapi.Entry) []nodeapi.Entry {
	var c []nodeapi.Entry
	for _, e := range entries {
		if e.Tier == t && !e.Pinned && !e.Offload && e.Priority <= in.Priority {
			c = append(c, e)
		}
	}
	slices.SortStableFunc(c, func(a, b nodeapi.Entry) int {
		if n := cmp.Compare(a.Priority, b.Priority); n != 0 {
			return n
		}
		if n := a.LastUsed.Compare(b.LastUsed); n != 0 {
			return n
		}
		return cmp.Compare(a.String(), b.String())
	})
	return c
}

func (p *planner) makeRoom(in nodeapi.Entry, depth int) error {
	budget := budgetOf(p.budgets, in.Tier)
	if in.Bytes > budget {
		return fmt.Errorf("%w: %s is %d bytes, the %s budget is %d", ErrNoRoom, in.Key, in.Bytes, in.Tier, budget)
	}
	need := p.used(in.Tier) + in.Bytes - budget
	if need <= 0 {
		return nil
	}
	victims := evictionOrder(p.entries, in.Tier, in)
	var freeable int64
	for _, v := range victims {
		freeable += v.Bytes
	}
	if freeable < need {
		return fmt.Errorf("%w: %s needs %d more bytes in the %s tier, and only %d bytes are held by unpinned copies of priority %d or lower",
			ErrNoRoom, in.Key, need, in.Tier, freeable, in.Priority)
	}
	for _, v := range victims {
		if need <= 0 {
			break
		}
		p.remove(v.Key, v.Tier)
		need -= v.Bytes
		if v.Tier == v1alpha1.TierHot && depth == 0 && !v.NoWarm && !p.has(v.Key, v1alpha1.TierWarm) {
			demoted := v
			demoted.Tier = v1alpha1.TierWarm
			saved := append([]nodeapi.Action(nil), p.actions...)
			savedEntries := append([]nodeapi.Entry(nil), p.entries...)
			if err := p.makeRoom(demoted, depth+1); err == nil {
				p.entries = append(p.entries, demoted)
				p.actions = append(p.actions, nodeapi.Action{Kind: nodeapi.ActionDemote, Key: v.Key, From: v1alpha1.TierHot, Bytes: v.Bytes})
				continue
			}
			p.actions, p.entries = saved, savedEntries
		}
		p.actions = append(p.actions, nodeapi.Action{Kind: nodeapi.ActionDrop, Key: v.Key, From: v.Tier, Bytes: v.Bytes})
	}
	return nil
}
