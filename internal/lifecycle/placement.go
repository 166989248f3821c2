package lifecycle

// Node labels for a wake that lands where the weights already are: the
// leader keeps one label per sleeping application on the nodes whose node
// agent holds a copy of its weights (weights.modelorchestra.io/<...>:
// hot or warm), and the chart gives the application's root pods a
// preferred node affinity on that label (weights 100 and 50), so a pod
// woken from zero prefers such a node and falls back to any. The node
// agents publish (GET /tiers), the leader labels: the pattern of
// node-feature-discovery. The pod template never changes when copies move:
// no Helm drift, no rollout. The leader needs one right for it, patch on
// nodes, which the cluster administrator grants (docs/lifecycle.md).

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// labelEvery paces the node labels' reconciliation (and parking kicks it).
const labelEvery = 10 * time.Second

// EventNodeLabelsRefused is recorded (once per leadership) when the API
// server refuses the leader's patch of a node's labels.
const EventNodeLabelsRefused = "NodeLabelsRefused"

// NodeCopies is what one node agent reports: the hottest tier of each
// artifact (by name, in the release's namespace) it holds a copy of.
type NodeCopies struct {
	Node string
	// OK: the agent answered; a node whose agent did not answer keeps the
	// labels it has (its copies are unknown, not gone).
	OK     bool
	Copies map[string]v1alpha1.Tier
}

// LabelPatch is the labels of one node to set (a value) or remove (nil).
type LabelPatch struct {
	Node   string
	Labels map[string]*string
}

