package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Engine drives one inference engine's own sleep and wake API over
// localhost. Adapters never hold or forward inference requests: the queue
// holds them while the engine sleeps.
type Engine interface {
	// Name is the engine kind, as in spec.applications.<app>.runtime.engine.
	Name() v1alpha1.Engine
	// InFlight is the number of requests the engine is running or queueing,
	// or -1 when the engine cannot tell.
	InFlight(ctx context.Context) (int, error)
	// Sleep releases the engine's memory: level 1 keeps the weights in host
	// RAM (the hot tier), level 2 drops them. It returns once the engine
	// reports that it sleeps.
	Sleep(ctx context.Context, level int) error
	// Wake restores the engine; it returns once the engine can serve.
	Wake(ctx context.Context) error
	// Sleeping reports what the engine says about itself.
	Sleeping(ctx context.Context) (bool, error)
}

// ErrUnsupportedEngine is returned for engines without a sleep or unload API.
var ErrUnsupportedEngine = errors.New("engine cannot sleep")

// ErrBusy refuses a sleep while the engine still runs requests: vLLM
// answers 200 to /sleep with requests in flight and then dies
// (vllm-project/vllm#45520), so the adapter checks again after the drain.
var ErrBusy = errors.New("engine has requests in flight")

// EngineConfig selects and configures an adapter.
type EngineConfig struct {
	// Kind is the engine (vllm, simulator, ollama, llamacpp).
	Kind v1alpha1.Engine `json:"kind"`
	// URL is the engine's base URL, normally http://127.0.0.1:<port>.
	URL string `json:"url"`
	// Model is the model name the engine serves (Ollama, llama.cpp router).
	Model string `json:"model,omitempty"`
	// KeepAlive is Ollama's keep_alive for the preload on wake ("-1": stay
	// loaded until the agent unloads it).
	KeepAlive string `json:"keepAlive,omitempty"`
	// SlotSave makes the llama.cpp adapter save the prompt cache of slot 0
	// before unloading and restore it after loading (needs --slot-save-path).
	SlotSave bool `json:"slotSave,omitempty"`
	// PollInterval paces status polls while waiting for the engine.
	PollInterval time.Duration `json:"pollInterval"`
}

// NewEngine returns the adapter for cfg.Kind. distributed-llama is refused:
// it has neither sleep nor unload.
func NewEngine(cfg EngineConfig, client *http.Client) (Engine, error) {
	if client == nil {
		client = &http.Client{}
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	h := httpEngine{base: strings.TrimSuffix(cfg.URL, "/"), client: client, poll: cfg.PollInterval}
	switch cfg.Kind {
	case v1alpha1.EngineVLLM, v1alpha1.EngineSimulator:
		return &VLLM{httpEngine: h, kind: cfg.Kind}, nil
	case v1alpha1.EngineOllama:
		if cfg.Model == "" {
			return nil, errors.New("the ollama adapter needs the model name")
		}
		keep := cfg.KeepAlive
		if keep == "" {
			keep = "-1"
		}
		return &Ollama{httpEngine: h, model: cfg.Model, keepAlive: keep}, nil
	case v1alpha1.EngineLlamaCPP:
		if cfg.Model == "" {
			return nil, errors.New("the llamacpp adapter needs the model name (router mode)")
		}
		return &LlamaCPP{httpEngine: h, model: cfg.Model, slotSave: cfg.SlotSave}, nil
	case v1alpha1.EngineDllama:
		return nil, fmt.Errorf("%w: spec.applications.<app>.runtime.engine is dllama, and distributed-llama has no sleep or unload API; leave spec.applications.<app>.lifecycle.sleepAfter unset (0) for it", ErrUnsupportedEngine)
	default:
		return nil, fmt.Errorf("%w: unknown engine %q (want vllm, simulator, ollama or llamacpp)", ErrUnsupportedEngine, cfg.Kind)
	}
}

// httpEngine holds what every adapter needs to call its engine.
type httpEngine struct {
	base   string
	client *http.Client
	poll   time.Duration
}

// EngineError is a non-2xx answer from the engine.
type EngineError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *EngineError) Error() string {
	return fmt.Sprintf("%s %s: engine answered %d: %s", e.Method, e.Path, e.Status, e.Body)
}

// call sends a JSON body (nil for none) and decodes a JSON answer into out
// (nil to discard it).
func (h *httpEngine) call(ctx context.Context, method, path string, body, out any) error {
	b, err := h.callBody(ctx, method, path, body)
	if err != nil {
		return err
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}

// callBody sends a JSON body (nil for none) and returns the answer of a 2xx.
func (h *httpEngine) callBody(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, &EngineError{Method: method, Path: path, Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	return b, nil
}

// waitFor polls cond until it is true, fails, or ctx ends.
func (h *httpEngine) waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	t := time.NewTicker(h.poll)
	defer t.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %w)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// promGauges sums the named gauges (any labels) in a Prometheus text page.
func (h *httpEngine) promGauges(ctx context.Context, names ...string) (float64, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("GET /metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, false, &EngineError{Method: "GET", Path: "/metrics", Status: resp.StatusCode}
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, n := range names {
			if !strings.HasPrefix(line, n) {
				continue
			}
			rest := line[len(n):]
			if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
				continue
			}
			f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
			if len(f) == 0 {
				continue
			}
			v, err := strconv.ParseFloat(f[0], 64)
			if err == nil {
				sum += v
				found = true
			}
		}
	}
	return sum, found, sc.Err()
}
