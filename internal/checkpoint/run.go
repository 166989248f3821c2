package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
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
// seat's engine watch, the node's measurement), which ends with ctx.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (http.Handler, error) {
	reg := newRegistry()
	switch cfg.Role {
	case RoleSeat:
		engine, err := NewEngine(cfg.Seat.Engine, &http.Client{Timeout: cfg.Seat.WakeTimeout})
		if err != nil {
			return nil, err
		}
		slog := log.With("role", RoleSeat, "engine", engine.Name())
		if cfg.Seat.Model.Enabled() {
			// The link exists before the API answers: the engine's start
			// waits for it and loads through it.
			copies := NewModelCopies(cfg.Seat.Model)
			c, err := copies.Point()
			if err != nil {
				return nil, err
			}
			slog.Info("the engine loads its model file from the "+c.Tier+" tier", "path", c.Path, "bytes", c.Bytes, "link", cfg.Seat.Model.Link, "passedOver", copies.PassedOver())
			engine = withModelCopies(engine, copies, slog)
		}
		seat := NewSeat(cfg.Seat, engine, reg, slog)
		go seat.Watch(ctx, max(cfg.Seat.PollInterval, time.Second))
		return seat.Handler(reg), nil
	case RoleNode:
		node, err := NewNode(cfg.Node, reg, log.With("role", RoleNode))
		if err != nil {
			return nil, err
		}
		if cfg.Node.NodeName != "" && cfg.Node.RuntimeVersion == "" {
			node.SetNodeRuntimeReader(inClusterNodes())
		}
		if cfg.Node.SnapshotDir != "" {
			if rc, err := rest.InClusterConfig(); err != nil {
				log.Warn("process snapshots refused: no API access to list the release's pods", "err", err)
			} else if pods, err := NewAPIPodLister(rc, cfg.Node.Store.Namespace, cfg.Node.Release, cfg.Node.NodeName); err != nil {
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
