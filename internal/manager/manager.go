// Package manager runs the Helm reconciler engine: one controller per
// watches.yaml entry in one controller-runtime manager, with leader
// election, health probes, Prometheus metrics and graceful shutdown.
package manager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/model-orchestra/operator/internal/helmreconciler"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/watches"
)

// EnvWatchNamespace is the comma-separated list of namespaces to serve;
// empty or unset means all namespaces. OLM sets it from the OperatorGroup.
const EnvWatchNamespace = "WATCH_NAMESPACE"

// Config is the operator's configuration.
type Config struct {
	// WatchesFile is the watches.yaml to load. When it is the default and
	// does not exist, the embedded watches.yaml is used.
	WatchesFile string
	// ChartsDir, when set, loads charts from this directory instead of the
	// embedded ones; chart paths in watches.yaml are relative to it.
	ChartsDir string
	// WatchNamespaces are the namespaces served; empty means all.
	WatchNamespaces []string
	// MetricsAddr serves /metrics ("0" disables).
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz ("0" disables).
	ProbeAddr string
	// LeaderElection makes only one replica reconcile at a time.
	LeaderElection bool
	// LeaderElectionID names the Lease.
	LeaderElectionID string
	// LeaderElectionNamespace holds the Lease; default: the namespace the
	// operator runs in.
	LeaderElectionNamespace string
	// ReconcilePeriod is the default resync period.
	ReconcilePeriod time.Duration
	// MaxConcurrentReconciles is the default number of workers per entry.
	MaxConcurrentReconciles int
	// ActionTimeout bounds one Helm action.
	ActionTimeout time.Duration
	// GracefulShutdownTimeout bounds how long running reconciles may take to
	// finish on shutdown.
	GracefulShutdownTimeout time.Duration
	// ChunkSize is the largest release data per Secret (0 = default).
	ChunkSize int
	// KubeAPIQPS and KubeAPIBurst rate-limit each client of the operator.
	// An install takes about ten requests; client-go's defaults (5/10, or
	// controller-runtime's 20/30) would cap the operator at a few
	// installs per second. API Priority and Fairness protects the server.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// Pprof serves Go's /debug/pprof/ on the metrics address.
	Pprof bool
	// CountAPIRequests counts every request to the API server by verb and
	// resource in the metric orchestra_api_requests_total (a debug aid:
	// what one install costs in round trips).
	CountAPIRequests bool
	// RelatedWatches are the other kinds the values translators read, and
	// the resources to reconcile when one changes.
	RelatedWatches []RelatedWatch
}

// DefaultWatchesFile is the default of Config.WatchesFile.
const DefaultWatchesFile = "./watches.yaml"

// Default returns the default configuration, with WatchNamespaces read from
// WATCH_NAMESPACE.
func Default() Config {
	return Config{
		WatchesFile:             DefaultWatchesFile,
		WatchNamespaces:         ParseNamespaces(os.Getenv(EnvWatchNamespace)),
		MetricsAddr:             ":8080",
		ProbeAddr:               ":8081",
		LeaderElectionID:        "orchestra-operator.modelorchestra.io",
		ReconcilePeriod:         time.Minute,
		MaxConcurrentReconciles: runtime.NumCPU(),
		ActionTimeout:           5 * time.Minute,
		GracefulShutdownTimeout: 30 * time.Second,
		KubeAPIQPS:              100,
		KubeAPIBurst:            200,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.WatchesFile == "":
		return errors.New("watches file: must not be empty")
	case c.ReconcilePeriod < 0:
		return fmt.Errorf("reconcile period: must not be negative, got %s", c.ReconcilePeriod)
	case c.MaxConcurrentReconciles < 1:
		return fmt.Errorf("max concurrent reconciles: must be at least 1, got %d", c.MaxConcurrentReconciles)
	case c.ActionTimeout <= 0:
		return fmt.Errorf("action timeout: must be positive, got %s", c.ActionTimeout)
	case c.KubeAPIQPS <= 0 || c.KubeAPIBurst < 1:
		return fmt.Errorf("kube API QPS and burst: must be positive, got %v and %d", c.KubeAPIQPS, c.KubeAPIBurst)
	case c.LeaderElection && c.LeaderElectionID == "":
		return errors.New("leader election id: must not be empty with leader election")
	}
	return nil
}

// ParseNamespaces parses a WATCH_NAMESPACE value.
func ParseNamespaces(v string) []string {
	var out []string
	for _, ns := range strings.Split(v, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			out = append(out, ns)
		}
	}
	return out
}

