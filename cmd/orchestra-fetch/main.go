// Command orchestra-fetch downloads and verifies a model into a cache
// directory. It is the model-cache Job of a ModelOrchestra and a CLI.
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

	"github.com/spf13/pflag"
	// CA roots compiled in, used when the system has none: the fetch image
	// is a static binary without /etc/ssl, and the hub, https sources and
	// S3 endpoints all speak TLS.
	_ "golang.org/x/crypto/x509roots/fallback"
	"golang.org/x/term"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg := fetch.Default()
	fs := pflag.NewFlagSet("orchestra-fetch", pflag.ContinueOnError)
	fetch.BindFlags(fs, &cfg)
	checkConfig := fs.Bool("check-config", false, "validate the configuration, print it as JSON and exit")
	logFormat := fs.String("log-format", "auto", "log format: json, text or auto (text on a terminal)")
	progressBar := fs.String("progress-bar", "auto", "progress bar on stderr: auto (on a terminal), always or never")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return fetch.ExitOK
		}
		return fetch.ExitBadInput
	}
	if *showVersion {
		fmt.Println("orchestra-fetch", version.Version)
		return fetch.ExitOK
	}
	cfg.ApplyEnv(os.Getenv)
	if cfg.ProgressConfigMap != "" && cfg.ProgressNamespace == "" {
		cfg.ProgressNamespace = fetch.PodNamespace()
	}

	tty := term.IsTerminal(int(os.Stderr.Fd()))
	cfg.ProgressBar = *progressBar == "always" || (*progressBar == "auto" && tty)
	var handler slog.Handler
	if *logFormat == "json" || (*logFormat == "auto" && !tty) {
		handler = slog.NewJSONHandler(os.Stderr, nil)
	} else {
		handler = slog.NewTextHandler(os.Stderr, nil)
	}
	log := slog.New(handler).With("app", "orchestra-fetch")

	if err := cfg.Validate(); err != nil {
		log.Error("invalid configuration", "err", err)
		return fetch.ExitCode(err)
	}
	if *checkConfig {
		out, _ := json.MarshalIndent(cfg.Summary(), "", "  ")
		fmt.Println(string(out))
		return fetch.ExitOK
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := fetch.Run(ctx, cfg, fetch.Options{Logger: log})
	if err != nil {
		code := fetch.ExitCode(err)
		log.Error("fetch failed", "err", err, "exitCode", code)
		return code
	}
	log.Info("done", "dir", res.Dir, "files", res.Files, "bytes", res.TotalBytes,
		"downloaded", res.Downloaded, "cacheHit", res.CacheHit)
	return fetch.ExitOK
}
