package nodeagent

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// Wake prediction and promotion ahead of it (docs/checkpoint.md,
// "Promotion ahead of a predicted wake"). Both steps are pure: they read a
// wake and sleep history, the store's entries and the measured bandwidths, and
// return what to copy, so that the IO stays in Node.PromoteAhead.

// Prediction tuning. One owner for each number: these constants.
const (
	// maxWakeHistory bounds the wakes kept per artifact (a week of four
	// wakes a day fits).
	maxWakeHistory = 32
	// periodicIntervals is how many of the last intervals the periodic
	// pattern looks at; periodicMinIntervals the fewest it needs.
	periodicIntervals    = 6
	periodicMinIntervals = 2
	// periodicTolerance is how far (a fraction of the median) each of
	// those intervals may be from their median.
	periodicTolerance = 0.2
	// dailyTolerance is how far apart in the time of day two wakes may be
	// and still count as the same daily wake.
	dailyTolerance = 20 * time.Minute
	// dailyWindow is how far back the daily pattern looks.
	dailyWindow = 8 * 24 * time.Hour
	// DefaultColdBytesPerSecond is used for the cold tier's read bandwidth
	// until a wake from the cold tier has measured it.
	DefaultColdBytesPerSecond = 100e6
)

// WakeHistory is what the node agent knows about one artifact's wakes and
// sleeps: when they happened (oldest first), the bytes they restored, and
// where a cold copy is.
type WakeHistory struct {
	nodeapi.Key
	Wakes []time.Time `json:"wakes"`
	// Sleeps are when the engines went to sleep, as the lifecycle leader
	// reports them (POST /sleeps). Without any, the engines' state is not
	// known and only the wakes count.
	Sleeps []time.Time `json:"sleeps,omitempty"`
	// Bytes of the weights (the last wake's).
	Bytes int64 `json:"bytes"`
	// Digest the copies must hash to, when known.
	Digest   string `json:"digest,omitempty"`
	Priority int32  `json:"priority,omitempty"`
	// ColdPath is the artifact inside the agent's cold tier (--cold-dir),
	// when the leader knows one.
	ColdPath string `json:"coldPath,omitempty"`
	// ColdS3 names the agent's S3 cold source (--cold-s3) holding the
	// artifact, when its cold tier is S3 (then ColdPath is empty).
	ColdS3 string `json:"coldS3,omitempty"`
	// ColdBytesPerSecond is the rate of the last read from the cold tier
	// (0: none measured yet): an engine's wake from the model cache, or
	// the agent's own copy from S3.
	ColdBytesPerSecond float64 `json:"coldBytesPerSecond,omitempty"`
	// NoWarm is the last wake's WakeRecord.NoWarm: the application has no
	// warm tier, so its promotions skip it (up).
	NoWarm bool `json:"noWarm,omitempty"`
}

// Add records a wake at, keeping the last maxWakeHistory in time order.
func (h *WakeHistory) Add(at time.Time) { h.Wakes = addBounded(h.Wakes, at) }

// AddSleep records a sleep at, keeping the last maxWakeHistory in time
// order.
func (h *WakeHistory) AddSleep(at time.Time) { h.Sleeps = addBounded(h.Sleeps, at) }

func addBounded(ts []time.Time, at time.Time) []time.Time {
	i, _ := slices.BinarySearchFunc(ts, at, time.Time.Compare)
	ts = slices.Insert(ts, i, at)
	if k := len(ts) - maxWakeHistory; k > 0 {
		ts = ts[k:]
	}
	return ts
}

// Awake reports whether the engines are awake as far as the history
// tells: a wake came after the last sleep. Without sleeps it cannot tell
// (false).
func (h WakeHistory) Awake() bool {
	return len(h.Sleeps) > 0 && len(h.Wakes) > 0 && h.Wakes[len(h.Wakes)-1].After(h.Sleeps[len(h.Sleeps)-1])
}

// Predict predicts the artifact's next wake after now. Awake engines hold
// their weights: nothing to predict. Asleep (or with no sleep reported),
// the earliest of PredictWake's and the after-sleep pattern's
// predictions, so that a promotion is ready for whichever comes first.
func (h WakeHistory) Predict(now time.Time) (nodeapi.Prediction, bool) {
	if h.Awake() {
		return nodeapi.Prediction{}, false
	}
	p, ok := PredictWake(h.Wakes, now)
	if q, qok := predictAfterSleep(h.Wakes, h.Sleeps, now); qok && (!ok || q.Next.Before(p.Next)) {
		return q, true
	}
	return p, ok
}

