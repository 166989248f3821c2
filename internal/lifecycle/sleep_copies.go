package lifecycle

// Model copies: engines that load the hottest verified copy of their model
// file on their node (Ollama, llama.cpp; SleepConfig.ModelCopies). Their
// sidecar points the engine at the node agent's hot copy, else its warm
// copy, else the model cache, at start and before each wake; the leader
// asks the node agents for the copies on the same ladder as the
// simulator's weights:
//
//	fall asleep        --> POST /promote {to: hot, coldPath | sidecar} on each
//	                       root's node (from the agent's warm copy, else the
//	                       model cache: mounted into the agent (coldPath), or
//	                       read through the sidecar of a root on that node;
//	                       verified against the fetcher's manifest, within the
//	                       hot budget and its eviction rules)
//	parkAfter asleep   --> POST /demote (the agent's hot copy to warm, verified);
//	                       POST /promote {to: warm} from the cache when that fails
//	wake               --> the sidecar points the engine at the hottest copy;
//	                       lastWake.fromTier is the tier it loaded
//
// The engine unloads the model completely when it sleeps, so no engine
// call is needed to move between tiers: the next wake opens the copy the
// sidecar points it at. The resident tier while asleep is the tier the
// sidecars say the next wake will load (GET /state's model).

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// EventCopyNotPlaced is the warning event of a copy of a sleeping
// engine's model file the node agent could not place.
const EventCopyNotPlaced = "CopyNotPlaced"

// copyTarget is the tier a sleeping engine's copy is asked for: hot,
// unless the application's hot tier is None; then warm, unless its warm
// tier is None too (empty: none).
func (s *SleepConfig) copyTarget() v1alpha1.Tier {
	switch {
	case s.HotTier != v1alpha1.HotTierNone:
		return v1alpha1.TierHot
	case s.usesWarm():
		return v1alpha1.TierWarm
	}
	return ""
}

// placeCopies asks the node agent on each root's node for a copy of the
// model file in the hottest tier the application uses, so that the next
// wake reads RAM, not the model cache. It runs beside the application's
// loop (a copy of a large model takes seconds to minutes, and a request
// must not wait for it): a wake that starts before the copy is in place
// loads the tier below, and the next one the copy. One placement at a
// time per application.
func (c *Controller) placeCopies(ctx context.Context, a *appState, sidecars []sidecarRef) {
	c.placeCopiesOf(ctx, copyPlacement{
		app: a.Name, sleep: a.Sleep, running: &a.sl.copying, done: a.kickNow,
		warn: func(format string, args ...any) {
			c.event(a, corev1.EventTypeWarning, EventCopyNotPlaced, format, args...)
		},
	}, sidecars)
}

// copyPlacement is whose copies placeCopiesOf places: an application's
// (placeCopies) or a seat-group member's (its sleep in a group's pod).
type copyPlacement struct {
	app   string
	sleep *SleepConfig
	// running is the channel of the placement under way (closed when it
	// ended; nil: none started), which placeCopiesOf replaces.
	running *chan struct{}
	// done runs when the placement ended (the next step refreshes the
	// resident tier); warn records a copy not placed.
	done func()
	warn func(format string, args ...any)
}

// placeCopiesOf is the one path of a copy placement: on the node of each
// of sidecars, a POST /promote of the model into the hottest tier the
// application uses (copyTarget), from the model cache the agent mounts
// or through a sidecar on that node (copyRequest), beside the caller's
// loop, one at a time per application.
func (c *Controller) placeCopiesOf(ctx context.Context, p copyPlacement, sidecars []sidecarRef) {
	to := p.sleep.copyTarget()
	if !p.sleep.ModelCopies || to == "" {
		return
	}
	if *p.running != nil {
		select {
		case <-*p.running:
		default:
			return // the last placement still runs
		}
	}
	agents := c.agentsOf(p.sleep, sidecars)
	if len(agents) == 0 {
		return
	}
	done := make(chan struct{})
	*p.running = done
	reqs := make([]nodeapi.PromoteRequest, len(agents))
	for i, ag := range agents {
		reqs[i] = c.copyRequest(p.sleep, ag, sidecars, to)
	}
	name, timeout := p.app, p.sleep.WakeTimeout.Duration
	go func() {
		defer close(done)
		for i, ag := range agents {
			start := time.Now()
			var e nodeapi.Entry
			if err := c.callAgent(ctx, http.MethodPost, ag.url, nodeapi.PathPromote, reqs[i], &e, timeout); err != nil {
				c.log.Warn("placing a copy of the model file for the next wake failed; it reads the tier below", "app", name, "node", ag.node, "tier", to, "err", err)
				if p.warn != nil {
					p.warn("no %s copy of the model file of %s on %s: %v; the next wake reads the tier below", to, name, ag.node, err)
				}
				continue
			}
			c.log.Info("copy of the model file placed for the next wake", "app", name, "node", ag.node, "tier", e.Tier,
				"bytes", e.Bytes, "files", e.Files, "sha256", e.SHA256, "seconds", time.Since(start).Seconds())
		}
		if p.done != nil {
			p.done()
		}
	}()
}

