package lifecycle

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// reportWake tells the node agent on each woken root's node about the
// wake (POST /wakes), from which the agent predicts the next one and
// promotes the weights a tier up ahead of it (docs/checkpoint.md). Best
// effort, after the gate opened: an agent that does not answer only
// predicts from fewer wakes.
func (c *Controller) reportWake(ctx context.Context, a *appState, res []sidecarResult, lw *v1alpha1.WakeStatus) {
	if lw == nil || lw.StartTime == nil {
		return
	}
	digest := ""
	for _, r := range res {
		if r.st.Digest != "" {
			digest = r.st.Digest
		}
	}
	rec := a.Sleep.wakeRecord(nodeapi.Key{Namespace: c.deps.Namespace, Name: a.Sleep.ModelCheckpoint}, lw.StartTime.Time)
	rec.Tier = lw.FromTier
	rec.Bytes, rec.BytesPerSecond, rec.Digest = a.sl.bytes, float64(lw.BytesPerSecond), digest
	c.tellAgents(ctx, a.Name, a.Sleep, refsOf(res), reportWake, rec)
}

// reportSleep tells the node agent on each root's node that the engines
// fell asleep (POST /sleeps): with the wakes, the agent then knows the
// engines are asleep and how long after a sleep the next wake comes, and
// promotes the weights ahead of it. Best effort, like reportWake.
func (c *Controller) reportSleep(ctx context.Context, a *appState, sidecars []sidecarRef, at time.Time, level int32) {
	rec := nodeapi.SleepRecord{Key: nodeapi.Key{Namespace: c.deps.Namespace, Name: a.Sleep.ModelCheckpoint}, Time: at, Level: int(level)}
	c.tellAgents(ctx, a.Name, a.Sleep, sidecars, reportSleep, rec)
}

// The kinds of report to the node agents, the label kind of
// orchestra_lifecycle_agent_reports_total.
const (
	reportWake  = "wake"
	reportSleep = "sleep"
)

// tellAgents posts rec (a WakeRecord or a SleepRecord, after kind) to the
// node agent on each sidecar's node, for application app (an application's,
// or a seat group's member's, with its sleep configuration). A failure is
// logged and counted, never returned: the agent only predicts from fewer
// wakes and sleeps.
func (c *Controller) tellAgents(ctx context.Context, app string, sleep *SleepConfig, sidecars []sidecarRef, kind string, rec any) {
	path := nodeapi.PathWakes
	if kind == reportSleep {
		path = nodeapi.PathSleeps
	}
	for _, ag := range c.agentsOf(sleep, sidecars) {
		result := "ok"
		if err := c.callAgent(ctx, http.MethodPost, ag.url, path, rec, nil, 2*time.Second); err != nil {
			result = "failed"
			c.log.Info("reporting the "+kind+" to the node agent", "app", app, "node", ag.node, "err", err)
		}
		c.sm.agentReports.WithLabelValues(app, kind, result).Inc()
	}
}

// checkpointNodes are the ModelCheckpoint's nodes: what each node agent
// that answered reports it can do for process snapshots, and the node's
// container runtime.
func checkpointNodes(views []nodeView) []v1alpha1.CheckpointNode {
	var out []v1alpha1.CheckpointNode
	for _, v := range views {
		if v.report.Time.IsZero() || len(out) == 64 {
			continue // no report from this agent
		}
		reason := v.report.ProcessSnapshotsReason
		if len(reason) > 1024 {
			reason = strings.ToValidUTF8(reason[:1021], "") + "..."
		}
		runtime := v.report.Runtime.Version
		if len(runtime) > 128 {
			runtime = runtime[:128]
		}
		out = append(out, v1alpha1.CheckpointNode{Node: v.node, ContainerRuntimeVersion: runtime, ProcessSnapshots: v.report.ProcessSnapshots, ProcessSnapshotsReason: reason})
	}
	return out
}
