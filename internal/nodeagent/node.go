package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/agenthttp"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// Node is the node role: the hot and warm tiers and the capability report.
type Node struct {
	cfg   NodeConfig
	store *Store
	log   *slog.Logger
	m     *nodeMetrics

	mu     sync.Mutex
	report nodeapi.NodeReport
	// hotMount says whether NewNode mounted the hot tier, or why not.
	hotMount string
	// verification is the state of the periodic re-hashing (guarded by mu).
	verification nodeapi.VerificationReport
	// wakes are the artifacts' wake histories, promotion the state of the
	// promotion ahead of predicted wakes (both guarded by mu).
	wakes     map[nodeapi.Key]*WakeHistory
	promotion nodeapi.PromotionReport
	// cold are the cold sources the agent reads, with their last copy
	// (guarded by mu).
	cold []nodeapi.ColdReport
	// nodes reads the node's container runtime version (nil, with
	// nodesErr saying why, without API access).
	nodes    NodeRuntimeReader
	nodesErr error
	// owner tells the processes of the release's engines from others: a
	// process snapshot of any other process is refused.
	owner ProcessOwner
}

// SetProcessOwner sets how the agent checks that a process to snapshot
// runs in a container of a pod of its release (ReleaseProcesses); until
// then every process is refused.
func (n *Node) SetProcessOwner(o ProcessOwner) { n.owner = o }

// SetNodeRuntimeReader sets how Measure reads the container runtime
// version of cfg.NodeName; err says why there is none.
func (n *Node) SetNodeRuntimeReader(r NodeRuntimeReader, err error) { n.nodes, n.nodesErr = r, err }

// NewNode opens the store. Call Measure to fill in bandwidths and
// capabilities before serving the report.
func NewNode(cfg NodeConfig, reg prometheus.Registerer, log *slog.Logger) (*Node, error) {
	hotMount := ""
	if cfg.MountHotTier {
		switch mounted, err := MountHotTier(cfg.Store.HotDir, cfg.Store.Budgets.Hot); {
		case err != nil:
			hotMount = err.Error()
			log.Warn("the hot tier stays as it is", "dir", cfg.Store.HotDir, "err", err)
		case mounted:
			hotMount = fmt.Sprintf("mounted a tmpfs with huge=%s", HotTierHugePages)
			log.Info("hot tier mounted", "dir", cfg.Store.HotDir, "huge", HotTierHugePages, "bytes", cfg.Store.Budgets.Hot)
		default:
			hotMount = "already a mount point: used as it is"
		}
	}
	s, err := OpenStore(cfg.Store, log)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, store: s, log: log, m: newNodeMetrics(reg), hotMount: hotMount,
		owner:        noProcessOwner{why: "the agent does not know its release's pods (it needs --release, --namespace, --node-name and list on pods)"},
		verification: nodeapi.VerificationReport{IntervalSeconds: int64(cfg.VerifyInterval / time.Second)},
		promotion:    nodeapi.PromotionReport{IntervalSeconds: int64(cfg.PromoteInterval / time.Second), MarginSeconds: int64(cfg.PromoteMargin / time.Second)}}
	if cfg.ColdDir != "" {
		n.cold = append(n.cold, coldReport(ColdFile(cfg.ColdDir)))
	}
	for _, c := range cfg.ColdS3 {
		n.cold = append(n.cold, coldReport(c))
	}
	n.loadWakes()
	s.onEvict = func(t v1alpha1.Tier, a nodeapi.ActionKind) { n.m.evictions.WithLabelValues(string(t), string(a)).Inc() }
	n.m.budget.WithLabelValues(string(v1alpha1.TierHot)).Set(float64(cfg.Store.Budgets.Hot))
	n.m.budget.WithLabelValues(string(v1alpha1.TierWarm)).Set(float64(cfg.Store.Budgets.Warm))
	n.updateGauges()
	return n, nil
}

// Store is the node's tier store.
func (n *Node) Store() *Store { return n.store }

// updateGauges sets the tiers' byte gauges from one listing of the store.
func (n *Node) updateGauges() { n.setGauges(usedBy(n.store.Entries())) }

func (n *Node) setGauges(used map[v1alpha1.Tier]int64) {
	for _, t := range v1alpha1.NodeTiers() {
		n.m.tierBytes.WithLabelValues(string(t)).Set(float64(used[t]))
	}
}

