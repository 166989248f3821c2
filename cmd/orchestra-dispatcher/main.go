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
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/model-orchestra/operator/internal/dispatch"
)

func main() {
	tuneGC()
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

// gcPercent is the data plane's GOGC (the same in orchestra-gateway,
// orchestra-dispatcher, orchestra-sim and make bench-dataplane). Their live
// heaps are small and they allocate per request, so the default 100 spends
// about a tenth of the CPU on collections; 400 collects a quarter as often.
// docs/dispatcher.md ("Garbage collector") has the measurements.
const gcPercent = 400

// tuneGC applies gcPercent and a soft memory limit of 80% of the
// container's (cgroup) memory limit, so that the larger heap target
// collects harder instead of running out of memory. GOGC and GOMEMLIMIT in
// the environment win over both.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && limit > 0 && limit < 1<<50 { // "max" or a huge v1 value: no limit
			debug.SetMemoryLimit(limit / 10 * 8)
		}
		return
	}
}
