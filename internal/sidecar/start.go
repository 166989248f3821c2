package sidecar

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Start builds the sidecar of cfg's engine, registers its metrics in
// reg and starts its watch of the engine, which ends with ctx; it returns
// the sidecar's HTTP API.
func Start(ctx context.Context, cfg Config, reg *prometheus.Registry, log *slog.Logger) (http.Handler, error) {
	engine, err := NewEngine(cfg.Engine, &http.Client{Timeout: cfg.WakeTimeout})
	if err != nil {
		return nil, err
	}
	log = log.With("engine", engine.Name())
	if cfg.Model.Enabled() {
		// The link exists before the API answers: the engine's start
		// waits for it and loads through it.
		copies := NewModelCopies(cfg.Model)
		c, err := copies.Point()
		if err != nil {
			return nil, err
		}
		log.Info("the engine loads its model file from the "+string(c.Tier)+" tier", "path", c.Path, "bytes", c.Bytes, "link", cfg.Model.Link, "passedOver", copies.PassedOver())
		engine = withModelCopies(engine, copies, log)
	}
	sidecar := New(cfg, engine, reg, log)
	go sidecar.Watch(ctx, max(cfg.PollInterval, time.Second))
	return withModelFiles(sidecar.Handler(reg), cfg.Model, cfg.CallerTokenFile), nil
}
