package nodeagent

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
)

// StartNode builds the node agent of cfg, registers its metrics in reg
// and starts its background work (measuring the tiers, re-verifying the
// copies, promoting ahead of predicted wakes), which ends with ctx; it
// returns the node agent's HTTP API.
func StartNode(ctx context.Context, cfg NodeConfig, reg *prometheus.Registry, log *slog.Logger) (http.Handler, error) {
	node, err := NewNode(cfg, reg, log)
	if err != nil {
		return nil, err
	}
	if cfg.NodeName != "" && cfg.RuntimeVersion == "" {
		node.SetNodeRuntimeReader(inClusterNodes())
	}
	if cfg.SnapshotDir != "" {
		if rc, err := rest.InClusterConfig(); err != nil {
			log.Warn("process snapshots refused: no API access to list the release's pods", "err", err)
		} else if pods, err := NewAPIPodLister(rc, cfg.Store.Namespace, cfg.Release, cfg.NodeName); err != nil {
			log.Warn("process snapshots refused", "err", err)
		} else {
			node.SetProcessOwner(ReleaseProcesses{Pods: pods})
		}
	}
	go node.Measure(ctx)
	go node.Verify(ctx)
	go node.Promote(ctx)
	return node.Handler(reg), nil
}