// predictAfterSleep measures, for each wake, the time since the engines
// fell asleep before it (the first sleep after the previous wake) and,
// when the last periodicIntervals of those times agree (at least
// periodicMinIntervals, each within periodicTolerance of their median),
// predicts the time the engines fell asleep last plus the median: unless
// that passed more than the tolerance ago (the pattern is then broken).
// Engines not asleep since the last wake get no prediction.
func predictAfterSleep(wakes, sleeps []time.Time, now time.Time) (nodeapi.Prediction, bool) {
	// firstSleepAfter is the first sleep after t, if any.
	firstSleepAfter := func(t time.Time) (time.Time, bool) {
		i, _ := slices.BinarySearchFunc(sleeps, t, time.Time.Compare)
		for i < len(sleeps) && !sleeps[i].After(t) {
			i++
		}
		if i == len(sleeps) {
			return time.Time{}, false
		}
		return sleeps[i], true
	}
	var gaps []time.Duration
	for j := 1; j < len(wakes); j++ {
		if s, ok := firstSleepAfter(wakes[j-1]); ok && s.Before(wakes[j]) {
			gaps = append(gaps, wakes[j].Sub(s))
		}
	}
	if len(wakes) == 0 {
		return nodeapi.Prediction{}, false
	}
	asleep, ok := firstSleepAfter(wakes[len(wakes)-1])
	if !ok {
		return nodeapi.Prediction{}, false
	}
	median, ok := agreeingMedian(gaps[max(0, len(gaps)-periodicIntervals):])
	if !ok {
		return nodeapi.Prediction{}, false
	}
	next := asleep.Add(median)
	if next.Before(now.Add(-time.Duration(float64(median) * periodicTolerance))) {
		return nodeapi.Prediction{}, false
	}
	return nodeapi.Prediction{Next: next, Pattern: nodeapi.PatternAfterSleep, Period: median}, true
}

