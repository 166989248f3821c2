package nodeagent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/agenthttp"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// wakesFile is where the wake histories persist: beside the warm tier's
// namespace directories (the store's scan skips files), or, for a store
// scoped to one namespace, in that namespace's directory (the scan skips
// dot files), so that agents of different namespaces keep their own.
const wakesFile = ".wakes.json"

func (n *Node) wakesPath() string {
	return filepath.Join(n.cfg.Store.WarmDir, n.cfg.Store.Namespace, wakesFile)
}

// loadWakes reads the persisted wake histories; a missing or unreadable
// file starts empty. A store scoped to one namespace without a file of its
// own yet takes its namespace's histories from the file beside the
// namespace directories, where an agent keeping every namespace wrote them.
func (n *Node) loadWakes() {
	n.wakes = map[nodeapi.Key]*WakeHistory{}
	path := n.wakesPath()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && n.cfg.Store.Namespace != "" {
		path = filepath.Join(n.cfg.Store.WarmDir, wakesFile)
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return
	}
	var hs []WakeHistory
	if err := json.Unmarshal(b, &hs); err != nil {
		n.log.Warn("ignoring the unreadable wake histories", "file", path, "err", err)
		return
	}
	for i := range hs {
		if n.store.CheckKey(hs[i].Key) == nil {
			n.wakes[hs[i].Key] = &hs[i]
			n.store.SetNoWarm(hs[i].Key, hs[i].NoWarm)
		}
	}
}

// histories returns a copy of the wake histories, by key (guarded by mu).
func (n *Node) histories() []WakeHistory {
	out := make([]WakeHistory, 0, len(n.wakes))
	for _, h := range n.wakes {
		c := *h
		c.Wakes, c.Sleeps = slices.Clone(h.Wakes), slices.Clone(h.Sleeps)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b WakeHistory) int { return cmp.Compare(a.String(), b.String()) })
	return out
}

// RecordWake adds a wake to its artifact's history and persists the
// histories.
func (n *Node) RecordWake(r nodeapi.WakeRecord) error {
	switch r.Tier {
	case "", v1alpha1.TierHot, v1alpha1.TierWarm, v1alpha1.TierCold:
	default:
		return fmt.Errorf("tier must be hot, warm or cold, got %q", r.Tier)
	}
	if r.ColdPath != "" && !filepath.IsLocal(r.ColdPath) {
		return fmt.Errorf("coldPath %q must be a relative path inside the cold tier", r.ColdPath)
	}
	return n.record(r.Key, r.Time, func(h *WakeHistory) {
		h.Add(r.Time)
		if r.Bytes > 0 {
			h.Bytes = r.Bytes
		}
		if r.Digest != "" {
			h.Digest = r.Digest
		}
		if r.ColdPath != "" {
			h.ColdPath = r.ColdPath
		}
		if r.ColdS3 != "" {
			h.ColdS3 = r.ColdS3
		}
		h.Priority, h.NoWarm = r.Priority, r.NoWarm
		// An engine's cold wake reads the model cache; with an S3 cold
		// tier the agent measures its own copies from S3 instead.
		if r.Tier == v1alpha1.TierCold && r.BytesPerSecond > 0 && h.ColdS3 == "" {
			h.ColdBytesPerSecond = r.BytesPerSecond
		}
	})
}

// RecordSleep adds a sleep to its artifact's history and persists the
// histories. A sleep of an artifact never woken starts its history.
func (n *Node) RecordSleep(r nodeapi.SleepRecord) error {
	if r.Level < 0 || r.Level > 2 {
		return fmt.Errorf("level must be 1 or 2, got %d", r.Level)
	}
	return n.record(r.Key, r.Time, func(h *WakeHistory) { h.AddSleep(r.Time) })
}

// record checks a wake's or sleep's key and time, applies change to the
// key's history (a new one if none) and persists the histories.
func (n *Node) record(k nodeapi.Key, at time.Time, change func(*WakeHistory)) error {
	if err := n.store.CheckKey(k); err != nil {
		return err
	}
	if at.IsZero() {
		return errors.New("time is required")
	}
	n.mu.Lock()
	h := n.wakes[k]
	if h == nil {
		h = &WakeHistory{Key: k}
		n.wakes[k] = h
	}
	change(h)
	noWarm := h.NoWarm
	hs := n.histories()
	n.mu.Unlock()
	n.store.SetNoWarm(k, noWarm)
	return n.persistHistories(hs)
}

// errPersist marks a wake or sleep the agent recorded in memory and could
// not write to its histories file: its own failure, not the caller's.
var errPersist = errors.New("persisting the wake histories")

func (n *Node) persistHistories(hs []WakeHistory) error {
	b, _ := json.Marshal(hs)
	err := os.MkdirAll(filepath.Dir(n.wakesPath()), 0o700)
	if err == nil {
		err = arena.WriteFile(n.wakesPath(), b, true)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errPersist, err)
	}
	return nil
}

