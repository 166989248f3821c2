// Command orchestra-dispatcher moves queued requests from NATS JetStream to
// the inference engines and streams their answers back to the gateways.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gctune"
)

func main() {
	gctune.Apply()
	configPath := flag.String("config", "/etc/orchestra/dispatcher.yaml", "dispatcher config file (YAML)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty for the in-cluster config")
	checkConfig := flag.Bool("check-config", false, "validate the config file and exit")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := dispatch.Load(*configPath)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "invalid configuration: %v\n", err)
		os.Exit(2)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = podNamespace()
	}
	if *checkConfig {
		fmt.Printf("configuration is valid: orchestra %s, %d applications\n", cfg.Orchestra, len(cfg.Apps))
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = dispatch.Run(ctx, cfg, *kubeconfig, log)
	stop()
	if err != nil {
		log.Error("dispatcher stopped", "err", err)
		os.Exit(1)
	}
}

// podNamespace is the namespace the pod runs in, from its service account.
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return string(b)
	}
	return "default"
}
