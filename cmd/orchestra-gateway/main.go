// Command orchestra-gateway is the OpenAI-compatible gateway of a model
// orchestra: it authenticates API tokens, applies per-token limits and hands
// requests to the NATS JetStream queue, streaming the engines' answers back.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/model-orchestra/operator/internal/batch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/gctune"
	"github.com/model-orchestra/operator/internal/lifecyclestate"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
	"github.com/model-orchestra/operator/internal/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	gctune.Apply()
	fs := pflag.NewFlagSet("orchestra-gateway", pflag.ContinueOnError)
	configPath := fs.String("config", "/etc/orchestra-gateway/config.yaml", "the gateway's YAML configuration file")
	checkConfig := fs.Bool("check-config", false, "validate the configuration, print it as JSON and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println("orchestra-gateway", version.Version)
		return 0
	}

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("app", "orchestra-gateway")
	cfg, err := gateway.LoadConfig(*configPath)
	if err == nil {
		err = cfg.Queue.Validate()
	}
	if err != nil {
		log.Error("invalid configuration", "config", *configPath, "err", err)
		return 2
	}
	if *checkConfig {
		out, _ := json.MarshalIndent(cfg, "", "  ")
		fmt.Println(string(out))
		return 0
	}
	log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel()})).
		With("app", "orchestra-gateway")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	q, err := connectQueue(cfg.Queue, log)
	if err != nil {
		log.Error("connecting to the queue", "err", err)
		return 1
	}
	defer q.Close()
	var served queue.Queue = q
	if hasLifecycle(cfg) {
		wq, closeStates, err := withWakeStates(ctx, cfg.Queue, q, log)
		if err != nil {
			log.Error("watching lifecycle states", "err", err)
			return 1
		}
		defer closeStates()
		served = wq
	}
	store := q.ResponseStore(cfg.Responses.Retention.Duration, cfg.Responses.Replicas)
	batches := batch.NewService(q.JetStream(), batch.Config{Orchestra: cfg.Queue.Orchestra, Replicas: cfg.Responses.Replicas,
		FilesMaxBytes: cfg.Batch.StoreMaxBytes, Log: log})
	go batches.Run(ctx)
	opts := gateway.Options{Responses: store, Batches: batches}
	if hasLifecycle(cfg) {
		pods, err := q.WatchWakeProgress()
		if err != nil {
			log.Error("watching wake progress", "err", err)
			return 1
		}
		defer pods.Close()
		opts.Pods = pods
	}
	if err := gateway.RunWith(ctx, cfg, served, log, opts); err != nil {
		log.Error("gateway failed", "err", err)
		return 1
	}
	return 0
}

// connectQueue connects to the orchestra's JetStream queue.
func connectQueue(qc gateway.QueueConfig, log *slog.Logger) (*natsqueue.Client, error) {
	cc := natsqueue.DefaultClientConfig()
	cc.Orchestra = qc.Orchestra
	cc.Instance = qc.Instance
	if cc.Instance == "" {
		cc.Instance = os.Getenv("POD_NAME")
	}
	cc.SubmitTimeout = qc.SubmitTimeout.Duration
	cc.StallTimeout = qc.StallTimeout.Duration
	cc.MaxQueueWait = qc.MaxQueueWait.Duration
	var opts []nats.Option
	if qc.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(qc.CredsFile))
	}
	return natsqueue.Connect(qc.URL, cc, log, opts...)
}

// hasLifecycle reports whether a model's application has a lifecycle.
func hasLifecycle(cfg gateway.Config) bool {
	for _, m := range cfg.Models {
		if m.MaxWait.Duration > 0 {
			return true
		}
	}
	return false
}

// wakingQueue is the queue together with the lifecycle states of its
// applications, which the gateway finds through gateway.WakeStates.
type wakingQueue struct {
	*natsqueue.Client
	*lifecyclestate.States
}

// withWakeStates follows the lifecycle bucket on a connection of its own.
func withWakeStates(ctx context.Context, qc gateway.QueueConfig, q *natsqueue.Client, log *slog.Logger) (*wakingQueue, func(), error) {
	opts := []nats.Option{nats.Name("orchestra-gateway-lifecycle"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true)}
	if qc.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(qc.CredsFile))
	}
	nc, err := nats.Connect(qc.URL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS at %s: %w", qc.URL, err)
	}
	states, err := lifecyclestate.Watch(ctx, nc, qc.Orchestra, log)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return &wakingQueue{Client: q, States: states}, nc.Close, nil
}
