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

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/gctune"
	"github.com/model-orchestra/operator/internal/seatgroup/simengine"
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
	flag.IntVar(&cfg.PrefixCache.Tokens, "prefix-cache-tokens", cfg.PrefixCache.Tokens, "prefix cache size in tokens (0: off)")
	flag.IntVar(&cfg.PrefixCache.BlockTokens, "block-size", cfg.PrefixCache.BlockTokens, "prefix cache block size in tokens")
	flag.Float64Var(&cfg.PrefillRate, "prefill-rate", cfg.PrefillRate, "prompt tokens prefilled per second, one prompt at a time (0: prefill takes no time)")
	flag.IntVar(&cfg.EmbeddingDim, "embedding-dim", cfg.EmbeddingDim, "embedding vector length")
	flag.Float64Var(&cfg.Faults.ErrorRate, "error-rate", cfg.Faults.ErrorRate, "fraction of requests answered with --error-status")
	flag.IntVar(&cfg.Faults.ErrorStatus, "error-status", cfg.Faults.ErrorStatus, "HTTP status of injected errors")
	flag.Float64Var(&cfg.Faults.HangRate, "hang-rate", cfg.Faults.HangRate, "fraction of requests that never answer")
	flag.Float64Var(&cfg.Faults.CrashRate, "crash-rate", cfg.Faults.CrashRate, "fraction of requests that crash the engine after --crash-after-tokens tokens")
	flag.IntVar(&cfg.Faults.CrashAfterTokens, "crash-after-tokens", cfg.Faults.CrashAfterTokens, "tokens produced before an injected crash")
	weightsBytes := arena.Size(cfg.Weights.Bytes)
	flag.Var(&weightsBytes, "weights-bytes", "synthetic weights held in memory, generated from --weights-seed (e.g. 1GiB)")
	flag.Uint64Var(&cfg.Weights.Seed, "weights-seed", cfg.Weights.Seed, "seed of the synthetic weights")
	flag.StringVar(&cfg.Weights.File, "weights-file", cfg.Weights.File, "weights file read into memory at start (e.g. the model file from the cache); excludes --weights-bytes")
	flag.StringVar(&cfg.Weights.Name, "weights-name", cfg.Weights.Name, "file name of the weights in the tier directories (default <model>.weights)")
	flag.BoolVar(&cfg.Sleep.Enabled, "enable-sleep-mode", cfg.Sleep.Enabled, "serve vLLM's POST /sleep, POST /wake_up, GET /is_sleeping and POST /collective_rpc")
	flag.StringVar(&cfg.Sleep.HotDir, "hot-dir", cfg.Sleep.HotDir, "hot tier (tmpfs): where sleep level 1 offloads the weights")
	flag.BoolVar(&cfg.Sleep.KeepOffload, "keep-offload", cfg.Sleep.KeepOffload, "keep the level-1 offload in the hot tier after a wake, so the next level-1 sleep reuses it instead of writing the weights again (costs their size in RAM while awake)")
	flag.StringVar(&cfg.Sleep.WarmDir, "warm-dir", cfg.Sleep.WarmDir, "warm tier (node disk): where a level-2 wake looks after the hot tier")
	flag.StringVar(&cfg.DeviceMemory, "device-memory", cfg.DeviceMemory, "memory standing in for the accelerator's: pool (faulted in once and kept across sleeps, as GPU memory stays on the device) or kernel (a sleep returns it to the kernel, a wake faults it in again)")
	flag.StringVar(&cfg.DeviceFile, "device-file", cfg.DeviceFile, "device pool shared with the other engines that open this file (a seat-group pod's memory-backed emptyDir), instead of the process's own")
	deviceCapacity := arena.Size(cfg.DeviceCapacity)
	flag.Var(&deviceCapacity, "device-capacity", "size of the --device-file pool (e.g. 1GiB; 0: no limit): a load or wake that does not fit fails with \"device memory exhausted\"")
	flag.DurationVar(&cfg.Faults.WakeDelay, "fault-wake-delay", cfg.Faults.WakeDelay, "fault: every wake takes this much longer")
	flag.BoolVar(&cfg.Faults.WakeFail, "fault-wake-fail", cfg.Faults.WakeFail, "fault: every wake fails and the engine stays asleep")
	flag.BoolVar(&cfg.Faults.SleepLeak, "fault-sleep-leak", cfg.Faults.SleepLeak, "fault: sleep keeps the weights in memory (vllm#47654)")
	restartable := flag.Bool("restartable", false, "serve an engine the sidecar can restart in place (POST /orchestra/restart: it returns its memory and starts again on its next wake); injected crashes then abort only the connection")
	crashConn := flag.Bool("crash-connection-only", false, "an injected crash aborts only the request's connection instead of exiting the process")
	checkConfig := flag.Bool("check-config", false, "validate the flags and exit")
	jsonLogs := flag.Bool("log-json", true, "log in JSON")
	flag.Parse()
	cfg.Faults.CrashExits = !*crashConn
	cfg.Weights.Bytes = int64(weightsBytes)
	cfg.DeviceCapacity = int64(deviceCapacity)

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

	if err := sim.OpenProcessDevice(cfg); err != nil {
		log.Error("simulator not started", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	run := sim.Run
	if *restartable {
		cfg.Faults.CrashExits = false
		run = simengine.Run
	}
	err := run(ctx, cfg, log)
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