// agreeingMedian is the median of ds when there are at least
// periodicMinIntervals of them, all within periodicTolerance of it.
func agreeingMedian(ds []time.Duration) (time.Duration, bool) {
	if len(ds) < periodicMinIntervals {
		return 0, false
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		median = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	if median <= 0 {
		return 0, false
	}
	tol := time.Duration(float64(median) * periodicTolerance)
	for _, d := range ds {
		if d < median-tol || d > median+tol {
			return 0, false
		}
	}
	return median, true
}

// PredictWake predicts the next wake after now from wakes (oldest first):
// the periodic pattern when the last intervals agree, else the daily one;
// false when neither holds. A periodic wake whose time passed without a
// wake less than a period ago is moved on by one period; past that the
// pattern is broken and no wake is predicted from it.
func PredictWake(wakes []time.Time, now time.Time) (nodeapi.Prediction, bool) {
	if p, ok := predictPeriodic(wakes, now); ok {
		return p, true
	}
	return predictDaily(wakes, now)
}

func predictPeriodic(wakes []time.Time, now time.Time) (nodeapi.Prediction, bool) {
	if len(wakes) < periodicMinIntervals+1 {
		return nodeapi.Prediction{}, false
	}
	w := wakes[max(0, len(wakes)-periodicIntervals-1):]
	iv := make([]time.Duration, 0, len(w)-1)
	for i := 1; i < len(w); i++ {
		iv = append(iv, w[i].Sub(w[i-1]))
	}
	median, ok := agreeingMedian(iv)
	if !ok {
		return nodeapi.Prediction{}, false
	}
	tol := time.Duration(float64(median) * periodicTolerance)
	next := w[len(w)-1].Add(median)
	if next.Before(now.Add(-tol)) {
		next = next.Add(median) // one wake missed
		if next.Before(now.Add(-tol)) {
			return nodeapi.Prediction{}, false
		}
	}
	return nodeapi.Prediction{Next: next, Pattern: nodeapi.PatternPeriodic, Period: median}, true
}

// predictDaily finds times of day at which wakes came on at least two
// different days of the last dailyWindow (within dailyTolerance of each
// other), and returns the earliest next occurrence of one of those wakes'
// times of day (not before now minus dailyTolerance): of a daily wake that
// came at 17:00 one day and 16:57 the next, 16:57.
func predictDaily(wakes []time.Time, now time.Time) (nodeapi.Prediction, bool) {
	var recent []time.Time
	for _, w := range wakes {
		if !w.Before(now.Add(-dailyWindow)) && !w.After(now) {
			recent = append(recent, w.UTC())
		}
	}
	var best time.Time
	for i, a := range recent {
		days := map[int]bool{a.YearDay() + 1000*a.Year(): true}
		for j, b := range recent {
			if i != j && timeOfDayApart(a, b) <= dailyTolerance {
				days[b.YearDay()+1000*b.Year()] = true
			}
		}
		if len(days) < 2 {
			continue
		}
		// a's time of day, on the first day it is not already past.
		next := time.Date(now.Year(), now.Month(), now.Day(), a.Hour(), a.Minute(), a.Second(), 0, time.UTC)
		for next.Before(now.Add(-dailyTolerance)) {
			next = next.AddDate(0, 0, 1)
		}
		if best.IsZero() || next.Before(best) {
			best = next
		}
	}
	if best.IsZero() {
		return nodeapi.Prediction{}, false
	}
	return nodeapi.Prediction{Next: best, Pattern: nodeapi.PatternDaily}, true
}

// timeOfDayApart is the distance between the times of day of a and b,
// around midnight.
func timeOfDayApart(a, b time.Time) time.Duration {
	day := 24 * time.Hour
	d := (sinceMidnight(a) - sinceMidnight(b)) % day
	if d < 0 {
		d = -d
	}
	return min(d, day-d)
}

func sinceMidnight(t time.Time) time.Duration {
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second
}

// PromotionInput is what PlanPromotions decides from.
type PromotionInput struct {
	Now     time.Time
	Entries []nodeapi.Entry // Store.Entries: copies and engines' offloads
	Budgets nodeapi.Budgets
	// Histories are the wake histories of the node's artifacts.
	Histories []WakeHistory
	// ReadBytesPerSecond is the measured read bandwidth of the warm tier
	// (and hot, unused as a source); 0: not measured, no promotion from it.
	ReadBytesPerSecond map[v1alpha1.Tier]float64
	// ColdTier says whether the agent can read the cold tier (--cold-dir).
	ColdTier bool
	// ColdS3 are the names of the agent's S3 cold sources (--cold-s3).
	ColdS3 []string
	// Margin is added to the copy time: a promotion starts that long
	// before it strictly has to.
	Margin time.Duration
}

// ErrNoBandwidth means a tier's read bandwidth is not measured, so the time
// a promotion from it needs is unknown.
var ErrNoBandwidth = errors.New("read bandwidth not measured")

// PlanPromotions decides which artifacts to copy one tier up now: those
// whose predicted wake is closer than the copies up to the hot tier take
// (bytes ÷ the read bandwidth of each tier they move from, plus the
// margin). Each due artifact moves one step per plan: cold → warm (when
// the agent reads the cold tier and knows the artifact's cold path), warm →
// hot. Admission follows PlanAdmit (the budgets are never exceeded;
// victims lowest priority first, then least recently used) except that
// the copies of other due artifacts are not evicted for it. Earlier
// predicted wakes are planned first, each against the entries the earlier
// ones leave.
func PlanPromotions(in PromotionInput) ([]nodeapi.Promotion, []nodeapi.Deferred) {
	type due struct {
		h    WakeHistory
		p    nodeapi.Prediction
		from v1alpha1.Tier
		lead time.Duration
	}
	entries := slices.Clone(in.Entries)
	has := func(k nodeapi.Key, t v1alpha1.Tier) (nodeapi.Entry, bool) {
		for _, e := range entries {
			if e.Key == k && e.Tier == t {
				return e, true
			}
		}
		return nodeapi.Entry{}, false
	}
	var dues []due
	var deferred []nodeapi.Deferred
	for _, h := range in.Histories {
		p, ok := h.Predict(in.Now)
		if !ok {
			continue
		}
		if _, hot := has(h.Key, v1alpha1.TierHot); hot {
			continue // a copy or the engine's own offload is hot already
		}
		from, bytes := v1alpha1.TierCold, h.Bytes
		if e, ok := has(h.Key, v1alpha1.TierWarm); ok {
			from, bytes = v1alpha1.TierWarm, e.Bytes
		}
		lead, err := promotionLead(from, bytes, h, in.ReadBytesPerSecond)
		if err != nil {
			if p.Next.Sub(in.Now) <= in.Margin {
				deferred = append(deferred, nodeapi.Deferred{Key: h.Key, To: h.up(from), Reason: err.Error()})
			}
			continue
		}
		lead += in.Margin
		if p.Next.Sub(in.Now) > lead {
			continue // not yet
		}
		h.Bytes = bytes
		dues = append(dues, due{h: h, p: p, from: from, lead: lead})
	}
	slices.SortStableFunc(dues, func(a, b due) int {
		if c := a.p.Next.Compare(b.p.Next); c != 0 {
			return c
		}
		if c := cmp.Compare(b.h.Priority, a.h.Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.h.String(), b.h.String())
	})
	protected := map[nodeapi.Key]bool{}
	for _, d := range dues {
		protected[d.h.Key] = true
	}
	var out []nodeapi.Promotion
	for _, d := range dues {
		to := d.h.up(d.from)
		if d.from == v1alpha1.TierCold && !in.readsCold(d.h) {
			deferred = append(deferred, nodeapi.Deferred{Key: d.h.Key, To: to, Reason: "no copy on the node and no cold tier to read (--cold-dir and the wake's coldPath, or --cold-s3 and the wake's coldS3)"})
			continue
		}
		view := make([]nodeapi.Entry, len(entries))
		for i, e := range entries {
			if protected[e.Key] && e.Key != d.h.Key {
				e.Pinned = true
			}
			view[i] = e
		}
		prio := d.h.Priority
		if e, ok := has(d.h.Key, d.from); ok {
			prio = max(prio, e.Priority)
		}
		admit := nodeapi.Entry{Key: d.h.Key, Tier: to, Bytes: d.h.Bytes, Digest: d.h.Digest, Priority: prio, LastUsed: in.Now}
		plan, err := PlanAdmit(view, in.Budgets, admit)
		if err != nil {
			deferred = append(deferred, nodeapi.Deferred{Key: d.h.Key, To: to, Reason: err.Error()})
			continue
		}
		entries = applyPlan(entries, plan)
		entries = append(entries, admit)
		out = append(out, nodeapi.Promotion{Key: d.h.Key, From: d.from, To: to, Bytes: d.h.Bytes, Wake: d.p, Lead: d.lead, Evictions: plan})
	}
	return out, deferred
}

// readsCold says whether the agent can read h's cold copy: a file of its
// --cold-dir, or one of its S3 sources.
func (in PromotionInput) readsCold(h WakeHistory) bool {
	if h.ColdS3 != "" {
		return slices.Contains(in.ColdS3, h.ColdS3)
	}
	return in.ColdTier && h.ColdPath != ""
}

// promotionLead is how long the copies from tier from up to the hot tier
// take: bytes over the read bandwidth of each tier they leave.
func promotionLead(from v1alpha1.Tier, bytes int64, h WakeHistory, bps map[v1alpha1.Tier]float64) (time.Duration, error) {
	var secs float64
	for t := from; t != v1alpha1.TierHot; t = h.up(t) {
		b := bps[t]
		if t == v1alpha1.TierCold {
			b = h.ColdBytesPerSecond
			if b <= 0 {
				b = DefaultColdBytesPerSecond
			}
		}
		if b <= 0 {
			return 0, fmt.Errorf("promoting %s from the %s tier: %w there", h.Key, t, ErrNoBandwidth)
		}
		secs += float64(bytes) / b
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// up is the next faster tier the agent copies h's weights into: warm
// after cold, hot after warm; hot after cold when the application has no
// warm tier (NoWarm), so no warm copy is ever written for it.
func (h WakeHistory) up(t v1alpha1.Tier) v1alpha1.Tier {
	if t == v1alpha1.TierCold && !h.NoWarm {
		return v1alpha1.TierWarm
	}
	return v1alpha1.TierHot
}

// applyPlan returns entries after plan's evictions.
func applyPlan(entries []nodeapi.Entry, plan []nodeapi.Action) []nodeapi.Entry {
	for _, a := range plan {
		i := slices.IndexFunc(entries, func(e nodeapi.Entry) bool { return e.Key == a.Key && e.Tier == a.From && !e.Offload })
		if i < 0 {
			continue
		}
		if a.Kind == nodeapi.ActionDemote {
			entries[i].Tier = v1alpha1.TierWarm
			continue
		}
		entries = slices.Delete(entries, i, i+1)
	}
	return entries
}
