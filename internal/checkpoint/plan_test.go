package checkpoint

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// entry builds a copy: name in namespace "ns", tier, size, priority, and
// the minute it was last used.
func entry(name string, tier Tier, bytes int64, prio int32, minute int) Entry {
	return Entry{Key: Key{Namespace: "ns", Name: name}, Tier: tier, Bytes: bytes, Priority: prio, LastUsed: t0.Add(time.Duration(minute) * time.Minute)}
}

func act(kind ActionKind, name string, from Tier, bytes int64) Action {
	return Action{Kind: kind, Key: Key{Namespace: "ns", Name: name}, From: from, Bytes: bytes}
}

// offloadEntry is an engine's level-1 offload as Store.Entries lists it.
func offloadEntry(name string, bytes int64) Entry {
	e := entry(name, TierHot, bytes, 0, 0)
	e.Pinned, e.Offload = true, true
	return e
}

func TestPlanAdmit(t *testing.T) {
	budgets := Budgets{Hot: 100, Warm: 200}
	noWarmEntry := func(e Entry) Entry { e.NoWarm = true; return e }
	pinned := entry("p", TierHot, 60, 0, 0)
	pinned.Pinned = true
	for _, c := range []struct {
		name    string
		entries []Entry
		budgets Budgets
		in      Entry
		want    []Action
		wantErr string
	}{
		{
			name:    "fits without eviction",
			entries: []Entry{entry("a", TierHot, 40, 0, 1)},
			in:      entry("new", TierHot, 60, 0, 9),
		},
		{
			name:    "least recently used goes first within a priority",
			entries: []Entry{entry("recent", TierHot, 40, 0, 5), entry("old", TierHot, 40, 0, 1)},
			in:      entry("new", TierHot, 50, 0, 9),
			want:    []Action{act(Demote, "old", TierHot, 40)},
		},
		{
			name:    "lower priority goes before older",
			entries: []Entry{entry("old-important", TierHot, 40, 10, 1), entry("recent-cheap", TierHot, 40, 1, 5)},
			in:      entry("new", TierHot, 50, 10, 9),
			want:    []Action{act(Demote, "recent-cheap", TierHot, 40)},
		},
		{
			name:    "a higher priority is never evicted for a lower one",
			entries: []Entry{entry("vip", TierHot, 80, 100, 1)},
			in:      entry("new", TierHot, 50, 1, 9),
			wantErr: "only 0 bytes are held by unpinned copies of priority 1 or lower",
		},
		{
			name:    "pinned copies stay",
			entries: []Entry{pinned, entry("b", TierHot, 30, 0, 2)},
			in:      entry("new", TierHot, 50, 0, 9),
			wantErr: "needs 40 more bytes",
		},
		{
			name:    "larger than the budget",
			in:      entry("huge", TierHot, 101, 0, 9),
			wantErr: "the hot budget is 100",
		},
		{
			name:    "hot copy already in warm is dropped, not demoted",
			entries: []Entry{entry("a", TierHot, 60, 0, 1), entry("a", TierWarm, 60, 0, 1)},
			in:      entry("new", TierHot, 50, 0, 9),
			want:    []Action{act(Drop, "a", TierHot, 60)},
		},
		{
			name: "demotion makes room in warm first",
			entries: []Entry{
				entry("a", TierHot, 60, 0, 3),
				entry("w1", TierWarm, 100, 0, 1), entry("w2", TierWarm, 90, 0, 2),
			},
			in:   entry("new", TierHot, 50, 0, 9),
			want: []Action{act(Drop, "w1", TierWarm, 100), act(Demote, "a", TierHot, 60)},
		},
		{
			name:    "an application without a warm tier (NoWarm): its hot copy is dropped, not demoted, though warm has room",
			entries: []Entry{noWarmEntry(entry("a", TierHot, 60, 0, 1))},
			in:      entry("new", TierHot, 50, 0, 9),
			want:    []Action{act(Drop, "a", TierHot, 60)},
		},
		{
			name: "demotion impossible: the hot copy is dropped",
			entries: []Entry{
				entry("a", TierHot, 60, 5, 3),
				entry("w", TierWarm, 190, 9, 1),
			},
			in:   entry("new", TierHot, 50, 5, 9),
			want: []Action{act(Drop, "a", TierHot, 60)},
		},
		{
			name:    "several victims in order",
			entries: []Entry{entry("c", TierWarm, 50, 0, 3), entry("a", TierWarm, 50, 0, 1), entry("b", TierWarm, 50, 0, 2), entry("d", TierWarm, 50, 0, 4)},
			in:      entry("new", TierWarm, 120, 0, 9),
			want:    []Action{act(Drop, "a", TierWarm, 50), act(Drop, "b", TierWarm, 50), act(Drop, "c", TierWarm, 50)},
		},
		{
			name:    "a copy of the same key is replaced, not counted",
			entries: []Entry{entry("new", TierHot, 90, 0, 1)},
			in:      entry("new", TierHot, 90, 0, 9),
		},
		{
			name:    "an engine's offload counts against the hot budget and is never evicted",
			entries: []Entry{offloadEntry("sleeper", 60), entry("a", TierHot, 30, 9, 1)},
			in:      entry("new", TierHot, 50, 9, 9),
			wantErr: "needs 40 more bytes in the hot tier, and only 30 bytes",
		},
		{
			name:    "with an engine's offload present, the agent's own copies make the room",
			entries: []Entry{offloadEntry("sleeper", 40), entry("a", TierHot, 40, 0, 1)},
			in:      entry("new", TierHot, 50, 0, 9),
			want:    []Action{act(Demote, "a", TierHot, 40)},
		},
		{
			name:    "an offload of the admitted name is not the copy it replaces",
			entries: []Entry{offloadEntry("new", 60)},
			in:      entry("new", TierHot, 50, 0, 9),
			wantErr: "needs 10 more bytes",
		},
		{
			name:    "the agent's copy is evicted, the engine's offload of the same name is not",
			entries: []Entry{offloadEntry("a", 50), entry("a", TierHot, 30, 0, 1)},
			in:      entry("new", TierHot, 40, 0, 9),
			want:    []Action{act(Demote, "a", TierHot, 30)},
		},
		{
			name:    "cold is not the agent's",
			in:      entry("x", TierCold, 1, 0, 0),
			wantErr: "not \"cold\"",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := budgets
			if c.budgets != (Budgets{}) {
				b = c.budgets
			}
			got, err := PlanAdmit(c.entries, b, c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, c.wantErr)
				}
				if c.in.Tier != TierCold && !errors.Is(err, ErrNoRoom) {
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
