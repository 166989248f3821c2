package sim

import (
	"errors"
	"fmt"
	"strings"
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

	// PrefixCache keeps the blocks of recent prompts; a request prefills
	// only the tokens after its longest cached prefix, and its usage
	// reports the others in prompt_tokens_details.cached_tokens.
	PrefixCache PrefixCache
	// PrefillRate is how many prompt tokens per second the engine
	// prefills, one prompt after the other: the first token of a request
	// comes TimeToFirstToken after its uncached tokens were prefilled,
	// which waits for the prefills queued before it. 0: prefill takes no
	// time.
	PrefillRate float64

	// Weights are the bytes the simulated engine holds in memory, as a real
	// engine holds its model. Empty by default.
	Weights Weights
	// Sleep is vLLM's sleep mode: POST /sleep, POST /wake_up, GET
	// /is_sleeping and POST /collective_rpc exist only when it is enabled.
	Sleep Sleep
	// DeviceMemory is the memory that stands in for the accelerator's:
	// DeviceMemoryPool (the default, also when empty) or
	// DeviceMemoryKernel.
	DeviceMemory string
	// DeviceFile, with DeviceMemoryPool, is a device pool shared with the
	// other processes that open the same file: the engine containers of a
	// seat-group pod, on a memory-backed emptyDir (arena.OpenSharedDevice).
	// Empty: the process's own pool.
	DeviceFile string
	// DeviceCapacity is the shared device's size in bytes (0: no limit).
	// A load or wake that does not fit fails with "device memory
	// exhausted".
	DeviceCapacity int64

	// Faults injects failures.
	Faults Faults
}

// Weights are the simulated model's bytes, loaded into memory at start.
// Bytes and File are exclusive; with neither, the engine holds no weights
// (sleep and wake still work, moving 0 bytes).
type Weights struct {
	// Bytes of synthetic weights, generated from Seed at start.
	Bytes int64
	// Seed makes the synthetic bytes, and so their digest, reproducible.
	Seed uint64
	// File is a weights file read at start, for example the model file from
	// the model cache (the cold tier).
	File string
	// Name is the weights' file name in the hot and warm tier directories;
	// "" means "<model>.weights". The node agent places copies under it.
	Name string
}

// Sleep configures vLLM-compatible sleep mode.
type Sleep struct {
	// Enabled mounts the sleep endpoints (vLLM's --enable-sleep-mode).
	Enabled bool
	// HotDir is where level 1 offloads the weights: a tmpfs in production
	// (vLLM offloads to pinned host RAM). Required with weights.
	HotDir string
	// WarmDir is node-local disk. A level-2 wake reloads from the hot
	// directory if a copy is there, else from here, else from the cold
	// source (File, or the seed).
	WarmDir string
	// KeepOffload keeps the level-1 offload in HotDir after a wake from
	// it, and a later level-1 sleep reuses that file instead of writing
	// the weights again when it is the same file, unchanged since the wake
	// verified it (same inode, size and change time). A sleep then only
	// frees the weights, at the cost of their size in RAM while awake; a
	// wake still verifies every byte it reads. A level-2 sleep removes the
	// kept file.
	KeepOffload bool
}

// Device memory models.
const (
	// DeviceMemoryPool keeps the weights in a device pool, memory faulted
	// in once and kept by the process, as a GPU keeps its memory: a sleep
	// gives the weights' region back to the pool, a wake copies the bytes
	// into memory that is already there (see arena.Device). All the
	// simulators of one process share one pool.
	DeviceMemoryPool = "pool"
	// DeviceMemoryKernel unmaps the weights at sleep, returning the memory
	// to the kernel (in a VM with free page reporting, to the host); a
	// wake faults fresh memory in as it copies.
	DeviceMemoryKernel = "kernel"
)

// WeightsName is the file name of the weights in the tier directories.
func (c Config) WeightsName() string {
	if c.Weights.Name != "" {
		return c.Weights.Name
	}
	b := []byte(c.Model)
	for i, ch := range b {
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '.', ch == '-', ch == '_':
		default:
			b[i] = '_'
		}
	}
	return string(b) + ".weights"
}

