package sidecar

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/engineproc"
)

// Config configures the sidecar (orchestra-agent --role sidecar).
type Config struct {
	Engine EngineConfig `json:"engine"`
	// SleepLevel is used when a sleep names none: 1 keeps the weights in
	// host RAM, 2 drops them.
	SleepLevel int `json:"sleepLevel"`
	// DrainTimeout bounds the wait for in-flight requests before a sleep;
	// past it the sleep fails and the engine stays awake.
	DrainTimeout time.Duration `json:"drainTimeout"`
	// SleepTimeout and WakeTimeout bound the engine calls.
	SleepTimeout time.Duration `json:"sleepTimeout"`
	WakeTimeout  time.Duration `json:"wakeTimeout"`
	// PollInterval paces drain checks and the engine state watch.
	PollInterval time.Duration `json:"pollInterval"`
	// RestartProcess lets POST /restart stop the engine container's
	// processes (SIGTERM, then SIGKILL after RestartGrace) so that the
	// kubelet starts the container again, for an engine that cannot
	// restart itself. It needs a pod with shareProcessNamespace and the
	// sidecar running as the engine's user; no capability.
	RestartProcess bool `json:"restartProcess,omitempty"`
	// RestartGrace is the wait between SIGTERM and SIGKILL.
	RestartGrace time.Duration `json:"restartGrace"`
	// NvidiaSMI is the nvidia-smi binary the sidecar reads the engine's
	// device memory with, attributed by the PIDs of the engine container's
	// processes (needs shareProcessNamespace); empty: not read.
	NvidiaSMI string `json:"nvidiaSMI,omitempty"`
	// Model points the engine at the hottest verified copy of its model
	// file on the node (modelcopy.go); zero: not pointed.
	Model ModelCopiesConfig `json:"model,omitzero"`
	// CallerTokenFile holds the release's caller token (a mounted Secret
	// key, --caller-token-file), as for the node agent: the sidecar's
	// mutating endpoints (sleep, wake, restart) accept only requests
	// carrying it; empty accepts any caller the network lets through.
	CallerTokenFile string `json:"callerTokenFile,omitempty"`
	// Proc is the procfs the sidecar reads processes from (default /proc).
	Proc engineproc.ProcFS `json:"-"`
}

// enginePort is the TCP port of an engine URL (the scheme's default when
// the URL names none), or 0 when it has none.
func enginePort(raw string) int {
	u, err := url.Parse(raw)
	if err != nil {
		return 0
	}
	p := u.Port()
	if p == "" {
		switch u.Scheme {
		case "http":
			return 80
		case "https":
			return 443
		}
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// DefaultConfig returns the sidecar's defaults.
func DefaultConfig() Config {
	return Config{
		Engine:       EngineConfig{Kind: v1alpha1.EngineVLLM, URL: "http://127.0.0.1:8000", KeepAlive: "-1", PollInterval: 100 * time.Millisecond},
		SleepLevel:   int(v1alpha1.DefaultSleepLevel),
		DrainTimeout: v1alpha1.EngineDrainTimeout,
		SleepTimeout: v1alpha1.EngineSleepTimeout,
		WakeTimeout:  v1alpha1.EngineWakeTimeout,
		PollInterval: 100 * time.Millisecond,
		RestartGrace: 30 * time.Second,
	}
}

// Validate reports every invalid field.
func (s Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if _, err := NewEngine(s.Engine, nil); err != nil {
		errs = append(errs, err)
	}
	if u, err := url.Parse(s.Engine.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("engine url %q must be an http(s) URL such as http://127.0.0.1:8000", s.Engine.URL)
	}
	if s.SleepLevel != 1 && s.SleepLevel != 2 {
		bad("sleep level must be 1 or 2, got %d", s.SleepLevel)
	}
	if s.RestartProcess || s.NvidiaSMI != "" {
		if _, err := NewEngineProcess(s.Engine.Kind, enginePort(s.Engine.URL), s.RestartGrace); err != nil {
			bad("finding the engine's processes (restart-process, nvidia-smi): %v", err)
		}
		if s.RestartProcess && s.RestartGrace <= 0 {
			bad("restart grace must be positive, got %v", s.RestartGrace)
		}
	}
	errs = append(errs, s.Model.validate(s.Engine.Kind)...)
	for name, d := range map[string]time.Duration{"drain timeout": s.DrainTimeout, "sleep timeout": s.SleepTimeout, "wake timeout": s.WakeTimeout, "poll interval": s.PollInterval} {
		if d <= 0 {
			bad("%s must be positive, got %v", name, d)
		}
	}
	return errors.Join(errs...)
}
