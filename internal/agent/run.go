package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/model-orchestra/operator/internal/agenthttp"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/sidecar"
)

// Run serves the agent in its role until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid agent config: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Addr, err)
	}
	h, err := Start(ctx, cfg, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	return serve(ctx, ln, h, log)
}

// Start builds the role's handler and starts its background work (the
// sidecar's engine watch, the node agent's measurement), which ends with
// ctx.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (http.Handler, error) {
	reg := agenthttp.NewRegistry()
	switch cfg.Role {
	case RoleSidecar:
		return sidecar.Start(ctx, cfg.Sidecar, reg, log.With("role", RoleSidecar))
	case RoleNode:
		return nodeagent.StartNode(ctx, cfg.Node, reg, log.With("role", RoleNode))
	}
	return nil, fmt.Errorf("unknown role %q", cfg.Role)
}

func serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("agent serving", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}