// Faults describes the failures the simulator injects. Rates are fractions
// of requests in [0, 1], drawn independently per request.
type Faults struct {
	// WakeDelay slows every wake down by this much (a slow restore).
	WakeDelay time.Duration
	// WakeFail makes every wake fail with a 500; the engine stays asleep.
	WakeFail bool
	// SleepLeak keeps the weights in memory after a sleep and allocates new
	// ones on wake, so resident memory grows with every cycle, as in
	// vllm-project/vllm#47654. orchestra_sim_weights_resident_bytes shows it.
	SleepLeak bool

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
		PrefixCache:       PrefixCache{Tokens: 1 << 18, BlockTokens: 16},
		DeviceMemory:      DeviceMemoryPool,
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
	if c.PrefixCache.Tokens < 0 || c.PrefixCache.BlockTokens < 0 || (c.PrefixCache.Tokens > 0 && c.PrefixCache.BlockTokens == 0) {
		errs = append(errs, fmt.Errorf("prefix cache needs a positive block size and a size of 0 (off) or more tokens, got %d tokens in blocks of %d", c.PrefixCache.Tokens, c.PrefixCache.BlockTokens))
	}
	if c.PrefixCache.Tokens > 0 && c.PrefixCache.Tokens < c.PrefixCache.BlockTokens {
		errs = append(errs, fmt.Errorf("prefix cache of %d tokens holds no block of %d tokens", c.PrefixCache.Tokens, c.PrefixCache.BlockTokens))
	}
	if c.PrefillRate < 0 {
		errs = append(errs, fmt.Errorf("prefill rate must not be negative, got %v", c.PrefillRate))
	}
	if c.Weights.Bytes < 0 {
		errs = append(errs, fmt.Errorf("weights bytes must not be negative, got %d", c.Weights.Bytes))
	}
	if c.Weights.Bytes > 0 && c.Weights.File != "" {
		errs = append(errs, errors.New("weights bytes and weights file are exclusive: set one"))
	}
	if strings.ContainsRune(c.Weights.Name, '/') || c.Weights.Name == "." || c.Weights.Name == ".." {
		errs = append(errs, fmt.Errorf("weights name %q must be a plain file name", c.Weights.Name))
	}
	hasWeights := c.Weights.Bytes > 0 || c.Weights.File != ""
	if c.Sleep.Enabled && hasWeights && c.Sleep.HotDir == "" {
		errs = append(errs, errors.New("sleep mode with weights needs a hot directory (--hot-dir) to offload them to"))
	}
	if !c.Sleep.Enabled && c.Sleep.KeepOffload {
		errs = append(errs, errors.New("keeping the level-1 offload (--keep-offload) needs sleep mode (--enable-sleep-mode)"))
	}
	if !c.Sleep.Enabled && (c.Faults.WakeDelay != 0 || c.Faults.WakeFail || c.Faults.SleepLeak) {
		errs = append(errs, errors.New("the wake and sleep faults need sleep mode (--enable-sleep-mode)"))
	}
	if c.DeviceMemory != "" && c.DeviceMemory != DeviceMemoryPool && c.DeviceMemory != DeviceMemoryKernel {
		errs = append(errs, fmt.Errorf("device memory must be %q or %q, got %q", DeviceMemoryPool, DeviceMemoryKernel, c.DeviceMemory))
	}
	if c.DeviceFile != "" && c.DeviceMemory == DeviceMemoryKernel {
		errs = append(errs, errors.New("a device file is a device pool: it needs device memory \"pool\""))
	}
	if c.DeviceCapacity < 0 || (c.DeviceCapacity > 0 && c.DeviceFile == "") {
		errs = append(errs, fmt.Errorf("device capacity %d needs a device file and must not be negative", c.DeviceCapacity))
	}
	if c.Faults.WakeDelay < 0 {
		errs = append(errs, fmt.Errorf("wake delay must not be negative, got %v", c.Faults.WakeDelay))
	}
	if c.Faults.CrashAfterTokens < 0 {
		errs = append(errs, fmt.Errorf("crash after tokens must not be negative, got %d", c.Faults.CrashAfterTokens))
	}
	return errors.Join(errs...)
}
