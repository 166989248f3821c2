// Command orchestra-agent puts idle engines to sleep and wakes them, and
// keeps model weights in a node's RAM and disk tiers. One binary, two roles:
// --role sidecar is the sidecar in each engine pod (drives the engine's sleep
// API over localhost, serves the engine's readiness), --role node is the
// DaemonSet that owns the hot (tmpfs) and warm (disk) tiers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/gctune"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/version"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	gctune.Apply()
	cfg := agent.Default()
	fs := pflag.NewFlagSet("orchestra-agent", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Role, "role", cfg.Role, "sidecar (the agent beside each engine in its pod) or node (DaemonSet owning the hot and warm tiers); seat is a deprecated alias of sidecar")
	fs.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen address of the agent API, /readyz and /metrics")

	s := &cfg.Sidecar
	fs.StringVar((*string)(&s.Engine.Kind), "engine", string(s.Engine.Kind), "sidecar: engine kind (vllm, simulator, ollama, llamacpp)")
	fs.StringVar(&s.Engine.URL, "engine-url", s.Engine.URL, "sidecar: the engine's base URL (localhost)")
	fs.StringVar(&s.Engine.Model, "model", s.Engine.Model, "sidecar: model name (ollama, llamacpp router)")
	fs.StringVar(&s.Engine.KeepAlive, "keep-alive", s.Engine.KeepAlive, "sidecar: ollama keep_alive of the preload on wake")
	fs.BoolVar(&s.Engine.SlotSave, "slot-save", s.Engine.SlotSave, "sidecar: llamacpp saves and restores slot 0's prompt cache around sleep")
	fs.IntVar(&s.SleepLevel, "sleep-level", s.SleepLevel, "sidecar: default sleep level (1 keeps weights in RAM, 2 drops them)")
	fs.DurationVar(&s.DrainTimeout, "drain-timeout", s.DrainTimeout, "sidecar: wait this long for in-flight requests before giving up a sleep")
	fs.DurationVar(&s.SleepTimeout, "sleep-timeout", s.SleepTimeout, "sidecar: bound of the engine's sleep call")
	fs.DurationVar(&s.WakeTimeout, "wake-timeout", s.WakeTimeout, "sidecar: bound of the engine's wake call")
	fs.DurationVar(&s.PollInterval, "poll-interval", s.PollInterval, "sidecar: pace of drain checks")
	fs.BoolVar(&s.RestartProcess, "restart-process", s.RestartProcess, "sidecar: POST /restart stops the engine container's processes (found by the port of --engine-url) for the kubelet to start it again; needs shareProcessNamespace and the engine's user")
	fs.DurationVar(&s.RestartGrace, "restart-grace", s.RestartGrace, "sidecar: wait between SIGTERM and SIGKILL of a process restart")
	fs.StringVar(&s.Model.Link, "model-link", s.Model.Link, "sidecar: symlink the engine opens as its model file (in a directory shared with the engine); the sidecar points it at the hottest verified copy at start and before each wake (ollama, llamacpp); empty: not pointed")
	fs.StringVar(&s.Model.ModelDir, "model-dir", s.Model.ModelDir, "sidecar: the model cache (e.g. /models), with the fetcher's .orchestra/manifest.json (--model-link)")
	fs.StringVar(&s.Model.File, "model-file", s.Model.File, "sidecar: the model file inside --model-dir (--model-link)")
	fs.StringVar(&s.Model.HotDir, "copy-hot-dir", s.Model.HotDir, "sidecar: the node agent's hot tier directory of the namespace (--model-link); empty: not used")
	fs.StringVar(&s.Model.WarmDir, "copy-warm-dir", s.Model.WarmDir, "sidecar: the node agent's warm tier directory of the namespace (--model-link); empty: not used")
	fs.StringVar(&s.Model.Name, "copy-name", s.Model.Name, "sidecar: the copies' name in the tiers (the ModelCheckpoint's) (--model-link)")
	fs.StringVar(&s.NvidiaSMI, "nvidia-smi", s.NvidiaSMI, "sidecar: nvidia-smi binary to read the engine's device memory with (by its processes' PIDs; needs shareProcessNamespace); empty: the engine's own report")

	n := &cfg.Node
	fs.StringVar(&n.Store.HotDir, "hot-dir", n.Store.HotDir, "node: hot tier directory (a tmpfs)")
	fs.StringVar(&n.Store.WarmDir, "warm-dir", n.Store.WarmDir, "node: warm tier directory (node-local disk)")
	fs.StringVar(&n.Store.Namespace, "namespace", n.Store.Namespace, "node: keep only this namespace's copies (<dir>/<namespace>) and refuse other namespaces' keys; empty keeps every namespace's")
	fs.IntVar(&n.Store.Group, "copy-group", n.Store.Group, "node: group id of the namespace directories (0750), copies and metadata (0640) the agent writes, for engines running as non-root with it as a supplementary group; the agent must run with it too; 0 keeps them private to the agent (0700, 0600)")
	hot, warm, probe := arena.Size(n.Store.Budgets.Hot), arena.Size(n.Store.Budgets.Warm), arena.Size(n.MeasureBytes)
	fs.Var(&hot, "hot-max-bytes", "node: hot tier budget (e.g. 8GiB)")
	fs.Var(&warm, "warm-max-bytes", "node: warm tier budget")
	fs.Var(&probe, "measure-bytes", "node: size of the bandwidth probes at start (0 skips them)")
	fs.StringVar(&n.ColdDir, "cold-dir", n.ColdDir, "node: mount of the cold tier (model cache); promotion sources are inside it")
	coldS3 := fs.StringArray("cold-s3", nil, "node: an S3 object the agent may copy as an application's cold copy: name=<app>,url=s3://<bucket>/<key>[,endpoint=<url>][,region=<r>][,credentials=<dir holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY>]; repeat for each application")
	fs.StringVar(&n.RuntimeVersion, "runtime-version", n.RuntimeVersion, "node: the node's containerRuntimeVersion (e.g. containerd://1.6.20), an override; empty reads it from the node --node-name, else asks containerd --version")
	fs.StringVar(&n.NodeName, "node-name", os.Getenv("NODE_NAME"), "node: this agent's node (default $NODE_NAME, the downward API's spec.nodeName), whose containerRuntimeVersion it reads (get on nodes)")
	fs.StringVar(&n.Release, "release", n.Release, "node: the agent's Helm release (its pods' app.kubernetes.io/instance): a process snapshot is taken only of a process in a container of this release's pods in --namespace on --node-name")
	fs.StringVar(&n.CRIU, "criu", n.CRIU, "node: criu binary probed with criu check (empty skips it)")
	fs.BoolVar(&n.MountHotTier, "mount-hot-tier", n.MountHotTier, "node: mount a tmpfs with huge=within_size (size: the hot budget) at --hot-dir unless it is a mount point (needs CAP_SYS_ADMIN)")
	fs.StringVar(&n.SnapshotDir, "snapshot-dir", n.SnapshotDir, "node: directory for process snapshots (criu images); empty disables them")
	fs.DurationVar(&n.PromoteInterval, "promote-interval", n.PromoteInterval, "node: predict the artifacts' next wakes from the reported ones (POST /wakes) and promote the due ones a tier up at this period; 0 never")
	callerToken := fs.String("caller-token-file", "", "sidecar and node: file holding the release's caller token (a mounted Secret key): the mutating endpoints accept only requests carrying it (Authorization: Bearer); empty accepts any caller the network lets through")
	fs.DurationVar(&n.PromoteMargin, "promote-margin", n.PromoteMargin, "node: start a promotion this much before its copy time says it must")

	verify := fs.DurationSlice("verify-interval", []time.Duration{n.VerifyInterval}, "node: re-hash every kept copy at this period and drop one that no longer matches its digest; given several times (one per application), the shortest wins; 0 never")

	checkConfig := fs.Bool("check-config", false, "validate the configuration, print it as JSON and exit")
	logFormat := fs.String("log-format", "json", "log format: json or text")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "orchestra-agent", version.Version)
		return 0
	}
	n.Store.Budgets.Hot, n.Store.Budgets.Warm, n.MeasureBytes = int64(hot), int64(warm), int64(probe)
	s.CallerTokenFile, n.CallerTokenFile = *callerToken, *callerToken
	if fs.Changed("verify-interval") && len(*verify) > 0 {
		n.VerifyInterval = slices.Min(*verify)
	}

	var coldErrs []error
	for _, v := range *coldS3 {
		c, err := nodeagent.ParseColdS3Source(v)
		coldErrs = append(coldErrs, err)
		n.ColdS3 = append(n.ColdS3, c)
	}

	var h slog.Handler = slog.NewJSONHandler(stderr, nil)
	if *logFormat == "text" {
		h = slog.NewTextHandler(stderr, nil)
	}
	log := slog.New(h).With("app", "orchestra-agent")
	if role, deprecated := agent.CanonicalRole(cfg.Role); deprecated {
		log.Warn("--role "+cfg.Role+" is deprecated and will be removed in the next release: use --role "+role, "role", role)
		cfg.Role = role
	}

	if err := errors.Join(append(coldErrs, cfg.Validate())...); err != nil {
		log.Error("invalid configuration", "err", err)
		return 2
	}
	if *checkConfig {
		out, _ := json.MarshalIndent(cfg, "", "  ")
		fmt.Fprintln(stdout, string(out))
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx, cfg, log); err != nil {
		log.Error("agent stopped", "err", err)
		return 1
	}
	return 0
}