// Measure probes the node: bandwidth of memcpy and of each tier (when
// MeasureBytes > 0), criu, and the container runtime.
func (n *Node) Measure(ctx context.Context) nodeapi.NodeReport {
	r := nodeapi.NodeReport{Time: time.Now(), TransparentHugePages: transparentHugePages("enabled"), TransparentHugePagesDefrag: transparentHugePages("defrag"), FreePageReporting: arena.FreePageReporting()}
	if b := n.cfg.MeasureBytes; b > 0 {
		if one, par, err := MeasureMemcpy(b); err == nil {
			m := Peak(one, par)
			r.Memcpy = &m
			n.m.bandwidth.WithLabelValues("memcpy").Set(m.BytesPerSecond)
		} else {
			n.log.Warn("measuring memcpy", "err", err)
		}
		for _, t := range v1alpha1.NodeTiers() {
			m, err := MeasureRead(string(t), n.store.dir(t), b, arena.FileOptions{Direct: t == v1alpha1.TierWarm})
			if err != nil {
				n.log.Warn("measuring tier read bandwidth", "tier", t, "err", err)
				continue
			}
			n.m.bandwidth.WithLabelValues(string(t)).Set(m.BytesPerSecond)
			if t == v1alpha1.TierHot {
				r.Hot.Read = &m
			} else {
				r.Warm.Read = &m
			}
		}
	}
	r.CRIU = ProbeCRIU(ctx, n.cfg.CRIU)
	r.Runtime = ProbeRuntime(ctx, n.cfg.RuntimeVersion, n.cfg.NodeName, n.nodes, n.nodesErr)
	switch {
	case !r.CRIU.CheckPassed:
		r.ProcessSnapshotsReason = "criu: " + r.CRIU.Reason
	case !r.Runtime.CheckpointSupported:
		r.ProcessSnapshotsReason = "runtime: " + r.Runtime.Reason
	default:
		r.ProcessSnapshots = true
	}
	n.mu.Lock()
	r.Verification = n.report.Verification
	n.report = r
	n.mu.Unlock()
	n.log.Info("node measured", "memcpy", r.Memcpy, "hot", r.Hot.Read, "warm", r.Warm.Read,
		"criu", r.CRIU.CheckPassed, "runtime", r.Runtime.Version, "processSnapshots", r.ProcessSnapshots, "reason", r.ProcessSnapshotsReason)
	return r
}

// Report returns the last measurement with the tiers' current use.
func (n *Node) Report() nodeapi.NodeReport {
	n.mu.Lock()
	r := n.report
	r.Verification = n.verification
	r.Verification.Dropped = slices.Clone(n.verification.Dropped)
	r.Promotion = n.promotion
	r.Promotion.Done = slices.Clone(n.promotion.Done)
	r.Cold = slices.Clone(n.cold)
	n.mu.Unlock()
	entries := n.store.Entries()
	used := usedBy(entries)
	count := map[v1alpha1.Tier]int{}
	var offloads int64
	for _, e := range entries {
		count[e.Tier]++
		if e.Offload {
			offloads += e.Bytes
		}
	}
	hot, warm := r.Hot.Read, r.Warm.Read
	r.Hot = tierReport(n.cfg.Store.HotDir, v1alpha1.TierHot, n.cfg.Store.Budgets.Hot, used[v1alpha1.TierHot], count[v1alpha1.TierHot])
	r.Warm = tierReport(n.cfg.Store.WarmDir, v1alpha1.TierWarm, n.cfg.Store.Budgets.Warm, used[v1alpha1.TierWarm], count[v1alpha1.TierWarm])
	r.Hot.Read, r.Warm.Read = hot, warm
	r.Hot.Mount = n.hotMount
	r.Hot.EngineOffloadBytes = offloads
	if over := r.Hot.UsedBytes - r.Hot.BudgetBytes; over > 0 && offloads > 0 {
		r.Hot.Warning = fmt.Sprintf("the hot tier holds %d bytes, %d over its budget: %d of them are engines' level-1 offloads, which the engines release (a wake, or a sleep at level 2) and the agent never evicts; the agent admits no hot copy until they shrink", r.Hot.UsedBytes, over, offloads)
	}
	n.setGauges(used)
	return r
}

