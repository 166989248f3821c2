// Package dispatch pulls queued requests from JetStream, one durable
// consumer per application, sends them to the application's engine roots and
// streams the answers back to the waiting gateway (protocol in
// internal/natsqueue).
package dispatch

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Config is the dispatcher's configuration file (YAML, --config).
type Config struct {
	// ListenAddr serves /healthz, /readyz and /metrics.
	ListenAddr string `json:"listenAddr"`
	// Orchestra is the ModelOrchestra name; it selects streams and subjects.
	Orchestra string `json:"orchestra"`
	// Namespace holds the applications' root Services (EndpointSlices are
	// watched there). Defaults to the pod's namespace.
	Namespace string `json:"namespace,omitempty"`
	NATS      NATS   `json:"nats"`
	Stream    Stream `json:"stream"`
	// Apps are the applications this dispatcher serves.
	Apps []App `json:"apps"`

	// AckWait is how long a delivery may go without progress before
	// JetStream redelivers it. Requests being served and requests held for
	// a free engine slot report progress every AckWait/3, so only a dead
	// dispatcher lets it expire: it bounds how long a dead dispatcher's
	// requests wait before another dispatcher takes them. The price is one
	// progress message per held or in-flight request every AckWait/3.
	AckWait metav1.Duration `json:"ackWait"`
	// MaxDeliver is the number of attempts before a request is dead-lettered.
	MaxDeliver int `json:"maxDeliver"`
	// RetryDelay is the base delay before a failed attempt is redelivered;
	// it grows linearly with the attempt, up to 10 times.
	RetryDelay metav1.Duration `json:"retryDelay"`
	// HeartbeatInterval paces heartbeats to gateways (per request and per
	// application). Keep it well below the gateways' stall timeout.
	HeartbeatInterval metav1.Duration `json:"heartbeatInterval"`
	// RequestTimeout bounds one engine request (0: no bound).
	RequestTimeout metav1.Duration `json:"requestTimeout,omitempty"`
	// ShutdownTimeout is how long in-flight requests may finish on shutdown;
	// the rest are handed back to JetStream for prompt redelivery.
	ShutdownTimeout metav1.Duration `json:"shutdownTimeout"`
	// Prefetch is how many requests per application may wait in this
	// dispatcher's buffer for a free engine slot.
	Prefetch int `json:"prefetch"`
	// MaxAckPending caps an application's unacknowledged deliveries across
	// all dispatchers.
	MaxAckPending int `json:"maxAckPending"`
	// MaxResponseBytes bounds a non-streamed answer.
	MaxResponseBytes int64  `json:"maxResponseBytes"`
	Health           Health `json:"health"`
	// LeaseMaxAge is how long a gateway may hold an engine slot lent for
	// its direct lane (lease.go) before the dispatcher takes it back (a
	// request running on it keeps the slot until it ends); the gateway
	// asks again after. Default 1m.
	LeaseMaxAge metav1.Duration `json:"leaseMaxAge,omitempty"`
	// Lifecycle scales applications with their demand (internal/lifecycle).
	Lifecycle *lifecycle.Config `json:"lifecycle,omitempty"`
}

// NATS is how to reach the NATS cluster.
type NATS struct {
	URL string `json:"url"`
	// CredentialsFile is a NATS .creds file (optional).
	CredentialsFile string `json:"credentialsFile,omitempty"`
}

// Stream shapes the orchestra's JetStream streams.
type Stream struct {
	Replicas         int             `json:"replicas"`
	MaxAge           metav1.Duration `json:"maxAge"`
	MaxBytes         int64           `json:"maxBytes"`
	MaxMsgs          int64           `json:"maxMsgs"`
	Duplicates       metav1.Duration `json:"duplicates"`
	DeadLetterMaxAge metav1.Duration `json:"deadLetterMaxAge"`
}

// App is one application: a routing key and the engines that serve it.
type App struct {
	Name string `json:"name"`
	// Service is the root Service; its EndpointSlices' ready addresses are
	// the roots. Ignored when Endpoints is set.
	Service string `json:"service,omitempty"`
	// PortName picks the EndpointSlice port by name; when empty or absent,
	// Port is used.
	PortName string `json:"portName,omitempty"`
	Port     int32  `json:"port,omitempty"`
	// Endpoints is a static list of root base URLs (tests, development).
	Endpoints []string `json:"endpoints,omitempty"`
	// MaxConcurrency caps concurrent requests per root.
	MaxConcurrency int `json:"maxConcurrency"`
	// Routing chooses the root of each request (route.go).
	Routing Routing `json:"routing,omitempty"`
}

// Health is the per-root circuit breaker.
type Health struct {
	// FailureThreshold consecutive failures eject a root.
	FailureThreshold int `json:"failureThreshold"`
	// EjectBase is the first ejection; each further failure doubles it up to EjectMax.
	EjectBase metav1.Duration `json:"ejectBase"`
	EjectMax  metav1.Duration `json:"ejectMax"`
	// Path is the engine's health check (GET, 2xx is healthy), probed every
	// ProbeInterval while a root is ejected: a root is back in rotation as
	// soon as it passes. Empty: no probing, the ejection back-off decides.
	Path          string          `json:"path"`
	ProbeInterval metav1.Duration `json:"probeInterval"`
}

