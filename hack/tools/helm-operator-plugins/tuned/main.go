// Command helm-operator-tuned is helm-operator-plugins' own "helm-operator
// run" command (internal/cmd/helm-operator/run of the pinned module, which
// other modules cannot import) with one addition: the Kubernetes client's
// rate limit is set by --kube-api-qps and --kube-api-burst.
//
// The shipped command takes its client configuration from controller-runtime's
// config.GetConfig, which caps every client at 20 requests/s with bursts of
// 30, and has no flag or environment variable to change it; a user of the
// library who needs more sets rest.Config.QPS and Burst in their own main, as
// this one does. Everything else (flags, manager options, the reconciler's
// options, the watches file) is what the shipped command does, so
// make bench-reconcile can run both on the same arguments and attribute the
// difference to the rate limit alone. Left out: the build-info metric and the
// version log line (internal packages), leader-election flags (the benchmark
// runs one replica), the OPERATOR_NAME environment variable and the flags'
// deprecated spellings.
//
//	helm-operator-tuned run --watches-file watches.yaml --kube-api-qps 100 --kube-api-burst 200
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	zapf "sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/operator-framework/helm-operator-plugins/pkg/annotation"
	helmmgr "github.com/operator-framework/helm-operator-plugins/pkg/manager"
	"github.com/operator-framework/helm-operator-plugins/pkg/reconciler"
	"github.com/operator-framework/helm-operator-plugins/pkg/watches"
)

var log = logf.Log.WithName("cmd")

// flags are the shipped run command's flags, with its defaults, and the
// client's rate limit.
type flags struct {
	watchesFile             string
	reconcilePeriod         time.Duration
	maxConcurrentReconciles int
	metricsBindAddress      string
	probeAddr               string
	enableHTTP2             bool
	secureMetrics           bool
	qps                     float32
	burst                   int
}

func main() {
	f := &flags{}
	zapfs := flag.NewFlagSet("zap", flag.ExitOnError)
	opts := &zapf.Options{}
	opts.BindFlags(zapfs)
	run := &cobra.Command{
		Use:   "run",
		Short: "Run the operator",
		RunE: func(*cobra.Command, []string) error {
			logf.SetLogger(zapf.New(zapf.UseFlagOptions(opts)))
			return f.run()
		},
	}
	fs := run.Flags()
	fs.StringVar(&f.watchesFile, "watches-file", "./watches.yaml", "Path to the watches file to use")
	fs.DurationVar(&f.reconcilePeriod, "reconcile-period", time.Minute, "Default reconcile period for controllers")
	fs.IntVar(&f.maxConcurrentReconciles, "max-concurrent-reconciles", runtime.NumCPU(), "Maximum number of concurrent reconciles for controllers.")
	fs.StringVar(&f.metricsBindAddress, "metrics-bind-address", ":8080", "The address the metric endpoint binds to")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	fs.BoolVar(&f.enableHTTP2, "enable-http2", false, "enables HTTP/2 on the webhook and metrics servers")
	fs.BoolVar(&f.secureMetrics, "metrics-secure", false, "enables secure serving of the metrics endpoint")
	// controller-runtime's config.GetConfig defaults, which the shipped
	// command always runs with.
	fs.Float32Var(&f.qps, "kube-api-qps", 20, "Requests per second each Kubernetes client may send")
	fs.IntVar(&f.burst, "kube-api-burst", 30, "Requests each Kubernetes client may send in a burst above --kube-api-qps")
	fs.AddGoFlagSet(zapfs)

	root := &cobra.Command{
		Use:   "helm-operator-tuned",
		Short: "helm-operator-plugins' helm-operator with a configurable client rate limit",
		Args:  cobra.MinimumNArgs(1),
	}
	root.AddCommand(run)
	if err := root.Execute(); err != nil {
		os.Exit(1)
	}
}

func (f *flags) run() error {
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("getting the client configuration: %w", err)
	}
	if f.qps <= 0 || f.burst < 1 {
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %v and %d", f.qps, f.burst)
	}
	cfg.QPS, cfg.Burst = f.qps, f.burst
	log.Info("client rate limit", "qps", cfg.QPS, "burst", cfg.Burst)

	// What the shipped command's flags.ToManagerOptions sets.
	options := manager.Options{
		Metrics:                metricsserver.Options{BindAddress: f.metricsBindAddress, SecureServing: f.secureMetrics},
		HealthProbeBindAddress: f.probeAddr,
	}
	if !f.enableHTTP2 {
		disableHTTP2 := func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }
		options.WebhookServer = webhook.NewServer(webhook.Options{TLSOpts: []func(*tls.Config){disableHTTP2}})
		options.Metrics.TLSOpts = append(options.Metrics.TLSOpts, disableHTTP2)
	}
	helmmgr.ConfigureWatchNamespaces(&options, log)

	mgr, err := manager.New(cfg, options)
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ws, err := watches.Load(f.watchesFile)
	if err != nil {
		return fmt.Errorf("loading %s: %w", f.watchesFile, err)
	}
	for _, w := range ws {
		r, err := reconciler.New(
			reconciler.WithChart(*w.Chart),
			reconciler.WithGroupVersionKind(w.GroupVersionKind),
			reconciler.WithOverrideValues(w.OverrideValues),
			reconciler.WithSelector(*w.Selector),
			reconciler.SkipDependentWatches(*w.WatchDependentResources),
			reconciler.WithMaxConcurrentReconciles(f.maxConcurrentReconciles),
			reconciler.WithReconcilePeriod(f.reconcilePeriod),
			reconciler.WithInstallAnnotations(annotation.DefaultInstallAnnotations...),
			reconciler.WithUpgradeAnnotations(annotation.DefaultUpgradeAnnotations...),
			reconciler.WithUninstallAnnotations(annotation.DefaultUninstallAnnotations...),
		)
		if err != nil {
			return fmt.Errorf("creating the reconciler of %s: %w", w.GroupVersionKind, err)
		}
		if err := r.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the controller of %s: %w", w.GroupVersionKind, err)
		}
		log.Info("configured watch", "gvk", w.GroupVersionKind, "chartDir", w.ChartPath, "maxConcurrentReconciles", f.maxConcurrentReconciles, "reconcilePeriod", f.reconcilePeriod)
	}
	log.Info("starting manager")
	if err := mgr.Start(signals.SetupSignalHandler()); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}