// PlanNodeLabels works out the node label patches that make the labels
// true: keys maps each application's artifact (its ModelCheckpoint) to
// its node label; written is what the leader last wrote to each node
// ("": removed), nil for a node it has not written this leadership. Each
// node whose agent answered gets every key, set to hot or warm where it
// holds a copy and removed where it does not; a node written before whose
// agent is gone has its labels removed. Only what differs from written is
// patched. It is pure.
func PlanNodeLabels(nodes []NodeCopies, keys map[string]string, written map[string]map[string]string) []LabelPatch {
	want := map[string]map[string]string{}
	for _, n := range nodes {
		if !n.OK {
			continue
		}
		w := map[string]string{}
		for artifact, key := range keys {
			switch n.Copies[artifact] {
			case v1alpha1.TierHot:
				w[key] = v1alpha1.WeightsOnNodeHot
			case v1alpha1.TierWarm:
				w[key] = v1alpha1.WeightsOnNodeWarm
			default:
				w[key] = ""
			}
		}
		want[n.Node] = w
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		seen[n.Node] = true
	}
	for node, labels := range written {
		if seen[node] {
			continue
		}
		// The agent is gone from this node (drained, or no longer placed
		// there): its copies can no longer be told; say none.
		w := map[string]string{}
		for key := range labels {
			w[key] = ""
		}
		want[node] = w
	}
	var out []LabelPatch
	for node, w := range want {
		prev, known := written[node]
		p := LabelPatch{Node: node, Labels: map[string]*string{}}
		for key, v := range w {
			if known {
				if old, ok := prev[key]; ok && old == v {
					continue
				}
			}
			if v == "" {
				p.Labels[key] = nil
			} else {
				p.Labels[key] = &v
			}
		}
		if len(p.Labels) > 0 {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// nodeLabeller is the leader's state of the node labels.
type nodeLabeller struct {
	kick    chan struct{}
	mu      sync.Mutex
	written map[string]map[string]string
	refused bool // the refusal was recorded as an event this leadership
}

func (c *Controller) kickLabels() {
	c.mu.Lock()
	lb := c.labeller
	c.mu.Unlock()
	if lb == nil {
		return
	}
	select {
	case lb.kick <- struct{}{}:
	default:
	}
}

// labelledApps are the applications whose nodes are labelled: those with
// a node label, a ModelCheckpoint and node agents.
func (c *Controller) labelledApps() []*appState {
	var out []*appState
	for _, a := range c.apps {
		if s := a.Sleep; s != nil && s.NodeLabel != "" && s.ModelCheckpoint != "" && s.AgentSelector != "" {
			out = append(out, a)
		}
	}
	return out
}

// runNodeLabels keeps the node labels true while this replica leads.
func (c *Controller) runNodeLabels(ctx context.Context) {
	apps := c.labelledApps()
	if len(apps) == 0 {
		return
	}
	lb := &nodeLabeller{kick: make(chan struct{}, 1), written: map[string]map[string]string{}}
	c.mu.Lock()
	c.labeller = lb
	c.mu.Unlock()
	t := time.NewTicker(labelEvery)
	defer t.Stop()
	for {
		c.labelNodes(ctx, lb, apps)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-lb.kick:
		}
	}
}

// labelNodes makes one pass: the node agents' copies, the plan, the
// patches.
func (c *Controller) labelNodes(ctx context.Context, lb *nodeLabeller, apps []*appState) {
	keys := map[string]string{}
	for _, a := range apps {
		keys[a.Sleep.ModelCheckpoint] = a.Sleep.NodeLabel
	}
	agents := c.allAgents(apps[0].Sleep)
	nodes := make([]NodeCopies, len(agents))
	var wg sync.WaitGroup
	for i, ag := range agents {
		wg.Go(func() {
			var tiers nodeapi.TiersStatus
			n := NodeCopies{Node: ag.node, Copies: map[string]v1alpha1.Tier{}}
			if err := c.callAgent(ctx, http.MethodGet, ag.url, nodeapi.PathTiers, nil, &tiers, 5*time.Second); err != nil {
				c.log.Debug("reading a node agent's copies for the node labels", "node", ag.node, "err", err)
				nodes[i] = n
				return
			}
			n.OK = true
			for _, e := range tiers.Entries {
				if e.Namespace != c.deps.Namespace || e.Offload {
					continue // an engine's own offload is no copy a new pod reads
				}
				t := e.Tier
				if cur, ok := n.Copies[e.Name]; !ok || t == v1alpha1.TierHot && cur != v1alpha1.TierHot {
					n.Copies[e.Name] = t
				}
			}
			nodes[i] = n
		})
	}
	wg.Wait()
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for _, p := range PlanNodeLabels(nodes, keys, lb.written) {
		err := PatchNodeLabels(ctx, c.deps.Kube, p)
		switch {
		case err == nil:
			w := lb.written[p.Node]
			if w == nil {
				w = map[string]string{}
				lb.written[p.Node] = w
			}
			for k, v := range p.Labels {
				w[k] = ""
				if v != nil {
					w[k] = *v
				}
			}
			c.pm.labelPatches.WithLabelValues("ok").Inc()
			c.log.Info("node labels of the weights' copies", "node", p.Node, "labels", labelsText(p.Labels))
		case apierrors.IsNotFound(err):
			delete(lb.written, p.Node) // the node is gone, and its labels with it
		case apierrors.IsForbidden(err):
			c.pm.labelPatches.WithLabelValues("forbidden").Inc()
			if !lb.refused {
				lb.refused = true
				msg := "the dispatcher may not patch nodes, so the nodes holding copies of the weights are not labelled and a wake from zero lands on any node: grant its ServiceAccount patch on nodes (docs/lifecycle.md, \"Parking\"): " + err.Error()
				c.log.Warn(msg, "node", p.Node)
				for _, a := range apps {
					c.event(a, corev1.EventTypeWarning, EventNodeLabelsRefused, "%s", msg)
				}
			}
		default:
			if errors.Is(err, context.Canceled) {
				return
			}
			c.pm.labelPatches.WithLabelValues("failed").Inc()
			c.log.Warn("patching a node's weights labels; retrying", "node", p.Node, "err", err)
		}
	}
}

// PatchNodeLabels applies one node's label patch: a JSON merge patch of
// its labels (null removes one), which touches no other label or field
// and needs only the patch verb on nodes.
func PatchNodeLabels(ctx context.Context, kube kubernetes.Interface, p LabelPatch) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": p.Labels}})
	if err != nil {
		return err
	}
	_, err = kube.CoreV1().Nodes().Patch(ctx, p.Node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "orchestra-lifecycle"})
	return err
}

func labelsText(l map[string]*string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		out[k] = "(removed)"
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

// parkMetrics are the metrics of parking and the node labels.
type parkMetrics struct {
	parks        *prometheus.CounterVec
	parkedWakes  *prometheus.CounterVec
	labelPatches *prometheus.CounterVec
}

func newParkMetrics(reg prometheus.Registerer) *parkMetrics {
	const ns = metricsNamespace
	m := &parkMetrics{
		parks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "parks_total",
			Help: "Sleeping applications parked after parkAfter: their pods scaled away, the node agents keeping their copies."}, []string{"app"}),
		parkedWakes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "parked_wake_pods_total",
			Help: "Root pods of wakes from park, by placement: copy (on a node holding a hot or warm copy) or elsewhere."}, []string{"app", "placement"}),
		labelPatches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "node_label_patches_total",
			Help: "Patches of the weights node labels, by result (ok, forbidden: the dispatcher may not patch nodes, failed)."}, []string{"result"}),
	}
	reg.MustRegister(m.parks, m.parkedWakes, m.labelPatches)
	return m
}