// maxDropped bounds the dropped copies the report remembers.
const maxDropped = 32

// VerifyNow re-hashes every copy the store keeps (Store.Verify), drops
// those that no longer match their digest, and records the pass in the
// report and the metrics.
func (n *Node) VerifyNow() []nodeapi.Verification {
	res := n.store.Verify()
	now := time.Now()
	n.mu.Lock()
	n.verification.LastTime, n.verification.Copies = &now, len(res)
	for _, v := range res {
		if v.Dropped {
			n.verification.Dropped = append(n.verification.Dropped, v)
		}
	}
	if k := len(n.verification.Dropped) - maxDropped; k > 0 {
		n.verification.Dropped = n.verification.Dropped[k:]
	}
	n.mu.Unlock()
	for _, v := range res {
		switch {
		case v.Dropped:
			n.m.verified.WithLabelValues(string(v.Tier), "dropped").Inc()
		case v.Error == "":
			n.m.verified.WithLabelValues(string(v.Tier), "ok").Inc()
		}
	}
	n.updateGauges()
	return res
}

// Verify runs VerifyNow every cfg.VerifyInterval until ctx ends (never when
// the interval is 0).
func (n *Node) Verify(ctx context.Context) {
	repeat(ctx, n.cfg.VerifyInterval, func() {
		res := n.VerifyNow()
		n.log.Info("kept copies verified", "copies", len(res))
	})
}

// repeat runs f every d until ctx ends; never when d is 0.
func repeat(ctx context.Context, d time.Duration, f func()) {
	if d <= 0 {
		return
	}
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// Handler serves the node API:
//
//	GET    /report                          the NodeReport
//	GET    /tiers                           budgets, use and every copy
//	POST   /promote                         PromoteRequest → the new Entry
//	POST   /demote                          DemoteRequest → DemoteResult
//	DELETE /tiers/{tier}/{namespace}/{name} remove one copy
//	POST   /verify                          re-hash every kept copy now → []Verification
//	POST   /wakes                           WakeRecord: a wake, for the prediction
//	POST   /sleeps                          SleepRecord: a sleep, for the prediction
//	POST   /promote-ahead                   plan and make the due promotions now → []PromotionDone
//	POST   /snapshots/{namespace}/{name}?pid=N  criu dump of process N, an
//	       engine's serving process in a container of a pod of the release
//	       on this node (403 otherwise, releaseproc.go)
//	POST   /snapshots/{namespace}/{name}/restore criu restore → its pid
//	       (both 501 with the reason where the node cannot snapshot)
//	GET    /healthz, /metrics
func (n *Node) Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, _ *http.Request) { agenthttp.WriteJSON(w, http.StatusOK, n.Report()) })
	mux.HandleFunc("GET /tiers", func(w http.ResponseWriter, _ *http.Request) {
		entries := n.store.Entries()
		used := usedBy(entries)
		agenthttp.WriteJSON(w, http.StatusOK, nodeapi.TiersStatus{
			Budgets: n.cfg.Store.Budgets,
			Used:    map[v1alpha1.Tier]int64{v1alpha1.TierHot: used[v1alpha1.TierHot], v1alpha1.TierWarm: used[v1alpha1.TierWarm]},
			Entries: entries,
		})
		n.setGauges(used)
	})
	mux.HandleFunc("POST /verify", func(w http.ResponseWriter, _ *http.Request) { agenthttp.WriteJSON(w, http.StatusOK, n.VerifyNow()) })
	mux.HandleFunc("POST /promote", n.handlePromote)
	mux.HandleFunc("POST /wakes", n.handleWake)
	mux.HandleFunc("POST /sleeps", n.handleSleep)
	mux.HandleFunc("POST /promote-ahead", func(w http.ResponseWriter, _ *http.Request) { agenthttp.WriteJSON(w, http.StatusOK, n.PromoteAhead()) })
	mux.HandleFunc("POST /demote", n.handleDemote)
	mux.HandleFunc("POST /snapshots/{namespace}/{name}", n.handleSnapshot)
	mux.HandleFunc("POST /snapshots/{namespace}/{name}/restore", n.handleSnapshot)
	mux.HandleFunc("DELETE /tiers/{tier}/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		t := v1alpha1.ParseTier(r.PathValue("tier"))
		k := nodeapi.Key{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
		if !t.OnNode() {
			agenthttp.WriteError(w, http.StatusBadRequest, fmt.Sprintf("want /tiers/hot|warm/<namespace>/<name>, got tier %q", t))
			return
		}
		if err := n.store.CheckKey(k); err != nil {
			agenthttp.WriteError(w, keyErrorStatus(err), fmt.Sprintf("want /tiers/hot|warm/<namespace>/<name>: %v", err))
			return
		}
		if _, ok := n.store.Lookup(k, t); !ok {
			agenthttp.WriteError(w, http.StatusNotFound, fmt.Sprintf("no copy of %s in the %s tier", k, t))
			return
		}
		if err := n.store.Remove(k, t); err != nil {
			agenthttp.WriteError(w, http.StatusInternalServerError, err.Error())
			return
		}
		n.updateGauges()
		w.WriteHeader(http.StatusNoContent)
	})
	return agenthttp.Finish(mux, reg, n.cfg.CallerTokenFile, n.log, "the agent's")
}

