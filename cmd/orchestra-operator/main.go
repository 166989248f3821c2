// Command orchestra-operator runs the Model Orchestra operator: the Helm
// reconciler engine serving the kinds of watches.yaml with the
// ModelOrchestra plugins.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/version"
)

func main() {
	cfg := manager.Default()
	qps := float64(cfg.KubeAPIQPS)
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.WatchesFile, "watches-file", cfg.WatchesFile, "watches.yaml to load; when the default is absent, the embedded one is used")
	fs.StringVar(&cfg.ChartsDir, "charts-dir", "", "load charts from this directory instead of the embedded ones (chart paths in watches.yaml are relative to it)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", cfg.MetricsAddr, `address of /metrics ("0" disables)`)
	fs.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", cfg.ProbeAddr, `address of /healthz and /readyz ("0" disables)`)
	fs.BoolVar(&cfg.LeaderElection, "leader-elect", false, "elect a leader, so that only one replica reconciles")
	fs.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the operator's)")
	fs.DurationVar(&cfg.ReconcilePeriod, "reconcile-period", cfg.ReconcilePeriod, "default resync period (watches.yaml and the reconcile-period annotation override it)")
	fs.IntVar(&cfg.MaxConcurrentReconciles, "max-concurrent-reconciles", cfg.MaxConcurrentReconciles, "default workers per kind (watches.yaml overrides it)")
	fs.Float64Var(&qps, "kube-api-qps", float64(cfg.KubeAPIQPS), "requests per second to the API server, per client")
	fs.IntVar(&cfg.KubeAPIBurst, "kube-api-burst", cfg.KubeAPIBurst, "burst of requests to the API server, per client")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve /debug/pprof/ on the metrics address")
	fs.BoolVar(&cfg.CountAPIRequests, "count-api-requests", false, "count requests to the API server by verb and resource (metric orchestra_api_requests_total)")
	checkConfig := fs.Bool("check-config", false, "load watches.yaml, charts and plugins, report problems and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	_ = fs.Parse(os.Args[1:])
	cfg.KubeAPIQPS = float32(qps)

	if *showVersion {
		fmt.Println(version.Version)
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	// The values translator reads the CheckpointPolicies applications
	// reference: a change of one re-renders the resources that use it.
	cfg.RelatedWatches = []manager.RelatedWatch{{Owner: v1alpha1.GroupVersionKind, Kind: orchestra.CheckpointPolicyGVK, Map: orchestra.PolicyReferrers}}
	if err := cfg.Validate(); err != nil {
		log.Error(err, "invalid configuration")
		os.Exit(2)
	}
	entries, err := manager.LoadWatches(cfg, reg, operator.FS, operator.WatchesFile)
	if err != nil {
		log.Error(err, "loading watches")
		os.Exit(2)
	}
	if *checkConfig {
		for _, e := range entries {
			fmt.Printf("ok: %s serves %s with chart %s %s\n", e.Source, e.GVK, e.Chart.Name(), e.Chart.Metadata.Version)
		}
		return
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "loading kubeconfig")
		os.Exit(1)
	}
	log.Info("starting orchestra-operator", "version", version.Version)
	if err := manager.Run(ctrl.SetupSignalHandler(), restCfg, cfg, entries); err != nil {
		log.Error(err, "operator stopped")
		os.Exit(1)
	}
}
