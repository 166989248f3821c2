package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// The node agents (one per node, orchestra-agent --role=node): GET
// /tiers, GET /report, POST /demote, POST /promote, and the wake and sleep
// reports (sleep_wakes.go). The sidecars are called through sidecars.go.

// agentHTTP is the node agents' client; every call carries its own
// deadline.
var agentHTTP = &http.Client{}

// callAgent makes one call of the node agent at base within timeout,
// through its client (with the release's caller token).
func (c *Controller) callAgent(ctx context.Context, method, base, path string, body, out any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return nodeapi.Client{URL: base, HTTP: agentHTTP, Token: nodeapi.TokenFile(c.cfg.AgentTokenFile)}.Call(ctx, method, path, body, out)
}

// agentRef is the node agent on one node.
type agentRef struct {
	node, pod, url string
}

// allAgents lists the node agents (one per node) that sleep selects.
func (c *Controller) allAgents(sleep *SleepConfig) []agentRef {
	if sleep == nil || sleep.AgentSelector == "" {
		return nil
	}
	sel, err := labels.Parse(sleep.AgentSelector)
	if err != nil {
		return nil
	}
	pods, err := c.podLister.Pods(c.deps.Namespace).List(sel)
	if err != nil {
		return nil
	}
	var out []agentRef
	seen := map[string]bool{}
	for _, p := range pods {
		n := p.Spec.NodeName
		if n == "" || seen[n] || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		seen[n] = true
		out = append(out, agentRef{node: n, pod: p.Name, url: "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(sleep.AgentPort)))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].node < out[j].node })
	return out
}

// agentsOf finds the node agent on each sidecar's node (one per node),
// among those sleep selects.
func (c *Controller) agentsOf(sleep *SleepConfig, sidecars []sidecarRef) []agentRef {
	if len(sidecars) == 0 {
		return nil
	}
	nodes := map[string]bool{}
	for _, s := range sidecars {
		nodes[s.pod.Spec.NodeName] = true
	}
	var out []agentRef
	for _, ag := range c.allAgents(sleep) {
		if nodes[ag.node] {
			out = append(out, ag)
		}
	}
	return out
}

// demoteWarm asks a node agent to copy the engines' level-1 offload from
// its hot tier into its warm tier, verified against digest (the engine's).
func (c *Controller) demoteWarm(ctx context.Context, a *appState, ag agentRef, digest string) error {
	req := nodeapi.DemoteRequest{Key: nodeapi.Key{Namespace: c.deps.Namespace, Name: a.Sleep.ModelCheckpoint}, Digest: digest}
	var res nodeapi.DemoteResult
	if err := c.callAgent(ctx, http.MethodPost, ag.url, nodeapi.PathDemote, req, &res, a.Sleep.WakeTimeout.Duration); err != nil {
		return fmt.Errorf("node agent %s: %w", ag.pod, err)
	}
	c.log.Info("warm copy placed from the hot tier", "app", a.Name, "node", ag.node, "source", res.Source, "bytes", res.Bytes, "digest", res.Digest)
	return nil
}

// promoteWarm asks a node agent for a warm copy of the weights from its
// cold tier (the model cache, or S3), verified against digest (the
// engine's; an S3 copy needs it).
func (c *Controller) promoteWarm(ctx context.Context, a *appState, ag agentRef, digest string) error {
	req := nodeapi.PromoteRequest{Key: nodeapi.Key{Namespace: c.deps.Namespace, Name: a.Sleep.ModelCheckpoint}, To: v1alpha1.TierWarm,
		ColdPath: a.Sleep.ColdPath, ColdS3: a.Sleep.ColdS3, Digest: digest}
	var e nodeapi.Entry
	if err := c.callAgent(ctx, http.MethodPost, ag.url, nodeapi.PathPromote, req, &e, a.Sleep.WakeTimeout.Duration); err != nil {
		return fmt.Errorf("node agent %s: %w", ag.pod, err)
	}
	c.log.Info("warm copy placed", "app", a.Name, "node", ag.node, "bytes", e.Bytes, "digest", e.Digest)
	return nil
}

// nodeView is what one node agent says about the application's weights.
type nodeView struct {
	agentRef
	report  nodeapi.NodeReport
	entries []nodeapi.Entry // the application's copies
	err     error
}

// nodeViews asks the node agents of the sidecars' nodes for their report and
// the application's copies.
func (c *Controller) nodeViews(ctx context.Context, a *appState, sidecars []sidecarRef) []nodeView {
	return c.viewsOf(ctx, a, c.agentsOf(a.Sleep, sidecars))
}

// viewsOf asks the given node agents for their report and the
// application's copies.
func (c *Controller) viewsOf(ctx context.Context, a *appState, agents []agentRef) []nodeView {
	out := make([]nodeView, len(agents))
	var wg sync.WaitGroup
	for i, ag := range agents {
		wg.Go(func() {
			v := nodeView{agentRef: ag}
			var tiers nodeapi.TiersStatus
			v.err = errors.Join(
				c.callAgent(ctx, http.MethodGet, ag.url, nodeapi.PathReport, nil, &v.report, 5*time.Second),
				c.callAgent(ctx, http.MethodGet, ag.url, nodeapi.PathTiers, nil, &tiers, 5*time.Second))
			for _, e := range tiers.Entries {
				// The engine's own level-1 offload is placed from the
				// sidecars (writeCheckpointFrom), not from the agent's list.
				if e.Namespace == c.deps.Namespace && e.Name == a.Sleep.ModelCheckpoint && !e.Offload {
					v.entries = append(v.entries, e)
				}
			}
			out[i] = v
		})
	}
	wg.Wait()
	return out
}

// readBPS is a node's measured read bandwidth of a tier (0: unknown).
func (v nodeView) readBPS(t v1alpha1.Tier) float64 {
	var b *nodeapi.Bandwidth
	switch t {
	case v1alpha1.TierHot:
		b = v.report.Hot.Read
	case v1alpha1.TierWarm:
		b = v.report.Warm.Read
	}
	if b == nil {
		return 0
	}
	return b.BytesPerSecond
}

// has reports whether the node agent holds a copy in tier t.
func (v nodeView) has(t v1alpha1.Tier) (nodeapi.Entry, bool) {
	for _, e := range v.entries {
		if e.Tier == t {
			return e, true
		}
	}
	return nodeapi.Entry{}, false
}

// tierBandwidth is the slowest measured read bandwidth of tier t on the
// nodes of the sidecars in res (0: unknown).
func (c *Controller) tierBandwidth(ctx context.Context, a *appState, res []sidecarResult, t v1alpha1.Tier) float64 {
	if a.Sleep.AgentSelector == "" {
		return 0
	}
	bw := 0.0
	for _, v := range c.nodeViews(ctx, a, refsOf(res)) {
		if b := v.readBPS(t); b > 0 && (bw == 0 || b < bw) {
			bw = b
		}
	}
	return bw
}

// refreshTier works out where sleeping engines' weights rest (restingTier)
// and how long a wake should take. The expected resume is bytes over the slowest node's measured read bandwidth
// of that tier plus the engines' measured wake overhead. It then writes the
// ModelCheckpoint's status.
func (c *Controller) refreshTier(ctx context.Context, a *appState, sidecars []sidecarRef) {
	a.sl.refreshed = c.now()
	var views []nodeView
	if a.Sleep.AgentSelector != "" {
		views = c.nodeViews(ctx, a, sidecars)
	}
	tier := restingTier(a.sl.level, a.Sleep.Level1Tier, a.Sleep.usesWarm(), func(t v1alpha1.Tier) bool {
		for _, v := range views {
			if _, ok := v.has(t); !ok {
				return false
			}
		}
		return len(views) > 0
	})
	bytes := a.sl.bytes
	if a.Sleep.ModelCopies {
		// The sidecars know which copy the next wake loads.
		if t, b, ok := c.sidecarsTier(ctx, sidecars); ok {
			tier, bytes = t, b
		}
	}
	bw := 0.0
	for _, v := range views {
		if e, ok := v.has(tier); ok && bytes == 0 {
			bytes = e.Bytes
		}
		if b := v.readBPS(tier); b > 0 && (bw == 0 || b < bw) {
			bw = b
		}
	}
	if tier == v1alpha1.TierCold {
		bw = a.sl.coldBPS
	}
	resume := ""
	if bw > 0 && bytes > 0 {
		resume = strconv.FormatFloat(float64(bytes)/bw+a.sl.overhead, 'f', 3, 64)
	}
	a.status.ResidentTier, a.status.ExpectedResumeSeconds = tier, resume
	c.writeCheckpointFrom(ctx, a, sidecars, views, nil)
}

// restingTier is where sleeping engines' weights rest: at level 1 where
// the engine leaves them (level1: the hot tier for the engines' own
// offload, the cold tier for engines that unload completely); at level 2 the fastest tier in which
// every root's node agent holds a copy (everyNode), the warm tier only
// when the engines read it (warm), else the cold tier.
func restingTier(level int32, level1 v1alpha1.Tier, warm bool, everyNode func(v1alpha1.Tier) bool) v1alpha1.Tier {
	if level != 2 {
		if level1 == "" {
			return v1alpha1.TierHot
		}
		return level1
	}
	if everyNode(v1alpha1.TierHot) {
		return v1alpha1.TierHot
	}
	if warm && everyNode(v1alpha1.TierWarm) {
		return v1alpha1.TierWarm
	}
	return v1alpha1.TierCold
}

// writeCheckpoint writes the application's ModelCheckpoint status from the
// node agents of the sidecars' nodes; verified is the last wake's
// verification, when one just ended.
func (c *Controller) writeCheckpoint(ctx context.Context, a *appState, sidecars []sidecarRef, verified *bool) {
	var views []nodeView
	if a.Sleep.AgentSelector != "" && len(sidecars) > 0 {
		views = c.nodeViews(ctx, a, sidecars)
	}
	c.writeCheckpointFrom(ctx, a, sidecars, views, verified)
}

func (c *Controller) writeCheckpointFrom(ctx context.Context, a *appState, sidecars []sidecarRef, views []nodeView, verified *bool) {
	if a.Sleep.ModelCheckpoint == "" || c.checkpoints == nil {
		return
	}
	st := v1alpha1.ModelCheckpointStatus{ResidentTier: a.status.ResidentTier, ExpectedResumeSeconds: a.status.ExpectedResumeSeconds, Bytes: a.sl.bytes, Nodes: checkpointNodes(views)}
	for _, v := range views {
		for _, e := range v.entries {
			t := e.Tier
			p := v1alpha1.Placement{Node: v.node, Tier: t, Bytes: e.Bytes, Digest: e.Digest, ReadBytesPerSecond: int64(v.readBPS(t))}
			if !e.VerifiedAt.IsZero() {
				p.VerifiedTime = &metav1.Time{Time: e.VerifiedAt.UTC().Truncate(time.Second)}
			}
			if !e.LastUsed.IsZero() {
				p.LastUsedTime = &metav1.Time{Time: e.LastUsed.UTC().Truncate(time.Second)}
			}
			st.Placements = append(st.Placements, p)
			if st.Digest == "" {
				st.Digest = e.Digest
			}
			if st.Bytes == 0 {
				st.Bytes = e.Bytes
			}
		}
	}
	if a.status.State == v1alpha1.LifecycleAsleep && a.sl.level == 1 && a.Sleep.Level1Tier != v1alpha1.TierCold {
		// The engines' own level-1 offload, one per root's node (Ollama
		// and llama.cpp keep none: they unload the model).
		nodes := map[string]bool{}
		for _, s := range sidecars {
			if n := s.pod.Spec.NodeName; !nodes[n] {
				nodes[n] = true
				p := v1alpha1.Placement{Node: n, Tier: v1alpha1.TierHot, Bytes: a.sl.bytes}
				for _, v := range views {
					if v.node == n {
						p.ReadBytesPerSecond = int64(v.readBPS(v1alpha1.TierHot))
					}
				}
				st.Placements = append(st.Placements, p)
			}
		}
	}
	if len(st.Placements) > 64 {
		st.Placements = st.Placements[:64]
	}
	if d, node, ok := latestDrop(views, c.deps.Namespace, a.Sleep.ModelCheckpoint); ok && verified == nil &&
		(a.sl.verifiedCond == nil || d.Time.After(a.sl.verifiedCond.LastTransitionTime.Time)) {
		// A node agent's periodic re-hash found a copy that no longer
		// matched its digest and dropped it: the next wake reads the tier
		// below. It stays False until a wake verifies again.
		cond := metav1.Condition{Type: "Verified", Status: metav1.ConditionFalse, Reason: "CopyDropped",
			Message: fmt.Sprintf("the node agent on %s dropped its %s copy at %s because it no longer verified (%s); the next wake reads the tier below",
				node, d.Tier, d.Time.UTC().Format(time.RFC3339), d.Error),
			LastTransitionTime: metav1.Time{Time: d.Time}}
		a.sl.verifiedCond = &cond
		c.event(a, corev1.EventTypeWarning, EventCopyDropped, "%s", cond.Message)
	}
	if verified != nil {
		cond := metav1.Condition{Type: "Verified", Status: metav1.ConditionTrue, Reason: "WakeVerified",
			Message: "the last wake's bytes hashed to the digest recorded when the engine loaded them", LastTransitionTime: metav1.Now()}
		if !*verified {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "WakeNotVerified", "the last wake restored bytes the engine did not verify"
		}
		meta.SetStatusCondition(&st.Conditions, cond)
		a.sl.verifiedCond = &cond
	} else if a.sl.verifiedCond != nil {
		meta.SetStatusCondition(&st.Conditions, *a.sl.verifiedCond)
	}
	b, err := json.Marshal(st)
	if err != nil || string(b) == a.sl.written {
		return
	}
	if err := c.checkpoints.WriteStatus(ctx, c.deps.Namespace, a.Sleep.ModelCheckpoint, st); err != nil {
		c.log.Warn("writing the ModelCheckpoint status", "app", a.Name, "modelCheckpoint", a.Sleep.ModelCheckpoint, "err", err)
		return
	}
	a.sl.written = string(b)
}

// latestDrop is the newest copy of the artifact name (in namespace ns) that
// a node agent's periodic verification dropped, and the agent's node.
func latestDrop(views []nodeView, ns, name string) (nodeapi.Verification, string, bool) {
	var out nodeapi.Verification
	node, found := "", false
	for _, v := range views {
		for _, d := range v.report.Verification.Dropped {
			if d.Namespace == ns && d.Name == name && (!found || d.Time.After(out.Time)) {
				out, node, found = d, v.node, true
			}
		}
	}
	return out, node, found
}

// CheckpointStatusWriter writes a ModelCheckpoint's status.
type CheckpointStatusWriter interface {
	WriteStatus(ctx context.Context, namespace, name string, st v1alpha1.ModelCheckpointStatus) error
}

// restCheckpoints writes ModelCheckpoint status with a merge patch of its
// status subresource through the clientset's REST client.
type restCheckpoints struct{ rc *rest.RESTClient }

// checkpointWriter returns the writer of a real clientset, or nil (fake
// clientsets in tests have no REST client).
func checkpointWriter(kube kubernetes.Interface) CheckpointStatusWriter {
	if kube == nil {
		return nil
	}
	if rc, ok := kube.CoreV1().RESTClient().(*rest.RESTClient); ok && rc != nil {
		return restCheckpoints{rc: rc}
	}
	return nil
}

// WriteStatus implements CheckpointStatusWriter.
func (r restCheckpoints) WriteStatus(ctx context.Context, namespace, name string, st v1alpha1.ModelCheckpointStatus) error {
	body, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	gv := v1alpha1.GroupVersion
	err = r.rc.Patch(types.MergePatchType).
		AbsPath("/apis", gv.Group, gv.Version, "namespaces", namespace, "modelcheckpoints", name, "status").
		Param("fieldManager", FieldManager).
		Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("patching ModelCheckpoint %s/%s status: %w", namespace, name, err)
	}
	return nil
}

// sleepMetrics are the metrics of sleeping engines.
type sleepMetrics struct {
	sleeps        *prometheus.CounterVec
	wakes         *prometheus.CounterVec
	wakeSeconds   *prometheus.HistogramVec
	restoredBytes *prometheus.CounterVec
	demotions     *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	agentReports  *prometheus.CounterVec
}

func newSleepMetrics(reg prometheus.Registerer) *sleepMetrics {
	const ns = metricsNamespace
	m := &sleepMetrics{
		sleeps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "sleeps_total",
			Help: "Attempts to put an application's engines to sleep, by level and outcome (asleep; cancelled: a request arrived or work was queued; failed: a sidecar could not sleep or the queue could not be read)."}, []string{"app", "level", "outcome"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_wakes_total",
			Help: "Attempts to wake sleeping engines, by the tier the weights came from (Hot, Warm, Cold) and result (ok, failed: retried with backoff)."}, []string{"app", "tier", "result"}),
		wakeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "engine_wake_seconds",
			Help:    "Time from the first request for sleeping engines to every root's sidecar reporting Awake (the gate opens), by the tier the weights came from.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}}, []string{"app", "tier"}),
		restoredBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "restored_bytes_total",
			Help: "Weight bytes the engines reported restoring in wakes, by tier."}, []string{"app", "tier"}),
		demotions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "demotions_total",
			Help: "Demotions of sleeping engines' weights out of the hot tier after parkAfter, by result (ok, failed)."}, []string{"app", "result"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_restarts_total",
			Help: "Root pods deleted because their sidecar was Failed (the engine in a state the sidecar cannot tell)."}, []string{"app"}),
		agentReports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "agent_reports_total",
			Help: "Wakes and sleeps reported to a node agent (an application's, and each swap of a seat group), by kind (wake, sleep) and result (ok; failed: logged, and the agent predicts from fewer)."}, []string{"app", "kind", "result"}),
	}
	reg.MustRegister(m.sleeps, m.wakes, m.wakeSeconds, m.restoredBytes, m.demotions, m.restarts, m.agentReports)
	return m
}