// Default returns the defaults that a config file overrides.
func Default() Config {
	return Config{
		ListenAddr: ":8080",
		NATS:       NATS{URL: "nats://nats:4222"},
		Stream: Stream{
			Replicas:         1,
			MaxAge:           metav1.Duration{Duration: time.Hour},
			MaxBytes:         1 << 30,
			Duplicates:       metav1.Duration{Duration: 2 * time.Minute},
			DeadLetterMaxAge: metav1.Duration{Duration: 7 * 24 * time.Hour},
		},
		AckWait:           metav1.Duration{Duration: 3 * time.Second},
		MaxDeliver:        5,
		RetryDelay:        metav1.Duration{Duration: 500 * time.Millisecond},
		HeartbeatInterval: metav1.Duration{Duration: 2 * time.Second},
		ShutdownTimeout:   metav1.Duration{Duration: 30 * time.Second},
		Prefetch:          4,
		MaxAckPending:     1000,
		MaxResponseBytes:  64 << 20,
		LeaseMaxAge:       metav1.Duration{Duration: time.Minute},
		Health: Health{
			FailureThreshold: 3,
			EjectBase:        metav1.Duration{Duration: time.Second},
			EjectMax:         metav1.Duration{Duration: 30 * time.Second},
			Path:             "/health",
			ProbeInterval:    metav1.Duration{Duration: 250 * time.Millisecond},
		},
	}
}

// defaultApp fills an application's unset fields.
func defaultApp(a App) App {
	if a.Port == 0 {
		a.Port = 8000
	}
	if a.MaxConcurrency == 0 {
		a.MaxConcurrency = 32
	}
	a.Routing = defaultRouting(a.Routing)
	return a
}

// Load reads a YAML config file over Default().
func Load(path string) (Config, error) {
	cfg := Default()
	raw, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("reading config: %w", err)
	}
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("parsing config %s: %w", path, err)
	}
	for i := range cfg.Apps {
		cfg.Apps[i] = defaultApp(cfg.Apps[i])
	}
	return cfg, nil
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := natsqueue.ValidToken(c.Orchestra); err != nil {
		add("orchestra: %w", err)
	}
	if c.NATS.URL == "" {
		add("nats.url must be set")
	}
	if c.Stream.Replicas != 1 && c.Stream.Replicas != 3 {
		add("stream.replicas must be 1 or 3, got %d", c.Stream.Replicas)
	}
	if c.Stream.Duplicates.Duration <= 0 {
		add("stream.duplicates must be positive")
	}
	if len(c.Apps) == 0 {
		add("apps must list at least one application")
	}
	seen := map[string]bool{}
	for i, a := range c.Apps {
		if err := natsqueue.ValidToken(a.Name); err != nil {
			add("apps[%d].name: %w", i, err)
		}
		if seen[a.Name] {
			add("apps[%d].name %q is listed twice", i, a.Name)
		}
		seen[a.Name] = true
		if a.Service == "" && len(a.Endpoints) == 0 {
			add("apps[%d] (%s) needs a service or endpoints", i, a.Name)
		}
		for _, e := range a.Endpoints {
			if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				add("apps[%d].endpoints: %q is not an http(s) URL", i, e)
			}
		}
		if a.MaxConcurrency <= 0 {
			add("apps[%d].maxConcurrency must be positive", i)
		}
		if a.Port <= 0 || a.Port > 65535 {
			add("apps[%d].port %d is out of range", i, a.Port)
		}
		if err := a.Routing.validate(); err != nil {
			add("apps[%d].routing: %w", i, err)
		}
	}
	if c.AckWait.Duration < time.Second {
		add("ackWait must be at least 1s")
	}
	if c.MaxDeliver < 1 {
		add("maxDeliver must be at least 1")
	}
	if c.HeartbeatInterval.Duration <= 0 || c.HeartbeatInterval.Duration >= c.AckWait.Duration {
		add("heartbeatInterval must be positive and below ackWait")
	}
	if c.RetryDelay.Duration < 0 || c.RequestTimeout.Duration < 0 || c.ShutdownTimeout.Duration < 0 {
		add("retryDelay, requestTimeout and shutdownTimeout must not be negative")
	}
	if c.Prefetch < 1 {
		add("prefetch must be at least 1")
	}
	if c.MaxAckPending < 1 {
		add("maxAckPending must be at least 1")
	}
	if c.MaxResponseBytes < 1 {
		add("maxResponseBytes must be positive")
	}
	if c.Lifecycle != nil {
		served := make([]string, 0, len(c.Apps))
		for _, a := range c.Apps {
			served = append(served, a.Name)
		}
		if err := c.Lifecycle.Validate(served); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Health.FailureThreshold < 1 || c.Health.EjectBase.Duration <= 0 || c.Health.EjectMax.Duration < c.Health.EjectBase.Duration {
		add("health needs failureThreshold >= 1 and 0 < ejectBase <= ejectMax")
	}
	if c.Health.Path != "" && (c.Health.Path[0] != '/' || c.Health.ProbeInterval.Duration <= 0) {
		add("health.path must start with '/' and health.probeInterval be positive")
	}
	return errors.Join(errs...)
}

func (c Config) streamSpec() natsqueue.StreamSpec {
	return natsqueue.StreamSpec{
		Names:            natsqueue.Names{Orchestra: c.Orchestra},
		Replicas:         c.Stream.Replicas,
		MaxAge:           c.Stream.MaxAge.Duration,
		MaxBytes:         c.Stream.MaxBytes,
		MaxMsgs:          c.Stream.MaxMsgs,
		Duplicates:       c.Stream.Duplicates.Duration,
		DeadLetterMaxAge: c.Stream.DeadLetterMaxAge.Duration,
	}
}
