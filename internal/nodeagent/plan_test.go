package nodeagent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// entry builds a copy: name in namespace "ns", tier, size, priority, and
// the minute it was last used.
func entry(name string, tier v1alpha1.Tier, bytes int64, prio int32, minute int) nodeapi.Entry {
	return nodeapi.Entry{Key: nodeapi.Key{Namespace: "ns", Name: name}, Tier: tier, Bytes: bytes, Priority: prio, LastUsed: t0.Add(time.Duration(minute) * time.Minute)}
}

func act(kind nodeapi.ActionKind, name string, from v1alpha1.Tier, bytes int64) nodeapi.Action {
	return nodeapi.Action{Kind: kind, Key: nodeapi.Key{Namespace: "ns", Name: name}, From: from, Bytes: bytes}
}

// offloadEntry is an engine's level-1 offload as Store.Entries lists it.
func offloadEntry(name string, bytes int64) nodeapi.Entry {
	e := entry(name, v1alpha1.TierHot, bytes, 0, 0)
	e.Pinned, e.Offload = true, true
	return e
}

func TestPlanAdmit(t *testing.T) {
	budgets := nodeapi.Budgets{Hot: 100, Warm: 200}
	noWarmEntry := func(e nodeapi.Entry) nodeapi.Entry { e.NoWarm = true; return e }
	pinned := entry("p", v1alpha1.TierHot, 60, 0, 0)
	pinned.Pinned = true
	for _, c := range []struct {
		name    string
		entries []nodeapi.Entry
		budgets nodeapi.Budgets
		in      nodeapi.Entry
		want    []nodeapi.Action
		wantErr string
	}{
		{
			name:    "fits without eviction",
			entries: []nodeapi.Entry{entry("a", v1alpha1.TierHot, 40, 0, 1)},
			in:      entry("new", v1alpha1.TierHot, 60, 0, 9),
		},
		{
			name:    "least recently used goes first within a priority",
			entries: []nodeapi.Entry{entry("recent", v1alpha1.TierHot, 40, 0, 5), entry("old", v1alpha1.TierHot, 40, 0, 1)},
			in:      entry("new", v1alpha1.TierHot, 50, 0, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDemote, "old", v1alpha1.TierHot, 40)},
		},
		{
			name:    "lower priority goes before older",
			entries: []nodeapi.Entry{entry("old-important", v1alpha1.TierHot, 40, 10, 1), entry("recent-cheap", v1alpha1.TierHot, 40, 1, 5)},
			in:      entry("new", v1alpha1.TierHot, 50, 10, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDemote, "recent-cheap", v1alpha1.TierHot, 40)},
		},
		{
			name:    "a higher priority is never evicted for a lower one",
			entries: []nodeapi.Entry{entry("vip", v1alpha1.TierHot, 80, 100, 1)},
			in:      entry("new", v1alpha1.TierHot, 50, 1, 9),
			wantErr: "only 0 bytes are held by unpinned copies of priority 1 or lower",
		},
		{
			name:    "pinned copies stay",
			entries: []nodeapi.Entry{pinned, entry("b", v1alpha1.TierHot, 30, 0, 2)},
			in:      entry("new", v1alpha1.TierHot, 50, 0, 9),
			wantErr: "needs 40 more bytes",
		},
		{
			name:    "larger than the budget",
			in:      entry("huge", v1alpha1.TierHot, 101, 0, 9),
			wantErr: "the Hot budget is 100",
		},
		{
			name:    "hot copy already in warm is dropped, not demoted",
			entries: []nodeapi.Entry{entry("a", v1alpha1.TierHot, 60, 0, 1), entry("a", v1alpha1.TierWarm, 60, 0, 1)},
			in:      entry("new", v1alpha1.TierHot, 50, 0, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDrop, "a", v1alpha1.TierHot, 60)},
		},
		{
			name: "demotion makes room in warm first",
			entries: []nodeapi.Entry{
				entry("a", v1alpha1.TierHot, 60, 0, 3),
				entry("w1", v1alpha1.TierWarm, 100, 0, 1), entry("w2", v1alpha1.TierWarm, 90, 0, 2),
			},
			in:   entry("new", v1alpha1.TierHot, 50, 0, 9),
			want: []nodeapi.Action{act(nodeapi.ActionDrop, "w1", v1alpha1.TierWarm, 100), act(nodeapi.ActionDemote, "a", v1alpha1.TierHot, 60)},
		},
		{
			name:    "an application without a warm tier (NoWarm): its hot copy is dropped, not demoted, though warm has room",
			entries: []nodeapi.Entry{noWarmEntry(entry("a", v1alpha1.TierHot, 60, 0, 1))},
			in:      entry("new", v1alpha1.TierHot, 50, 0, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDrop, "a", v1alpha1.TierHot, 60)},
		},
		{
			name: "demotion impossible: the hot copy is dropped",
			entries: []nodeapi.Entry{
				entry("a", v1alpha1.TierHot, 60, 5, 3),
				entry("w", v1alpha1.TierWarm, 190, 9, 1),
			},
			in:   entry("new", v1alpha1.TierHot, 50, 5, 9),
			want: []nodeapi.Action{act(nodeapi.ActionDrop, "a", v1alpha1.TierHot, 60)},
		},
		{
			name:    "several victims in order",
			entries: []nodeapi.Entry{entry("c", v1alpha1.TierWarm, 50, 0, 3), entry("a", v1alpha1.TierWarm, 50, 0, 1), entry("b", v1alpha1.TierWarm, 50, 0, 2), entry("d", v1alpha1.TierWarm, 50, 0, 4)},
			in:      entry("new", v1alpha1.TierWarm, 120, 0, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDrop, "a", v1alpha1.TierWarm, 50), act(nodeapi.ActionDrop, "b", v1alpha1.TierWarm, 50), act(nodeapi.ActionDrop, "c", v1alpha1.TierWarm, 50)},
		},
		{
			name:    "a copy of the same key is replaced, not counted",
			entries: []nodeapi.Entry{entry("new", v1alpha1.TierHot, 90, 0, 1)},
			in:      entry("new", v1alpha1.TierHot, 90, 0, 9),
		},
		{
			name:    "an engine's offload counts against the hot budget and is never evicted",
			entries: []nodeapi.Entry{offloadEntry("sleeper", 60), entry("a", v1alpha1.TierHot, 30, 9, 1)},
			in:      entry("new", v1alpha1.TierHot, 50, 9, 9),
			wantErr: "needs 40 more bytes in the Hot tier, and only 30 bytes",
		},
		{
			name:    "with an engine's offload present, the agent's own copies make the room",
			entries: []nodeapi.Entry{offloadEntry("sleeper", 40), entry("a", v1alpha1.TierHot, 40, 0, 1)},
			in:      entry("new", v1alpha1.TierHot, 50, 0, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDemote, "a", v1alpha1.TierHot, 40)},
		},
		{
			name:    "an offload of the admitted name is not the copy it replaces",
			entries: []nodeapi.Entry{offloadEntry("new", 60)},
			in:      entry("new", v1alpha1.TierHot, 50, 0, 9),
			wantErr: "needs 10 more bytes",
		},
		{
			name:    "the agent's copy is evicted, the engine's offload of the same name is not",
			entries: []nodeapi.Entry{offloadEntry("a", 50), entry("a", v1alpha1.TierHot, 30, 0, 1)},
			in:      entry("new", v1alpha1.TierHot, 40, 0, 9),
			want:    []nodeapi.Action{act(nodeapi.ActionDemote, "a", v1alpha1.TierHot, 30)},
		},
		{
			name:    "cold is not the agent's",
			in:      entry("x", v1alpha1.TierCold, 1, 0, 0),
			wantErr: "not \"Cold\"",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := budgets
			if c.budgets != (nodeapi.Budgets{}) {
				b = c.budgets
			}
			got, err := PlanAdmit(c.entries, b, c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, c.wantErr)
				}
				if c.in.Tier != v1alpha1.TierCold && !errors.Is(err, ErrNoRoom) {
					t.Fatalf("err %v is not ErrNoRoom", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}