func (n *Node) handlePromote(w http.ResponseWriter, r *http.Request) {
	var req nodeapi.PromoteRequest
	if !agenthttp.ReadBody(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		agenthttp.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !req.To.OnNode() {
		agenthttp.WriteError(w, http.StatusBadRequest, fmt.Sprintf("to must be hot or warm, got %q", req.To))
		return
	}
	cold, err := n.coldSource(req.ColdPath, req.ColdS3, req.Digest)
	if err == nil && req.Sidecar != "" {
		if cold != nil {
			err = fmt.Errorf("sidecar %q is exclusive with coldPath and coldS3", req.Sidecar)
		} else {
			cold, err = n.sidecarSource(r.Context(), req.Sidecar)
		}
	}
	if err != nil {
		status := http.StatusBadRequest
		var sc *sidecarapi.Error
		switch {
		case errors.Is(err, ErrManifestMismatch), errors.As(err, &sc) && sc.Status == http.StatusConflict:
			status = http.StatusConflict // the manifest cannot vouch for the file
		case errors.As(err, &sc) || errors.Is(err, context.DeadlineExceeded):
			status = http.StatusBadGateway // the sidecar did not hand the files out
		}
		agenthttp.WriteError(w, status, err.Error())
		return
	}
	e, err := n.promote(r.Context(), req.Key, req.To, cold, req.Digest, req.Priority, nil)
	n.updateGauges()
	if err != nil {
		status, result := copyErrorStatus(err)
		n.m.promotions.WithLabelValues(string(req.To), result).Inc()
		n.log.Warn("promotion failed", "key", req.String(), "to", req.To, "err", err)
		agenthttp.WriteError(w, status, err.Error())
		return
	}
	n.m.promotions.WithLabelValues(string(req.To), "ok").Inc()
	agenthttp.WriteJSON(w, http.StatusOK, e)
}

// coldSource resolves the cold copy a promotion names: coldS3, one of the
// agent's S3 sources (which needs the digest to verify against), or
// coldPath, a file inside --cold-dir; nil when it names neither.
func (n *Node) coldSource(coldPath, coldS3, digest string) (ColdSource, error) {
	switch {
	case coldPath != "" && coldS3 != "":
		return nil, fmt.Errorf("coldPath %q and coldS3 %q are exclusive", coldPath, coldS3)
	case coldS3 != "":
		i := slices.IndexFunc(n.cfg.ColdS3, func(c ColdS3Source) bool { return c.Name == coldS3 })
		if i < 0 {
			return nil, fmt.Errorf("this agent has no S3 cold source %q (--cold-s3)", coldS3)
		}
		if digest == "" {
			return nil, fmt.Errorf("a copy from the S3 cold source %q needs the digest to verify it against", coldS3)
		}
		return n.cfg.ColdS3[i], nil
	case coldPath != "":
		if n.cfg.ColdDir == "" {
			return nil, errors.New("this agent has no cold tier mounted (--cold-dir)")
		}
		if !filepath.IsLocal(coldPath) {
			return nil, fmt.Errorf("coldPath %q must be a relative path inside the cold tier", coldPath)
		}
		f := ColdFile(filepath.Join(n.cfg.ColdDir, coldPath))
		// A file the fetcher's manifest lists is verified against it
		// (modelfile.go).
		switch want, listed, err := manifestFile(n.cfg.ColdDir, coldPath); {
		case err != nil:
			return nil, err
		case listed:
			return manifestVerified{ColdFile: f, want: want}, nil
		}
		return f, nil
	}
	return nil, nil
}

// promote is Store.promote; a copy it reads from the cold tier is measured
// into the report (ColdReport) and, when it verified, its rate becomes
// the artifact's cold read rate, which plans the next cold promotion.
func (n *Node) promote(ctx context.Context, k nodeapi.Key, to v1alpha1.Tier, cold ColdSource, want string, priority int32, keep map[nodeapi.Key]bool) (nodeapi.Entry, error) {
	if cold == nil {
		return n.store.promote(ctx, k, to, nil, want, priority, keep)
	}
	cr := &coldRead{ColdSource: cold}
	e, err := n.store.promote(ctx, k, to, cr, want, priority, keep)
	if cr.opened.IsZero() {
		return e, err // a faster tier held it
	}
	source := coldReport(cold).Source
	start := cr.opened
	n.mu.Lock()
	defer n.mu.Unlock()
	i := slices.IndexFunc(n.cold, func(c nodeapi.ColdReport) bool { return c.Source == source })
	if i < 0 {
		return e, err
	}
	c := &n.cold[i]
	c.LastTime, c.LastError = &start, ""
	if err != nil {
		c.LastError = err.Error()
		return e, err
	}
	b := bw(cold.String(), "copy, hashed", e.Bytes, time.Since(start))
	c.Read = &b
	n.m.bandwidth.WithLabelValues("cold/" + source).Set(b.BytesPerSecond)
	if h := n.wakes[k]; h != nil && cold.Kind() == nodeapi.ColdS3 {
		h.ColdBytesPerSecond = b.BytesPerSecond
	}
	return e, err
}

// copyErrorStatus maps a failed promotion or demotion to its HTTP status
// and the result label of its counter; anything not named here is an
// internal failure (500, "failed").
func copyErrorStatus(err error) (status int, result string) {
	switch {
	case errors.Is(err, arena.ErrMismatch), errors.Is(err, ErrDigestConflict), errors.Is(err, ErrManifestMismatch):
		// The bytes do not hash to the digest: nothing was placed.
		return http.StatusConflict, "mismatch"
	case errors.Is(err, ErrDigestRequired):
		return http.StatusBadRequest, "failed"
	case errors.Is(err, ErrNoRoom):
		return http.StatusInsufficientStorage, "failed"
	case errors.Is(err, ErrNotFound), errors.Is(err, fetch.ErrNotFound):
		return http.StatusNotFound, "failed"
	case errors.Is(err, ErrNoColdCredentials), errors.Is(err, fetch.ErrAccessDenied), errors.Is(err, ErrOtherNamespace):
		return http.StatusForbidden, "failed"
	}
	return http.StatusInternalServerError, "failed"
}

// keyErrorStatus is the HTTP status of a key CheckKey refused: 403 for
// another namespace's, 400 for a malformed one.
func keyErrorStatus(err error) int {
	if errors.Is(err, ErrOtherNamespace) {
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

func (n *Node) handleDemote(w http.ResponseWriter, r *http.Request) {
	var req nodeapi.DemoteRequest
	if !agenthttp.ReadBody(w, r, &req) {
		return
	}
	if err := req.Validate(); err != nil {
		agenthttp.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	start := time.Now()
	e, src, err := n.store.Demote(req.Key, req.Digest, req.Priority)
	n.updateGauges()
	if err != nil {
		status, result := copyErrorStatus(err)
		n.m.demotions.WithLabelValues(result).Inc()
		n.log.Warn("demotion refused", "key", req.String(), "result", result, "err", err)
		agenthttp.WriteError(w, status, err.Error())
		return
	}
	n.m.demotions.WithLabelValues("ok").Inc()
	n.log.Info("demotion", "key", req.String(), "source", src, "bytes", e.Bytes, "seconds", time.Since(start).Seconds())
	agenthttp.WriteJSON(w, http.StatusOK, nodeapi.DemoteResult{Entry: e, Source: src})
}
