package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Run connects to NATS (and Kubernetes when an application names a
// Service), serves /healthz, /readyz and /metrics on cfg.ListenAddr and
// dispatches until ctx ends. kubeconfig may be empty (in-cluster config).
func Run(ctx context.Context, cfg Config, kubeconfig string, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid dispatcher config: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.ListenAddr, err)
	}
	return Serve(ctx, cfg, kubeconfig, log, ln)
}

// Serve is Run on a listener the caller opened (and Serve closes); tests
// use it to serve on a free port.
func Serve(ctx context.Context, cfg Config, kubeconfig string, log *slog.Logger, ln net.Listener) error {
	defer func() { _ = ln.Close() }() // also closed by the server's shutdown
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid dispatcher config: %w", err)
	}
	opts := []nats.Option{
		nats.Name("orchestra-dispatcher"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("disconnected from NATS", "err", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("reconnected to NATS", "url", nc.ConnectedUrl()) }),
	}
	if cfg.NATS.CredentialsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.NATS.CredentialsFile))
	}
	nc, err := nats.Connect(cfg.NATS.URL, opts...)
	if err != nil {
		return fmt.Errorf("connecting to NATS at %s: %w", cfg.NATS.URL, err)
	}
	defer nc.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	dopts := []Option{WithRegistry(reg)}
	if needsKubernetes(cfg) {
		cs, err := kubeClient(kubeconfig)
		if err != nil {
			return err
		}
		dopts = append(dopts, WithKubernetes(cs))
	}
	d, err := New(cfg, nc, log, dopts...)
	if err != nil {
		return err
	}

	srv := &http.Server{Handler: d.OpsHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving health and metrics", "err", err)
		}
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return d.Run(ctx)
}

// OpsHandler serves /healthz (the process is up), /readyz (Ready: the
// streams and consumers are provisioned and NATS is connected) and
// /metrics (the dispatcher's registry).
func (d *Dispatcher) OpsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
	return mux
}

func needsKubernetes(cfg Config) bool {
	if cfg.Lifecycle != nil {
		return true
	}
	for _, a := range cfg.Apps {
		if len(a.Endpoints) == 0 {
			return true
		}
	}
	return false
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading Kubernetes client config: %w", err)
	}
	// One client, and so one client-side rate limit, carries the
	// lifecycle leader's replica writes, its status annotations, events
	// and Lease renewals: client-go's default (5 requests a second, bursts
	// of 10) would hold a wake's replica write behind them whenever a few
	// applications wake or drain at once.
	rc.QPS, rc.Burst = kubeAPIQPS, kubeAPIBurst
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating Kubernetes client: %w", err)
	}
	return cs, nil
}

// The dispatcher's client-side rate limit on the API server.
const (
	kubeAPIQPS   = 50
	kubeAPIBurst = 100
)
