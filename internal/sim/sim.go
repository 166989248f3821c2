package sim

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/model-orchestra/operator/internal/arena"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 8 << 20

// Simulator is one simulated engine. It is safe for concurrent use.
type Simulator struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	m       *metrics
	slots   chan struct{}
	created int64

	idPrefix string
	nextID   atomic.Uint64

	stopOnce sync.Once
	stopping chan struct{} // closed when the simulator stops: hung requests end
	crashed  chan struct{} // closed when a crash with CrashExits happens
	crashOne sync.Once

	// rand draws fault decisions; tests may replace it before serving.
	rand func() float64

	engine engineState
	// device holds the weights with DeviceMemoryPool; nil with
	// DeviceMemoryKernel.
	device *arena.Device

	// prefix is the prefix cache (nil when off); prefill paces prompts.
	prefix  *prefixCache
	prefill prefill
}

// New returns a simulator for cfg, which should have passed Validate. Its
// metrics live in a registry of its own, so several simulators can run in one
// process.
func New(cfg Config, opts ...Option) *Simulator {
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Simulator{
		cfg:      cfg,
		log:      slog.Default(),
		reg:      prometheus.NewRegistry(),
		slots:    make(chan struct{}, max(cfg.MaxNumSeqs, 1)),
		created:  time.Now().Unix(),
		idPrefix: hex.EncodeToString(b[:]),
		stopping: make(chan struct{}),
		crashed:  make(chan struct{}),
		rand:     mrand.Float64,
		prefix:   newPrefixCache(cfg.PrefixCache),
		prefill:  prefill{rate: cfg.PrefillRate},
	}
	for _, o := range opts {
		o(s)
	}
	if cfg.DeviceMemory == DeviceMemoryKernel {
		s.device = nil
	} else if s.device == nil {
		s.device = ProcessDevice()
	}
	s.m = newMetrics(s.reg, cfg.Model)
	s.engine.weightsAwake, s.engine.kvAwake, s.engine.loaded = true, true, true
	return s
}

// Option customises a Simulator.
type Option func(*Simulator)

// WithDevice sets the device pool the weights live in with
// DeviceMemoryPool (default: ProcessDevice).
func WithDevice(d *arena.Device) Option { return func(s *Simulator) { s.device = d } }

// processDevice is the device of every simulator of the process that is
// given no other: by default one accelerator per process, with no fixed
// capacity (its regions are mapped as engines load and kept).
var processDevice struct {
	sync.Mutex
	d *arena.Device
}

// ProcessDevice is the device pool the process's simulators share.
func ProcessDevice() *arena.Device {
	processDevice.Lock()
	defer processDevice.Unlock()
	if processDevice.d == nil {
		processDevice.d = arena.NewDevice(0)
	}
	return processDevice.d
}

// OpenProcessDevice makes the device file cfg.DeviceFile names, if any,
// the process's device pool, its regions named after cfg.Model.
func OpenProcessDevice(cfg Config) error {
	if cfg.DeviceFile == "" {
		return nil
	}
	d, err := arena.OpenSharedDevice(cfg.DeviceFile, cfg.DeviceCapacity, cfg.Model)
	if err != nil {
		return fmt.Errorf("opening the shared device: %w", err)
	}
	UseProcessDevice(d)
	return nil
}

// UseProcessDevice makes d the process's device pool, for example a
// device shared by the engine containers of a seat-group pod
// (orchestra-sim --device-file, arena.OpenSharedDevice). Call it before
// the first New.
func UseProcessDevice(d *arena.Device) {
	processDevice.Lock()
	defer processDevice.Unlock()
	processDevice.d = d
}

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.log = l } }

// Handler returns the HTTP API: the OpenAI endpoints, /health, /version,
// /metrics and /orchestra/weights; with sleep mode also vLLM's /sleep,
// /wake_up, /is_sleeping and /collective_rpc.
func (s *Simulator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "orchestra-sim"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /orchestra/weights", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.WeightsStatus())
	})
	if s.cfg.Sleep.Enabled {
		s.sleepHandlers(mux)
	}
	return mux
}

// Crashed is closed when an injected crash with Faults.CrashExits happened.
func (s *Simulator) Crashed() <-chan struct{} { return s.crashed }

// Stop ends hung requests. Run calls it on shutdown.
func (s *Simulator) Stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

func (s *Simulator) newID(prefix string) string {
	return prefix + s.idPrefix + strconv.FormatUint(s.nextID.Add(1), 16)
}
