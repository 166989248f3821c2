// Package sim is an inference-engine simulator that speaks vLLM's
// OpenAI-compatible HTTP API. It produces deterministic text at a configurable
// pace, exports vLLM-style Prometheus metrics and can inject faults (errors,
// hangs, crashes), so the gateway, the dispatcher and the operator can be
// tested and benchmarked without GPUs.
//
// Use it in-process with New(cfg).Handler(), or as a server with Run.
package sim

import (
	"errors"
	"fmt"
	"time"
)

// Config configures one simulated engine.
type Config struct {
	// Addr is the listen address used by Run, for example ":8000".
	Addr string
	// Model is the served model name; requests naming another model get 404.
	// A request without a model uses this one.
	Model string
	// MaxModelLen is the context length reported by /v1/models.
	MaxModelLen int
	// MaxNumSeqs caps the requests generated at once; the rest wait, as in
	// vLLM's scheduler, and show up in vllm:num_requests_waiting.
	MaxNumSeqs int

	// TimeToFirstToken is the delay between a request being scheduled and its
	// first output token.
	TimeToFirstToken time.Duration
	// InterTokenLatency is the delay between two output tokens.
	InterTokenLatency time.Duration
	// OutputTokens is the natural length of an answer in tokens; a smaller
	// max_tokens cuts it short (finish_reason "length").
	OutputTokens int
	// EmbeddingDim is the length of the vectors returned by /v1/embeddings.
	EmbeddingDim int

	// Faults injects failures.
	Faults Faults
}

// Faults describes the failures the simulator injects. Rates are fractions
// of requests in [0, 1], drawn independently per request.
type Faults struct {
	// ErrorRate is the fraction of requests answered with ErrorStatus before
	// any output.
	ErrorRate float64
	// ErrorStatus is the HTTP status of injected errors (default 500).
	ErrorStatus int
	// HangRate is the fraction of requests that never answer; they end only
	// when the client goes away or the server stops.
	HangRate float64
	// CrashRate is the fraction of requests after which the engine "crashes"
	// once CrashAfterTokens output tokens were produced (streamed requests
	// will have sent them). The connection is aborted; with CrashExits, Run
	// also stops the whole server abruptly and returns ErrCrashed.
	CrashRate float64
	// CrashAfterTokens is the number of tokens produced before a crash.
	CrashAfterTokens int
	// CrashExits makes a crash take down the whole server (Run returns
	// ErrCrashed, and orchestra-sim exits), like an engine process dying.
	CrashExits bool
}

// Default returns a configuration resembling a small model on a fast GPU.
func Default() Config {
	return Config{
		Addr:              ":8000",
		Model:             "sim-model",
		MaxModelLen:       8192,
		MaxNumSeqs:        256,
		TimeToFirstToken:  50 * time.Millisecond,
		InterTokenLatency: 10 * time.Millisecond,
		OutputTokens:      64,
		EmbeddingDim:      384,
		Faults:            Faults{ErrorStatus: 500},
	}
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("model must not be empty"))
	}
	if c.MaxModelLen <= 0 {
		errs = append(errs, fmt.Errorf("max model length must be positive, got %d", c.MaxModelLen))
	}
	if c.MaxNumSeqs <= 0 {
		errs = append(errs, fmt.Errorf("max num seqs must be positive, got %d", c.MaxNumSeqs))
	}
	if c.TimeToFirstToken < 0 || c.InterTokenLatency < 0 {
		errs = append(errs, errors.New("latencies must not be negative"))
	}
	if c.OutputTokens <= 0 {
		errs = append(errs, fmt.Errorf("output tokens must be positive, got %d", c.OutputTokens))
	}
	if c.EmbeddingDim <= 0 {
		errs = append(errs, fmt.Errorf("embedding dimension must be positive, got %d", c.EmbeddingDim))
	}
	for name, r := range map[string]float64{"error rate": c.Faults.ErrorRate, "hang rate": c.Faults.HangRate, "crash rate": c.Faults.CrashRate} {
		if r < 0 || r > 1 {
			errs = append(errs, fmt.Errorf("%s must be within [0, 1], got %v", name, r))
		}
	}
	if c.Faults.ErrorRate > 0 && (c.Faults.ErrorStatus < 400 || c.Faults.ErrorStatus > 599) {
		errs = append(errs, fmt.Errorf("error status must be a 4xx or 5xx code, got %d", c.Faults.ErrorStatus))
	}
	if c.Faults.CrashAfterTokens < 0 {
		errs = append(errs, fmt.Errorf("crash after tokens must not be negative, got %d", c.Faults.CrashAfterTokens))
	}
	return errors.Join(errs...)
}
