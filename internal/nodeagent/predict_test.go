package nodeagent

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// at is t0 plus a duration.
func at(d time.Duration) time.Time { return t0.Add(d) }

// every returns n wakes spaced by step, the first at first.
func every(first time.Time, step time.Duration, n int) []time.Time {
	var out []time.Time
	for i := range n {
		out = append(out, first.Add(time.Duration(i)*step))
	}
	return out
}

func TestPredictWake(t *testing.T) {
	h := time.Hour
	day := 24 * h
	for _, c := range []struct {
		name   string
		wakes  []time.Time
		now    time.Time
		want   nodeapi.Prediction
		wantOK bool
	}{
		{name: "no history", now: at(h)},
		{name: "two wakes are one interval: not enough", wakes: every(t0, h, 2), now: at(90 * time.Minute)},
		{
			name: "hourly: the last wake plus the interval", wakes: every(t0, h, 4), now: at(3*h + 10*time.Minute),
			want: nodeapi.Prediction{Next: at(4 * h), Pattern: nodeapi.PatternPeriodic, Period: h}, wantOK: true,
		},
		{
			name:  "jitter within a fifth of the interval: the median",
			wakes: []time.Time{t0, at(62 * time.Minute), at(119 * time.Minute), at(181 * time.Minute)}, now: at(200 * time.Minute),
			want: nodeapi.Prediction{Next: at(243 * time.Minute), Pattern: nodeapi.PatternPeriodic, Period: 62 * time.Minute}, wantOK: true,
		},
		{
			name:  "irregular intervals predict nothing",
			wakes: []time.Time{t0, at(10 * time.Minute), at(70 * time.Minute), at(75 * time.Minute)}, now: at(80 * time.Minute),
		},
		{
			name: "one wake missed: the period after", wakes: every(t0, h, 4), now: at(4*h + 30*time.Minute),
			want: nodeapi.Prediction{Next: at(5 * h), Pattern: nodeapi.PatternPeriodic, Period: h}, wantOK: true,
		},
		{name: "two wakes missed: the pattern is broken", wakes: every(t0, h, 4), now: at(5*h + 30*time.Minute)},
		{
			name: "only the last intervals count", wakes: append([]time.Time{at(-50 * h)}, every(t0, 10*time.Minute, 7)...), now: at(61 * time.Minute),
			want: nodeapi.Prediction{Next: at(70 * time.Minute), Pattern: nodeapi.PatternPeriodic, Period: 10 * time.Minute}, wantOK: true,
		},
		{
			// 09:00 and 17:00 every day: the intervals alternate 8 h and
			// 16 h, so only the daily pattern sees it.
			name:  "daily at two times: the next of them",
			wakes: []time.Time{at(9 * h), at(17 * h), at(day + 9*h + 5*time.Minute), at(day + 17*h - 3*time.Minute), at(2*day + 9*h)},
			now:   at(2*day + 12*h),
			// The earliest of the day's wakes at that time: 16:57.
			want: nodeapi.Prediction{Next: at(2*day + 17*h - 3*time.Minute), Pattern: nodeapi.PatternDaily}, wantOK: true,
		},
		{
			name:  "daily: tomorrow once today's time has passed",
			wakes: []time.Time{at(9 * h), at(day + 9*h), at(day + 13*h)}, now: at(day + 14*h),
			want: nodeapi.Prediction{Next: at(2*day + 9*h), Pattern: nodeapi.PatternDaily}, wantOK: true,
		},
		{
			name:  "a daily time on one day only predicts nothing",
			wakes: []time.Time{at(9 * h), at(13 * h), at(day + 11*h)}, now: at(day + 12*h),
		},
		{
			name:  "daily wakes older than the window predict nothing",
			wakes: []time.Time{at(9 * h), at(day + 9*h)}, now: at(20 * day),
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := PredictWake(c.wakes, c.now)
			if ok != c.wantOK {
				t.Fatalf("PredictWake ok = %v (%+v), want %v", ok, got, c.wantOK)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("PredictWake (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWakeHistoryPredictSeesSleeps(t *testing.T) {
	m := time.Minute
	hourly := every(t0, time.Hour, 4) // periodic: next at 4 h
	for _, c := range []struct {
		name          string
		wakes, sleeps []time.Time
		now           time.Time
		want          nodeapi.Prediction
		wantOK        bool
	}{
		{
			name: "no sleep reported: the wakes alone", wakes: hourly, now: at(3*time.Hour + 10*m),
			want: nodeapi.Prediction{Next: at(4 * time.Hour), Pattern: nodeapi.PatternPeriodic, Period: time.Hour}, wantOK: true,
		},
		{
			name: "asleep: the wakes' pattern still holds", wakes: hourly, sleeps: []time.Time{at(3*time.Hour + 5*m)}, now: at(3*time.Hour + 10*m),
			want: nodeapi.Prediction{Next: at(4 * time.Hour), Pattern: nodeapi.PatternPeriodic, Period: time.Hour}, wantOK: true,
		},
		{
			name: "awake: a wake after the last sleep, nothing to promote", wakes: hourly, sleeps: []time.Time{at(2*time.Hour + 5*m)}, now: at(3*time.Hour + 10*m),
		},
		{
			// Busy 5, 40 and 15 minutes; back 20 minutes after each sleep.
			name:   "irregular wakes, steady time after a sleep",
			wakes:  []time.Time{t0, at(25 * m), at(85 * m)},
			sleeps: []time.Time{at(5 * m), at(65 * m), at(100 * m)},
			now:    at(101 * m),
			want:   nodeapi.Prediction{Next: at(120 * m), Pattern: nodeapi.PatternAfterSleep, Period: 20 * m}, wantOK: true,
		},
		{
			// Hourly wakes (next at 4 h), each sleep 10 minutes after its
			// wake and followed 50 minutes later by the next wake: the
			// last sleep at 3 h 5 m gives 3 h 55 m, the earlier.
			name:   "both patterns: the earlier wake",
			wakes:  hourly,
			sleeps: []time.Time{at(10 * m), at(70 * m), at(130 * m), at(185 * m)},
			now:    at(186 * m),
			want:   nodeapi.Prediction{Next: at(235 * m), Pattern: nodeapi.PatternAfterSleep, Period: 50 * m}, wantOK: true,
		},
		{
			name:   "times after a sleep that disagree predict nothing",
			wakes:  []time.Time{t0, at(25 * m), at(125 * m)},
			sleeps: []time.Time{at(5 * m), at(65 * m), at(130 * m)},
			now:    at(131 * m),
		},
		{
			name:   "one time after a sleep is not a pattern",
			wakes:  []time.Time{t0, at(25 * m)},
			sleeps: []time.Time{at(5 * m), at(30 * m)},
			now:    at(31 * m),
		},
		{
			name:   "the after-sleep wake passed long ago: broken",
			wakes:  []time.Time{t0, at(25 * m), at(85 * m)},
			sleeps: []time.Time{at(5 * m), at(65 * m), at(100 * m)},
			now:    at(200 * m),
		},
		{
			name:   "two sleeps without a wake between them make no gap",
			wakes:  []time.Time{t0, at(25 * m), at(85 * m)},
			sleeps: []time.Time{at(5 * m), at(10 * m), at(65 * m), at(100 * m)},
			now:    at(101 * m),
			want:   nodeapi.Prediction{Next: at(120 * m), Pattern: nodeapi.PatternAfterSleep, Period: 20 * m}, wantOK: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := WakeHistory{Wakes: c.wakes, Sleeps: c.sleeps}
			got, ok := h.Predict(c.now)
			if ok != c.wantOK {
				t.Fatalf("Predict ok = %v (%+v), want %v", ok, got, c.wantOK)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Predict (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWakeHistoryAddKeepsOrderAndBound(t *testing.T) {
	var h WakeHistory
	for i := range maxWakeHistory + 5 {
		h.Add(at(time.Duration(maxWakeHistory+5-i) * time.Minute))
	}
	h.Add(at(1000 * time.Minute))
	if len(h.Wakes) != maxWakeHistory {
		t.Fatalf("%d wakes kept, want %d", len(h.Wakes), maxWakeHistory)
	}
	for i := 1; i < len(h.Wakes); i++ {
		if !h.Wakes[i-1].Before(h.Wakes[i]) {
			t.Fatalf("wakes out of order at %d: %v", i, h.Wakes)
		}
	}
	if h.Wakes[len(h.Wakes)-1] != at(1000*time.Minute) {
		t.Errorf("the newest wake was not kept: %v", h.Wakes[len(h.Wakes)-1])
	}
}

func TestPlanPromotions(t *testing.T) {
	const gb = 1 << 30
	now := at(10 * time.Hour)
	// hourly is a history whose next wake is in `in`.
	hourly := func(name string, bytes int64, prio int32, in time.Duration) WakeHistory {
		return WakeHistory{Key: nodeapi.Key{Namespace: "ns", Name: name}, Bytes: bytes, Priority: prio, Wakes: every(now.Add(in-3*time.Hour), time.Hour, 3), ColdPath: name + "/weights.bin"}
	}
	bps := map[v1alpha1.Tier]float64{v1alpha1.TierHot: 8e9, v1alpha1.TierWarm: 1e9}
	budgets := nodeapi.Budgets{Hot: 2 * gb, Warm: 10 * gb}
	margin := 5 * time.Second
	// 1 GiB from warm at 1 GB/s: 1.07 s, plus the margin.
	g := float64(gb)
	warmLead := time.Duration(g/1e9*float64(time.Second)) + margin
	coldLead := time.Duration((g/DefaultColdBytesPerSecond+g/1e9)*float64(time.Second)) + margin
	coldHotLead := time.Duration(g/DefaultColdBytesPerSecond*float64(time.Second)) + margin
	noWarm := func(h WakeHistory) WakeHistory { h.NoWarm = true; return h }
	predicted := func(in time.Duration) nodeapi.Prediction {
		return nodeapi.Prediction{Next: now.Add(in), Pattern: nodeapi.PatternPeriodic, Period: time.Hour}
	}
	for _, c := range []struct {
		name         string
		entries      []nodeapi.Entry
		histories    []WakeHistory
		bps          map[v1alpha1.Tier]float64
		noCold       bool
		want         []nodeapi.Promotion
		wantDeferred []string // key: reason substring
	}{
		{
			name:      "a warm copy whose wake is closer than its copy time goes hot",
			entries:   []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1)},
			histories: []WakeHistory{hourly("a", gb, 0, 4*time.Second)},
			want:      []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, From: v1alpha1.TierWarm, To: v1alpha1.TierHot, Bytes: gb, Wake: predicted(4 * time.Second), Lead: warmLead}},
		},
		{
			name:      "a wake further than the copy time waits",
			entries:   []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1)},
			histories: []WakeHistory{hourly("a", gb, 0, time.Minute)},
		},
		{
			name:      "already hot: a copy",
			entries:   []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1), entry("a", v1alpha1.TierHot, gb, 0, 1)},
			histories: []WakeHistory{hourly("a", gb, 0, time.Second)},
		},
		{
			name:      "already hot: the engine's own offload",
			entries:   []nodeapi.Entry{offloadEntry("a", gb)},
			histories: []WakeHistory{hourly("a", gb, 0, time.Second)},
		},
		{
			name:      "only a cold copy: cold to warm first, with the time of both copies",
			histories: []WakeHistory{hourly("a", gb, 0, 10*time.Second)},
			want:      []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, From: v1alpha1.TierCold, To: v1alpha1.TierWarm, Bytes: gb, Wake: predicted(10 * time.Second), Lead: coldLead}},
		},
		{
			name:      "no warm tier (tiers.warm: None), only a cold copy: cold straight to hot, with the time of that one copy",
			histories: []WakeHistory{noWarm(hourly("a", gb, 0, 10*time.Second))},
			want:      []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, From: v1alpha1.TierCold, To: v1alpha1.TierHot, Bytes: gb, Wake: predicted(10 * time.Second), Lead: coldHotLead}},
		},
		{
			// Due for cold → warm → hot (coldLead), not yet for the one
			// copy cold → hot: nothing, and no warm copy first.
			name:      "no warm tier, the wake further than the cold copy takes: nothing",
			histories: []WakeHistory{noWarm(hourly("a", gb, 0, (coldLead+coldHotLead)/2))},
		},
		{
			name:         "no warm tier, no cold tier to read: deferred, to the hot tier",
			histories:    []WakeHistory{noWarm(hourly("a", gb, 0, 10*time.Second))},
			noCold:       true,
			wantDeferred: []string{"ns/a→Hot: no copy on the node"},
		},
		{
			name:         "only a cold copy and no cold tier: deferred",
			histories:    []WakeHistory{hourly("a", gb, 0, 10*time.Second)},
			noCold:       true,
			wantDeferred: []string{"ns/a→Warm: no copy on the node"},
		},
		{
			name: "only a cold copy in S3, a source of the agent's: cold to warm, at the rate the agent measured",
			histories: []WakeHistory{func() WakeHistory {
				h := hourly("a", gb, 0, 10*time.Second)
				h.ColdPath, h.ColdS3, h.ColdBytesPerSecond = "", "a", 50e6
				return h
			}()},
			noCold: true, // no --cold-dir: S3 alone
			want: []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, From: v1alpha1.TierCold, To: v1alpha1.TierWarm, Bytes: gb, Wake: predicted(10 * time.Second),
				Lead: time.Duration((g/50e6+g/1e9)*float64(time.Second)) + margin}},
		},
		{
			name: "only a cold copy in S3, a source the agent lacks: deferred",
			histories: []WakeHistory{func() WakeHistory {
				h := hourly("a", gb, 0, 10*time.Second)
				h.ColdPath, h.ColdS3 = "", "other"
				return h
			}()},
			wantDeferred: []string{"ns/a→Warm: no copy on the node and no cold tier to read"},
		},
		{
			name:         "warm bandwidth not measured: deferred when the wake is near",
			entries:      []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1)},
			histories:    []WakeHistory{hourly("a", gb, 0, 2*time.Second)},
			bps:          map[v1alpha1.Tier]float64{},
			wantDeferred: []string{"ns/a→Hot: promoting ns/a from the Warm tier: read bandwidth not measured"},
		},
		{
			name:      "the hot budget: the least recently used copy of no higher priority is demoted",
			entries:   []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1), entry("old", v1alpha1.TierHot, gb, 0, 1), entry("recent", v1alpha1.TierHot, gb, 0, 5)},
			histories: []WakeHistory{hourly("a", gb, 0, 3*time.Second)},
			want: []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, From: v1alpha1.TierWarm, To: v1alpha1.TierHot, Bytes: gb, Wake: predicted(3 * time.Second), Lead: warmLead,
				Evictions: []nodeapi.Action{act(nodeapi.ActionDemote, "old", v1alpha1.TierHot, gb)}}},
		},
		{
			name:         "the hot budget: a copy of higher priority is never evicted",
			entries:      []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1), entry("vip", v1alpha1.TierHot, 2*gb, 5, 1)},
			histories:    []WakeHistory{hourly("a", gb, 0, 3*time.Second)},
			wantDeferred: []string{"ns/a→Hot: no room in the tier"},
		},
		{
			name:         "the hot budget: an engine's offload is never evicted",
			entries:      []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1), offloadEntry("sleeper", 2*gb)},
			histories:    []WakeHistory{hourly("a", gb, 0, 3*time.Second)},
			wantDeferred: []string{"ns/a→Hot: no room in the tier"},
		},
		{
			// Both are due; the hot tier holds one. The earlier wake goes
			// first and the second may not evict the first's fresh copy.
			name:      "two due, room for one: the earlier wake wins",
			entries:   []nodeapi.Entry{entry("late", v1alpha1.TierWarm, 2*gb, 0, 1), entry("early", v1alpha1.TierWarm, 2*gb, 0, 1)},
			histories: []WakeHistory{hourly("late", 2*gb, 0, 4*time.Second), hourly("early", 2*gb, 0, 3*time.Second)},
			want: []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "early"}, From: v1alpha1.TierWarm, To: v1alpha1.TierHot, Bytes: 2 * gb, Wake: predicted(3 * time.Second),
				Lead: time.Duration(2*g/1e9*float64(time.Second)) + margin}},
			wantDeferred: []string{"ns/late→Hot: no room in the tier"},
		},
		{
			// Busy for 5, 40 and 15 minutes, asked for again 20 minutes
			// after each sleep: the wakes are irregular, the sleeps tell.
			name:    "just went to sleep: the after-sleep pattern promotes ahead",
			entries: []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1)},
			histories: []WakeHistory{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, Bytes: gb,
				Wakes:  []time.Time{now.Add(-140 * time.Minute), now.Add(-115 * time.Minute), now.Add(-55 * time.Minute)},
				Sleeps: []time.Time{now.Add(-135 * time.Minute), now.Add(-75 * time.Minute), now.Add(-20*time.Minute + 3*time.Second)}}},
			want: []nodeapi.Promotion{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, From: v1alpha1.TierWarm, To: v1alpha1.TierHot, Bytes: gb,
				Wake: nodeapi.Prediction{Next: now.Add(3 * time.Second), Pattern: nodeapi.PatternAfterSleep, Period: 20 * time.Minute}, Lead: warmLead}},
		},
		{
			name:    "awake: its engines hold the weights, no promotion",
			entries: []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1)},
			histories: []WakeHistory{func() WakeHistory {
				h := hourly("a", gb, 0, 4*time.Second)
				h.Sleeps = []time.Time{h.Wakes[1].Add(10 * time.Minute)} // the last wake came after it
				return h
			}()},
		},
		{
			name:      "no prediction, no promotion",
			entries:   []nodeapi.Entry{entry("a", v1alpha1.TierWarm, gb, 0, 1)},
			histories: []WakeHistory{{Key: nodeapi.Key{Namespace: "ns", Name: "a"}, Bytes: gb, Wakes: []time.Time{now.Add(-time.Hour)}}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := PromotionInput{Now: now, Entries: c.entries, Budgets: budgets, Histories: c.histories, ReadBytesPerSecond: bps, ColdTier: !c.noCold, ColdS3: []string{"a"}, Margin: margin}
			if c.bps != nil {
				in.ReadBytesPerSecond = c.bps
			}
			got, deferred := PlanPromotions(in)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("promotions (-want +got):\n%s", diff)
			}
			var reasons []string
			for _, d := range deferred {
				reasons = append(reasons, d.String()+"→"+string(d.To)+": "+d.Reason)
			}
			if len(reasons) != len(c.wantDeferred) {
				t.Fatalf("deferred %q, want %q", reasons, c.wantDeferred)
			}
			for i, w := range c.wantDeferred {
				if !strings.HasPrefix(reasons[i], w) {
					t.Errorf("deferred[%d] = %q, want it to start with %q", i, reasons[i], w)
				}
			}
		})
	}
}
