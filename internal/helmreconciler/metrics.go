package helmreconciler

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics of the engine, registered on controller-runtime's registry and so
// served on the manager's /metrics endpoint.
var (
	reconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "orchestra_helm_reconcile_duration_seconds",
		Help:    "Time to reconcile one custom resource, by kind and outcome (noop, install, upgrade, uninstall, repair, paused, invalid, waiting, error).",
		Buckets: []float64{0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"kind", "outcome"})
	helmActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_helm_actions_total",
		Help: "Helm actions run, by kind, action (install, upgrade, rollback, uninstall, purge) and result (success, failure).",
	}, []string{"kind", "action", "result"})
	reconcileFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_helm_reconcile_failures_total",
		Help: "Failed reconciles, by kind and condition reason.",
	}, []string{"kind", "reason"})
	renders = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_helm_renders_total",
		Help: "Chart renders (post-renderer chain runs), by kind. A reconcile with nothing to change renders nothing.",
	}, []string{"kind"})
	driftRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_helm_drift_repairs_total",
		Help: "Owned objects restored after they were deleted or edited, by kind of the custom resource.",
	}, []string{"kind"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(reconcileDuration, helmActions, reconcileFailures, renders, driftRepairs)
}
