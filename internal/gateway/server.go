package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/model-orchestra/operator/internal/queue"
)

// Run serves the gateway described by cfg in front of q until ctx is done,
// then drains (see Serve). It loads API tokens from the Kubernetes Secrets
// selected by cfg.Auth.
func Run(ctx context.Context, cfg Config, q queue.Queue, logger *slog.Logger) error {
	return RunWith(ctx, cfg, q, logger, Options{})
}

// RunWith is Run with collaborators: opts.Responses (the store of the
// Responses API) and opts.Wake are used as given; Tokens and Logger are
// set by RunWith (Wake from q when q has it and opts has none).
func RunWith(ctx context.Context, cfg Config, q queue.Queue, logger *slog.Logger, opts Options) error {
	var tokens TokenSource
	if cfg.Auth.SecretSelector != "" {
		st, err := newSecretTokensFromConfig(cfg, logger)
		if err != nil {
			return err
		}
		st.Start(ctx)
		tokens = st
	}
	opts.Tokens, opts.Logger = tokens, logger
	if ws, ok := q.(WakeStates); ok && opts.Wake == nil {
		opts.Wake = ws
	}
	g, err := New(cfg, q, opts)
	if err != nil {
		return err
	}
	return g.Serve(ctx)
}

func newSecretTokensFromConfig(cfg Config, logger *slog.Logger) (*SecretTokens, error) {
	var key []byte
	if cfg.Auth.HashKeyFile != "" {
		k, err := readHashKey(cfg.Auth.HashKeyFile)
		if err != nil {
			return nil, fmt.Errorf("reading token hash key: %w", err)
		}
		key = k
	}
	ns, err := namespace(cfg.Auth.Namespace)
	if err != nil {
		return nil, err
	}
	var rc *rest.Config
	if cfg.Auth.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Auth.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("configuring the Kubernetes client: %w", err)
	}
	rc.UserAgent = "orchestra-gateway"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	return NewSecretTokens(client, ns, cfg.Auth.SecretSelector, NewTokenHasher(key), cfg.Limits.Default, logger)
}

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// namespace resolves the token Secrets' namespace: the configured one, else
// POD_NAMESPACE, else the service account's.
func namespace(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns, nil
	}
	raw, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return "", fmt.Errorf("finding the gateway's namespace (set auth.namespace or POD_NAMESPACE): %w", err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// closeWhileDraining answers every request that arrives while the gateway
// drains with "Connection: close": a client's kept-alive connection to it
// then ends after an answer, which the client knows, and its next request
// opens a new connection, which the Service sends to another gateway. The
// gateway never closes a kept-alive connection that a client may be
// sending a request on, until the drain delay is over.
func (g *Gateway) closeWhileDraining(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// Serve listens on the configured addresses and serves until ctx is done.
// Then it drains: /readyz fails at once, the listeners stay open for
// server.drainDelay so that load balancers notice, then close; in-flight
// requests, streams included, may finish within server.drainTimeout, after
// which they are cancelled (and their replies closed).
func (g *Gateway) Serve(ctx context.Context) error {
	api, err := net.Listen("tcp", g.cfg.Server.Address)
	if err != nil {
		return fmt.Errorf("listening for the API: %w", err)
	}
	var ops net.Listener
	if g.cfg.Server.OpsAddress != "" {
		if ops, err = net.Listen("tcp", g.cfg.Server.OpsAddress); err != nil {
			_ = api.Close()
			return fmt.Errorf("listening for metrics and probes: %w", err)
		}
	}
	return g.serve(ctx, api, ops)
}

func (g *Gateway) serve(ctx context.Context, api, ops net.Listener) error {
	// Requests outlive ctx while draining; hardStop cancels them at the end
	// of the drain timeout.
	reqCtx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()
	errLog := slog.NewLogLogger(g.logger.Handler(), slog.LevelWarn)
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: g.cfg.Server.ReadHeaderTimeout.Duration,
			ReadTimeout:       g.cfg.Server.ReadTimeout.Duration,
			IdleTimeout:       g.cfg.Server.IdleTimeout.Duration,
			BaseContext:       func(net.Listener) context.Context { return reqCtx },
			ErrorLog:          errLog,
		}
	}

	servers := []*http.Server{newServer(g.closeWhileDraining(g.api))}
	listeners := []net.Listener{api}
	if ops != nil {
		servers = append(servers, newServer(g.ops))
		listeners = append(listeners, ops)
	}
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		g.logger.Info("listening", "address", listeners[i].Addr().String(), "api", i == 0)
		go func() {
			if err := srv.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		g.logger.Error("server failed; stopping", "error", serveErr)
	}

	g.draining.Store(true)
	g.logger.Info("draining", "delay", g.cfg.Server.DrainDelay.Duration, "timeout", g.cfg.Server.DrainTimeout.Duration)
	if serveErr == nil && g.cfg.Server.DrainDelay.Duration > 0 {
		t := time.NewTimer(g.cfg.Server.DrainDelay.Duration)
		<-t.C
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), g.cfg.Server.DrainTimeout.Duration)
	defer cancel()
	// The API first; metrics and probes keep answering while it drains.
	for _, srv := range servers {
		if err := srv.Shutdown(drainCtx); err != nil {
			g.logger.Warn("drain timeout reached; cancelling the remaining requests")
			hardStop()
			_ = srv.Close()
		}
	}
	// After a hard stop, give the cancelled requests a moment to close
	// their replies, which cancels them down to the engine.
	done := make(chan struct{})
	go func() { g.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		g.logger.Warn("requests still running after the drain")
	}
	g.lanes.close()
	g.logger.Info("stopped")
	return serveErr
}
