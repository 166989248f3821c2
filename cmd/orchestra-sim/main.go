// Command orchestra-sim is an inference-engine simulator with vLLM's
// OpenAI-compatible API, for tests, demos and benchmarks without GPUs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/model-orchestra/operator/internal/gctune"
	"github.com/model-orchestra/operator/internal/sim"
)

func main() {
	gctune.Apply()
	cfg := sim.Default()
	flag.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen address")
	flag.StringVar(&cfg.Model, "model", cfg.Model, "served model name")
	flag.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "context length in tokens")
	flag.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "requests generated at once; the rest wait")
	flag.DurationVar(&cfg.TimeToFirstToken, "ttft", cfg.TimeToFirstToken, "time to first token")
	flag.DurationVar(&cfg.InterTokenLatency, "itl", cfg.InterTokenLatency, "inter-token latency")
	flag.IntVar(&cfg.OutputTokens, "output-tokens", cfg.OutputTokens, "natural answer length in tokens (max_tokens cuts it short)")
	flag.IntVar(&cfg.EmbeddingDim, "embedding-dim", cfg.EmbeddingDim, "embedding vector length")
	flag.Float64Var(&cfg.Faults.ErrorRate, "error-rate", cfg.Faults.ErrorRate, "fraction of requests answered with --error-status")
	flag.IntVar(&cfg.Faults.ErrorStatus, "error-status", cfg.Faults.ErrorStatus, "HTTP status of injected errors")
	flag.Float64Var(&cfg.Faults.HangRate, "hang-rate", cfg.Faults.HangRate, "fraction of requests that never answer")
	flag.Float64Var(&cfg.Faults.CrashRate, "crash-rate", cfg.Faults.CrashRate, "fraction of requests that crash the engine after --crash-after-tokens tokens")
	flag.IntVar(&cfg.Faults.CrashAfterTokens, "crash-after-tokens", cfg.Faults.CrashAfterTokens, "tokens produced before an injected crash")
	crashConn := flag.Bool("crash-connection-only", false, "an injected crash aborts only the request's connection instead of exiting the process")
	checkConfig := flag.Bool("check-config", false, "validate the flags and exit")
	jsonLogs := flag.Bool("log-json", true, "log in JSON")
	flag.Parse()
	cfg.Faults.CrashExits = !*crashConn

	var h slog.Handler = slog.NewJSONHandler(os.Stderr, nil)
	if !*jsonLogs {
		h = slog.NewTextHandler(os.Stderr, nil)
	}
	log := slog.New(h)

	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "invalid configuration: %v\n", err)
		os.Exit(2)
	}
	if *checkConfig {
		fmt.Println("configuration is valid")
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := sim.Run(ctx, cfg, log)
	stop()
	switch {
	case errors.Is(err, sim.ErrCrashed):
		log.Error("simulator crashed on purpose", "err", err)
		os.Exit(3)
	case err != nil:
		log.Error("simulator stopped", "err", err)
		os.Exit(1)
	}
}