// copyRequest is the POST /promote of a copy of the model file into tier
// to on ag's node. Its cold source is the model cache: mounted into the
// agent (ColdPath, a ReadWriteMany cache), or else read from the sidecar
// of a root on the agent's node, which mounts the cache whatever its
// access mode (sidecar_source.go in the node agent). Either way the agent
// verifies the bytes against the fetcher's manifest.
func (c *Controller) copyRequest(s *SleepConfig, ag agentRef, sidecars []sidecarRef, to v1alpha1.Tier) nodeapi.PromoteRequest {
	req := nodeapi.PromoteRequest{Key: nodeapi.Key{Namespace: c.deps.Namespace, Name: s.ModelCheckpoint}, To: to, ColdPath: s.ColdPath}
	if req.ColdPath != "" {
		return req
	}
	for _, sc := range sidecars {
		if sc.pod.Spec.NodeName == ag.node && sc.pod.Status.PodIP != "" {
			req.Sidecar = sc.url
			break
		}
	}
	return req
}

// demoteCopies is the parkAfter demotion of engines that load copies:
// each node agent moves its hot copy to the warm tier (POST /demote,
// verified), or places a warm copy from the cache when it has none; the
// engines, unloaded, need no call. With tiers.warm None the hot copy
// stays (the agent's budget may still evict it).
func (c *Controller) demoteCopies(ctx context.Context, a *appState, sidecars []sidecarRef) error {
	start := c.now()
	c.demoteCopyToWarm(ctx, a, sidecars)
	a.sl.level = 2
	return c.demoted(ctx, a, sidecars, start, "the model file")
}

// keepsRAM reports whether engines that load copies also keep their
// weights in their own RAM at level 1 (vLLM, whose level-1 sleep backs
// them up in CPU memory): their parkAfter demotion puts them to sleep at
// level 2, which frees that RAM, besides moving the copy.
func (s *SleepConfig) keepsRAM() bool {
	return s.ModelCopies && s.Level1Tier == v1alpha1.TierHot
}

// demoteCopyToWarm asks each root's node agent to move its hot copy of the
// model to the warm tier (verified), or to place a warm copy from the
// model cache when it has none. Failures are logged: the next wake reads
// the tier below.
func (c *Controller) demoteCopyToWarm(ctx context.Context, a *appState, sidecars []sidecarRef) {
	if a.Sleep.usesWarm() {
		for _, ag := range c.agentsOf(a.Sleep, sidecars) {
			err := c.demoteWarm(ctx, a, ag, "")
			if err != nil {
				c.log.Info("no hot copy to demote; placing a warm copy from the model cache", "app", a.Name, "agent", ag.pod, "err", err)
				var e nodeapi.Entry
				if err = c.callAgent(ctx, http.MethodPost, ag.url, nodeapi.PathPromote, c.copyRequest(a.Sleep, ag, sidecars, v1alpha1.TierWarm), &e, a.Sleep.WakeTimeout.Duration); err != nil {
					err = fmt.Errorf("node agent %s: %w", ag.pod, err)
				}
			}
			if err != nil {
				c.log.Warn("placing a warm copy failed (the next wake reads the tier below)", "app", a.Name, "agent", ag.pod, "err", err)
			}
		}
	}
}

// sidecarsTier is where the sidecars say the engines' next wake reads the
// model file: the slowest of their copies (every root must find it there
// for the wake to read that tier). ok is false when a sidecar does not
// answer or does not point its engine at copies.
func (c *Controller) sidecarsTier(ctx context.Context, sidecars []sidecarRef) (v1alpha1.Tier, int64, bool) {
	if len(sidecars) == 0 {
		return "", 0, false
	}
	var tier v1alpha1.Tier
	var bytes int64
	for _, r := range c.readStates(ctx, sidecars) {
		if r.err != nil || r.st.Model == nil {
			return "", 0, false
		}
		t := r.st.Model.Tier
		if t == "" {
			return "", 0, false
		}
		if tier == "" || t.SlowerThan(tier) {
			tier = t
		}
		bytes = r.st.Model.Bytes
	}
	return tier, bytes, true
}