// LoadWatches loads the configured watches.yaml and charts. embedded holds
// the watches.yaml and charts built into the binary (paths as in the
// repository); it is used unless the configuration points to disk.
func LoadWatches(c Config, reg *plugin.Registry, embedded fs.FS, embeddedWatches string) ([]watches.Entry, error) {
	charts := embedded
	if c.ChartsDir != "" {
		charts = os.DirFS(c.ChartsDir)
	}
	if c.WatchesFile == DefaultWatchesFile && embedded != nil {
		if _, err := os.Stat(c.WatchesFile); errors.Is(err, fs.ErrNotExist) {
			data, err := fs.ReadFile(embedded, embeddedWatches)
			if err != nil {
				return nil, fmt.Errorf("reading the embedded %s: %w", embeddedWatches, err)
			}
			return watches.Parse("embedded "+embeddedWatches, data, charts, reg)
		}
	}
	return watches.Load(c.WatchesFile, charts, reg)
}

// Option adjusts the controller-runtime options of New, for embedding and
// tests (for example several managers in one test process).
type Option func(*ctrl.Options)

// New builds a manager serving entries, with one reconciler per entry.
func New(restCfg *rest.Config, c Config, entries []watches.Entry, opts ...Option) (ctrl.Manager, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst = c.KubeAPIQPS, c.KubeAPIBurst
	if c.CountAPIRequests {
		restCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt} })
	}
	byObject := map[client.Object]cache.ByObject{}
	for i := range entries {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(entries[i].GVK)
		sel := entries[i].Selector
		if sel == nil {
			sel = labels.Everything()
		}
		byObject[u] = cache.ByObject{Label: sel}
	}
	related, err := servedRelated(context.Background(), restCfg, c.RelatedWatches, entries, c.WatchNamespaces)
	if err != nil {
		return nil, err
	}
	cacheRelated(byObject, related)
	cacheOpts := cache.Options{
		// Owned objects and release Secrets carry Helm's managed-by label;
		// nothing else of the cluster is cached.
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{helmreconciler.LabelManagedBy: helmreconciler.ManagedByHelm}),
		ByObject:             byObject,
		// managedFields are often the largest part of an object and nothing
		// in the engine reads them from the cache.
		DefaultTransform: helmreconciler.StripManagedFields(),
	}
	if len(c.WatchNamespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range c.WatchNamespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	shutdown := c.GracefulShutdownTimeout
	mopts := ctrl.Options{
		MapperProvider:                newCachedMapper,
		Cache:                         cacheOpts,
		Client:                        client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Metrics:                       metricsOptions(c),
		HealthProbeBindAddress:        c.ProbeAddr,
		LeaderElection:                c.LeaderElection,
		LeaderElectionID:              c.LeaderElectionID,
		LeaderElectionNamespace:       c.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &shutdown,
	}
	for _, o := range opts {
		o(&mopts)
	}
	mgr, err := ctrl.NewManager(restCfg, mopts)
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	// Under OLM, the engine tells the reporter of OLM's Upgradeable
	// condition of its Helm actions.
	actions, err := addUpgradeableReporter(mgr)
	if err != nil {
		return nil, err
	}
	recs := make([]*helmreconciler.Reconciler, len(entries))
	for i := range entries {
		if recs[i], err = helmreconciler.New(mgr, &entries[i], helmreconciler.Options{
			ReconcilePeriod:         c.ReconcilePeriod,
			MaxConcurrentReconciles: c.MaxConcurrentReconciles,
			ActionTimeout:           c.ActionTimeout,
			ChunkSize:               c.ChunkSize,
			Actions:                 actions,
		}); err != nil {
			return nil, fmt.Errorf("%s: %w", entries[i].Source, err)
		}
	}
	if err := watchRelated(mgr, related, entries, recs); err != nil {
		return nil, err
	}
	if c.ProbeAddr != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("cache-synced", func(req *http.Request) error {
			ctx, cancel := context.WithTimeout(req.Context(), time.Second)
			defer cancel()
			if !mgr.GetCache().WaitForCacheSync(ctx) {
				return errors.New("cache not synced")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully.
func Run(ctx context.Context, restCfg *rest.Config, c Config, entries []watches.Entry) error {
	mgr, err := New(restCfg, c, entries)
	if err != nil {
		return err
	}
	log := ctrl.Log.WithName("manager")
	kinds := make([]string, 0, len(entries))
	for _, e := range entries {
		kinds = append(kinds, e.GVK.String()+" <- "+e.ChartName)
	}
	log.Info("starting", "entries", kinds, "namespaces", c.WatchNamespaces, "leaderElection", c.LeaderElection)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

func metricsOptions(c Config) metricsserver.Options {
	o := metricsserver.Options{BindAddress: c.MetricsAddr}
	if c.Pprof {
		o.ExtraHandlers = map[string]http.Handler{
			"/debug/pprof/":        http.HandlerFunc(pprof.Index),
			"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
			"/debug/pprof/heap":    pprof.Handler("heap"),
		}
	}
	return o
}