// PromoteAhead plans the promotions due now (PlanPromotions) and makes
// them, one at a time, each verified against its artifact's digest.
func (n *Node) PromoteAhead() []nodeapi.PromotionDone {
	now := time.Now()
	n.mu.Lock()
	hs := n.histories()
	bps := map[v1alpha1.Tier]float64{}
	if r := n.report.Hot.Read; r != nil {
		bps[v1alpha1.TierHot] = r.BytesPerSecond
	}
	if r := n.report.Warm.Read; r != nil {
		bps[v1alpha1.TierWarm] = r.BytesPerSecond
	}
	n.mu.Unlock()
	in := PromotionInput{Now: now, Entries: n.store.Entries(), Budgets: n.cfg.Store.Budgets, Histories: hs,
		ReadBytesPerSecond: bps, ColdTier: n.cfg.ColdDir != "", ColdS3: n.coldS3Names(), Margin: n.cfg.PromoteMargin}
	plan, deferred := PlanPromotions(in)
	var preds []nodeapi.PredictedWake
	for _, h := range hs {
		if p, ok := h.Predict(now); ok {
			preds = append(preds, nodeapi.PredictedWake{Key: h.Key, Prediction: p, Wakes: len(h.Wakes)})
		}
	}
	slices.SortStableFunc(preds, func(a, b nodeapi.PredictedWake) int { return a.Next.Compare(b.Next) })
	// The copies of every artifact due now are kept while the others are
	// admitted, as the plan assumed.
	keep := map[nodeapi.Key]bool{}
	for _, p := range plan {
		keep[p.Key] = true
	}
	byKey := map[nodeapi.Key]WakeHistory{}
	for _, h := range hs {
		byKey[h.Key] = h
	}
	var done []nodeapi.PromotionDone
	for _, p := range plan {
		h := byKey[p.Key]
		var cold ColdSource
		var err error
		if p.From == v1alpha1.TierCold {
			if h.ColdS3 != "" {
				cold, err = n.coldSource("", h.ColdS3, h.Digest)
			} else {
				cold, err = n.coldSource(h.ColdPath, "", h.Digest)
			}
		}
		start := time.Now()
		if err == nil {
			_, err = n.promote(context.Background(), p.Key, p.To, cold, h.Digest, h.Priority, keep)
		}
		d := nodeapi.PromotionDone{Promotion: p, Time: start, Seconds: time.Since(start).Seconds()}
		result := "ok"
		if err != nil {
			d.Error = err.Error()
			result = "failed"
			if errors.Is(err, arena.ErrMismatch) || errors.Is(err, ErrManifestMismatch) {
				result = "mismatch"
			}
			n.log.Warn("promotion ahead of a predicted wake failed", "key", p.String(), "from", p.From, "to", p.To, "err", err)
		} else {
			n.log.Info("promoted ahead of a predicted wake", "key", p.String(), "from", p.From, "to", p.To, "bytes", p.Bytes,
				"seconds", d.Seconds, "predictedWake", p.Wake.Next, "pattern", p.Wake.Pattern, "lead", p.Lead)
		}
		n.m.aheadPromotions.WithLabelValues(string(p.From), string(p.To), result).Inc()
		done = append(done, d)
	}
	for _, d := range deferred {
		n.m.aheadPromotions.WithLabelValues("", string(d.To), "deferred").Inc()
	}
	n.updateGauges()
	n.mu.Lock()
	n.promotion.LastTime, n.promotion.Predictions, n.promotion.Deferred = &now, preds, deferred
	n.promotion.Done = append(n.promotion.Done, done...)
	if k := len(n.promotion.Done) - maxDropped; k > 0 {
		n.promotion.Done = n.promotion.Done[k:]
	}
	n.mu.Unlock()
	return done
}

// coldS3Names are the names of the agent's S3 cold sources.
func (n *Node) coldS3Names() []string {
	out := make([]string, 0, len(n.cfg.ColdS3))
	for _, c := range n.cfg.ColdS3 {
		out = append(out, c.Name)
	}
	return out
}

// Promote runs PromoteAhead every cfg.PromoteInterval until ctx ends
// (never when the interval is 0).
func (n *Node) Promote(ctx context.Context) {
	repeat(ctx, n.cfg.PromoteInterval, func() { n.PromoteAhead() })
}

func (n *Node) handleWake(w http.ResponseWriter, r *http.Request) {
	var rec nodeapi.WakeRecord
	if agenthttp.ReadBody(w, r, &rec) {
		answerRecord(w, n.RecordWake(rec))
	}
}

func (n *Node) handleSleep(w http.ResponseWriter, r *http.Request) {
	var rec nodeapi.SleepRecord
	if agenthttp.ReadBody(w, r, &rec) {
		answerRecord(w, n.RecordSleep(rec))
	}
}

func answerRecord(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errPersist):
		agenthttp.WriteError(w, http.StatusInternalServerError, err.Error())
		return
	case err != nil:
		agenthttp.WriteError(w, keyErrorStatus(err), err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
