package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Config is the whole configuration of the gateway. It is read from one YAML
// file (see LoadConfig); Default returns the values used for omitted fields.
type Config struct {
	// Server holds the listen addresses and the HTTP server timeouts.
	Server ServerConfig `json:"server"`
	// Models maps the served model names that clients send to the
	// applications (queue routing keys) that serve them.
	Models []ModelConfig `json:"models"`
	// Auth configures API token authentication.
	Auth AuthConfig `json:"auth"`
	// Limits holds the request size limit and the default per-token limits.
	Limits LimitsConfig `json:"limits"`
	// Timeouts bounds how long one request may take end to end.
	Timeouts TimeoutsConfig `json:"timeouts"`
	// Log configures logging.
	Log LogConfig `json:"log"`
	// Responses configures the stored responses of the Responses API.
	Responses ResponsesConfig `json:"responses"`
	// Batch configures the Files and Batch APIs (files.go, batch.go).
	Batch BatchConfig `json:"batch"`
	// Queue tells the orchestra-gateway binary how to reach the queue. The
	// gateway itself only uses the queue.Queue it is given, so Validate
	// does not check this section; QueueConfig.Validate does.
	Queue QueueConfig `json:"queue"`
	// Direct configures the direct lane (direct.go).
	Direct DirectConfig `json:"direct,omitempty"`
}

// DirectConfig configures the direct lane: chat and legacy completions
// sent straight to a ready engine on a slot its dispatcher lent the
// gateway (a lease), instead of through the queue.
type DirectConfig struct {
	// LeaseIdle is how long an unused lease is kept before it is given
	// back while the application serves (an unused lease holds off no
	// sleep or scale to zero: its use is reported to the lifecycle
	// leader). Default 10m (DefaultLeaseIdle).
	LeaseIdle metav1.Duration `json:"leaseIdle,omitempty"`
}

// QueueConfig locates the NATS JetStream queue of the orchestra.
type QueueConfig struct {
	// URL is the NATS server URL, for example nats://orchestra-nats:4222.
	URL string `json:"url"`
	// CredsFile is a NATS credentials file (JWT and NKey seed). Optional.
	CredsFile string `json:"credsFile,omitempty"`
	// Orchestra is the ModelOrchestra's name; it selects the stream.
	Orchestra string `json:"orchestra"`
	// Instance names this gateway replica for its reply subjects. Empty:
	// POD_NAME, else a random id.
	Instance string `json:"instance,omitempty"`
	// SubmitTimeout bounds the wait for JetStream to accept a job, including
	// retries while the request stream has no leader (a NATS server
	// restarting, or a cluster electing a new leader).
	SubmitTimeout metav1.Duration `json:"submitTimeout"`
	// StallTimeout fails a reply that shows no sign of life for this long.
	StallTimeout metav1.Duration `json:"stallTimeout"`
	// MaxQueueWait bounds how long a job may wait for a dispatcher.
	MaxQueueWait metav1.Duration `json:"maxQueueWait"`
}

// Validate reports the problems of the queue section.
func (q QueueConfig) Validate() error {
	var errs []error
	if q.URL == "" {
		errs = append(errs, errors.New("queue.url is required"))
	}
	if q.Orchestra == "" {
		errs = append(errs, errors.New("queue.orchestra is required"))
	}
	if q.SubmitTimeout.Duration <= 0 || q.StallTimeout.Duration <= 0 {
		errs = append(errs, errors.New("queue.submitTimeout and queue.stallTimeout must be positive"))
	}
	if q.MaxQueueWait.Duration < 0 {
		errs = append(errs, errors.New("queue.maxQueueWait must not be negative"))
	}
	return errors.Join(errs...)
}

// ServerConfig holds the listen addresses and HTTP server settings.
type ServerConfig struct {
	// Address serves the OpenAI API, /healthz and /readyz.
	Address string `json:"address"`
	// OpsAddress serves /metrics, /healthz and /readyz. Empty disables it.
	OpsAddress string `json:"opsAddress"`
	// ReadHeaderTimeout bounds reading the request headers.
	ReadHeaderTimeout metav1.Duration `json:"readHeaderTimeout"`
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout metav1.Duration `json:"readTimeout"`
	// IdleTimeout closes keep-alive connections idle for longer.
	IdleTimeout metav1.Duration `json:"idleTimeout"`
	// DrainDelay is how long the gateway keeps serving, while reporting
	// not ready, after it is told to stop, so that load balancers notice.
	DrainDelay metav1.Duration `json:"drainDelay"`
	// DrainTimeout is how long in-flight requests (streams included) may
	// run after the listeners closed before they are cancelled.
	DrainTimeout metav1.Duration `json:"drainTimeout"`
}

// ModelConfig maps one served model name to an application.
type ModelConfig struct {
	// Name is the served model name clients put in "model".
	Name string `json:"name"`
	// App is the application (queue routing key) that serves the model.
	App string `json:"app"`
	// OwnedBy is reported by GET /v1/models. Default "model-orchestra".
	OwnedBy string `json:"ownedBy,omitempty"`
	// MaxWait, for an application with a lifecycle, bounds how long a
	// request waits for it to wake (see waking.go); 0: no lifecycle.
	MaxWait metav1.Duration `json:"maxWait,omitempty"`
	// Unavailable, when set, is why the model is not served (the operator
	// refused it, for example a model too large for its engine's memory):
	// its requests are answered at once with it instead of being queued.
	Unavailable string `json:"unavailable,omitempty"`
	// DirectLane lets the model's chat and legacy completions take the
	// direct lane (direct.go) while its application serves and a slot is
	// lent; false: every request goes through the queue.
	DirectLane bool `json:"directLane,omitempty"`
}

// AuthConfig configures bearer token authentication.
type AuthConfig struct {
	// Anonymous lets requests without an Authorization header through, with
	// the default limits and access to every model. A presented token is
	// still checked, and an unknown one is refused.
	Anonymous bool `json:"anonymous"`
	// SecretSelector is the label selector of the Secrets holding API
	// tokens. Empty disables token Secrets (then Anonymous must be true).
	SecretSelector string `json:"secretSelector"`
	// Namespace is where the token Secrets live. Empty means the gateway's
	// own namespace (POD_NAMESPACE, or the service account's namespace).
	Namespace string `json:"namespace,omitempty"`
	// Kubeconfig is a kubeconfig file to use instead of the in-cluster
	// configuration (for running outside a cluster).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// HashKeyFile holds a secret key. When set, tokens are held as
	// HMAC-SHA256 digests under that key instead of plain SHA-256.
	HashKeyFile string `json:"hashKeyFile,omitempty"`
}

// LimitsConfig holds the size limit and the default per-token limits.
type LimitsConfig struct {
	// MaxBodyBytes is the largest accepted request body; larger gets 413.
	MaxBodyBytes int64 `json:"maxBodyBytes"`
	// AssumedMaxTokens is the completion budget reserved against
	// tokensPerMinute for a request that sets neither max_tokens nor
	// max_completion_tokens (see Limits.TokensPerMinute).
	AssumedMaxTokens int `json:"assumedMaxTokens"`
	// Default applies to every token that does not override a value, and
	// to anonymous requests (which share one budget).
	Default Limits `json:"default"`
}

// Limits are the per-token limits. Zero means unlimited.
type Limits struct {
	// RequestsPerMinute caps the request rate (a token bucket with a burst
	// of one minute's worth).
	RequestsPerMinute int `json:"requestsPerMinute"`
	// TokensPerMinute caps prompt plus completion tokens. A request
	// reserves its largest possible cost at admission (its prompt, estimated
	// from its size, plus max_tokens or limits.assumedMaxTokens) and is
	// settled with the engine's usage when it ends, so the limit holds within
	// one request's size at any concurrency.
	TokensPerMinute int `json:"tokensPerMinute"`
	// MaxConcurrent caps streaming requests in flight at once (the
	// resource's spec.gateway.limits.maxConcurrent). The name it had
	// before, maxConcurrentStreams, is read as a deprecated alias.
	MaxConcurrent int `json:"maxConcurrent"`
}

// deprecatedMaxConcurrent is the name Limits.MaxConcurrent had before it
// took the resource's name; configurations and token Secrets that use it
// keep working.
const deprecatedMaxConcurrent = "maxConcurrentStreams"

// UnmarshalJSON decodes l over the values it already holds (the defaults),
// strictly: an unknown field is an error, as everywhere in the
// configuration. maxConcurrentStreams is read as maxConcurrent; both may
// be given only with the same value.
func (l *Limits) UnmarshalJSON(data []byte) error {
	type fields Limits // the fields, without this method
	in := struct {
		fields
		MaxConcurrent           *int `json:"maxConcurrent"`
		DeprecatedMaxConcurrent *int `json:"maxConcurrentStreams"`
	}{fields: fields(*l)}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return err
	}
	*l = Limits(in.fields)
	n, old := in.MaxConcurrent, in.DeprecatedMaxConcurrent
	switch {
	case n != nil && old != nil && *n != *old:
		return fmt.Errorf("maxConcurrent is %d but %s, its deprecated name, is %d: give maxConcurrent only", *n, deprecatedMaxConcurrent, *old)
	case n != nil:
		l.MaxConcurrent = *n
	case old != nil:
		l.MaxConcurrent = *old
	}
	return nil
}

// ResponsesConfig configures the stored responses of the Responses API,
// kept by the orchestra-gateway binary in a JetStream key-value bucket.
type ResponsesConfig struct {
	// Retention is how long a stored response is kept (the bucket's TTL);
	// the resource's spec.gateway.responses.retention.
	Retention metav1.Duration `json:"retention"`
	// Replicas of the bucket: 1, or 3 with a 3-node NATS cluster.
	Replicas int `json:"replicas"`
}

// BatchConfig bounds the Files and Batch APIs. Files, batches and line
// results live in JetStream (an object store and key-value buckets) with
// the replicas of responses.replicas.
type BatchConfig struct {
	// MaxFileBytes is the largest file an upload may carry (default 50 MiB).
	// An upload is held in memory while it is checked: allow the gateway
	// about three times this per concurrent upload.
	MaxFileBytes int64 `json:"maxFileBytes"`
	// MaxLines is the most lines a batch input file may have (default
	// 50000, as at OpenAI).
	MaxLines int `json:"maxLines"`
	// StoreMaxBytes bounds all files together (0: unbounded; the NATS
	// server's JetStream storage bounds them).
	StoreMaxBytes int64 `json:"storeMaxBytes,omitempty"`
}

// TimeoutsConfig bounds the time a request may take end to end.
type TimeoutsConfig struct {
	// Request bounds a non-streaming request.
	Request metav1.Duration `json:"request"`
	// Stream bounds a streaming request.
	Stream metav1.Duration `json:"stream"`
	// WakeKeepAlive paces the SSE comments a streamed request receives
	// while its application wakes; 0 means 5s, below the 30 s read
	// timeouts clients commonly have.
	WakeKeepAlive metav1.Duration `json:"wakeKeepAlive,omitempty"`
}

// LogConfig configures logging.
type LogConfig struct {
	// Level is debug, info, warn or error.
	Level string `json:"level"`
	// AccessLog writes one structured line per API request.
	AccessLog bool `json:"accessLog"`
}

// Default returns the configuration used for every omitted field.
func Default() Config {
	return Config{
		Server: ServerConfig{
			Address:           ":8080",
			OpsAddress:        ":9090",
			ReadHeaderTimeout: metav1.Duration{Duration: 10 * time.Second},
			ReadTimeout:       metav1.Duration{Duration: time.Minute},
			IdleTimeout:       metav1.Duration{Duration: 2 * time.Minute},
			DrainDelay:        metav1.Duration{Duration: 5 * time.Second},
			DrainTimeout:      metav1.Duration{Duration: 60 * time.Second},
		},
		Auth: AuthConfig{
			SecretSelector: v1alpha1.DefaultTokenSecretSelector,
		},
		Limits: LimitsConfig{
			MaxBodyBytes:     8 << 20,
			AssumedMaxTokens: 1024,
			Default: Limits{
				RequestsPerMinute: 600,
				TokensPerMinute:   0,
				MaxConcurrent:     16,
			},
		},
		Timeouts: TimeoutsConfig{
			Request: metav1.Duration{Duration: 5 * time.Minute},
			Stream:  metav1.Duration{Duration: 30 * time.Minute},
		},
		Log: LogConfig{Level: "info", AccessLog: true},
		Responses: ResponsesConfig{
			Retention: metav1.Duration{Duration: v1alpha1.DefaultResponsesRetention},
			Replicas:  1,
		},
		Batch:  BatchConfig{MaxFileBytes: 50 << 20, MaxLines: 50000},
		Direct: DirectConfig{LeaseIdle: metav1.Duration{Duration: DefaultLeaseIdle}},
		Queue: QueueConfig{
			SubmitTimeout: metav1.Duration{Duration: 15 * time.Second},
			StallTimeout:  metav1.Duration{Duration: 30 * time.Second},
			MaxQueueWait:  metav1.Duration{Duration: 10 * time.Minute},
		},
	}
}

// Validate reports every problem in the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Server.Address == "" {
		add("server.address is required")
	}
	if c.Server.OpsAddress != "" && c.Server.OpsAddress == c.Server.Address {
		add("server.opsAddress must differ from server.address")
	}
	for name, d := range map[string]time.Duration{
		"server.readHeaderTimeout": c.Server.ReadHeaderTimeout.Duration,
		"server.readTimeout":       c.Server.ReadTimeout.Duration,
		"server.idleTimeout":       c.Server.IdleTimeout.Duration,
		"server.drainDelay":        c.Server.DrainDelay.Duration,
		"server.drainTimeout":      c.Server.DrainTimeout.Duration,
	} {
		if d < 0 {
			add("%s must not be negative, got %s", name, d)
		}
	}
	if c.Timeouts.Request.Duration <= 0 {
		add("timeouts.request must be positive, got %s", c.Timeouts.Request.Duration)
	}
	if c.Timeouts.WakeKeepAlive.Duration < 0 {
		add("timeouts.wakeKeepAlive must not be negative, got %s", c.Timeouts.WakeKeepAlive.Duration)
	}
	if c.Timeouts.Stream.Duration <= 0 {
		add("timeouts.stream must be positive, got %s", c.Timeouts.Stream.Duration)
	}
	if c.Direct.LeaseIdle.Duration < 0 {
		add("direct.leaseIdle must not be negative, got %s", c.Direct.LeaseIdle.Duration)
	}

	if c.Responses.Retention.Duration < time.Minute {
		add("responses.retention must be at least a minute, got %s", c.Responses.Retention.Duration)
	}
	if c.Responses.Replicas != 1 && c.Responses.Replicas != 3 {
		add("responses.replicas must be 1 or 3, got %d", c.Responses.Replicas)
	}
	if c.Batch.MaxFileBytes <= 0 || c.Batch.MaxLines <= 0 || c.Batch.StoreMaxBytes < 0 {
		add("batch.maxFileBytes and batch.maxLines must be positive and batch.storeMaxBytes not negative")
	}
	if len(c.Models) == 0 {
		add("models: at least one model is required")
	}
	seen := make(map[string]bool, len(c.Models))
	for i, m := range c.Models {
		switch {
		case m.Name == "":
			add("models[%d].name is required", i)
		case seen[m.Name]:
			add("models[%d].name %q is listed twice", i, m.Name)
		case strings.TrimSpace(m.Name) != m.Name:
			add("models[%d].name %q has surrounding spaces", i, m.Name)
		}
		seen[m.Name] = true
		if m.App == "" {
			add("models[%d].app is required", i)
		}
	}

	if c.Auth.SecretSelector == "" && !c.Auth.Anonymous {
		add("auth: set auth.secretSelector, or auth.anonymous: true to serve without tokens")
	}
	if c.Auth.SecretSelector != "" {
		if _, err := labels.Parse(c.Auth.SecretSelector); err != nil {
			add("auth.secretSelector: %v", err)
		}
	}
	if c.Auth.HashKeyFile != "" {
		if _, err := readHashKey(c.Auth.HashKeyFile); err != nil {
			add("auth.hashKeyFile: %v", err)
		}
	}

	if c.Limits.MaxBodyBytes <= 0 {
		add("limits.maxBodyBytes must be positive, got %d", c.Limits.MaxBodyBytes)
	}
	if c.Limits.AssumedMaxTokens <= 0 {
		add("limits.assumedMaxTokens must be positive, got %d", c.Limits.AssumedMaxTokens)
	}
	if err := c.Limits.Default.validate("limits.default"); err != nil {
		errs = append(errs, err)
	}

	if _, err := parseLevel(c.Log.Level); err != nil {
		add("log.level: %v", err)
	}
	return errors.Join(errs...)
}

func (l Limits) validate(where string) error {
	var errs []error
	if l.RequestsPerMinute < 0 {
		errs = append(errs, fmt.Errorf("%s.requestsPerMinute must not be negative", where))
	}
	if l.TokensPerMinute < 0 {
		errs = append(errs, fmt.Errorf("%s.tokensPerMinute must not be negative", where))
	}
	if l.MaxConcurrent < 0 {
		errs = append(errs, fmt.Errorf("%s.maxConcurrent must not be negative", where))
	}
	return errors.Join(errs...)
}

// LoadConfig reads a YAML configuration file over Default. Unknown fields
// are errors, so that a misspelt key is not silently ignored. The result is
// validated.
func LoadConfig(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading config: %w", err)
	}
	return ParseConfig(raw)
}

// ParseConfig parses a YAML configuration over Default and validates it.
func ParseConfig(raw []byte) (Config, error) {
	cfg := Default()
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		return Config{}, fmt.Errorf("parsing config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("invalid config: %w", err)
	}
	return cfg, nil
}

// LogLevel returns the configured slog level (info when unset or invalid;
// Validate reports an invalid one).
func (c *Config) LogLevel() slog.Level {
	l, _ := parseLevel(c.Log.Level)
	return l
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if s == "" {
		return slog.LevelInfo, nil
	}
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo, err
	}
	return l, nil
}

// readHashKey reads the HMAC key; surrounding whitespace is ignored so that
// a key file written with a trailing newline works.
func readHashKey(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key := []byte(strings.TrimSpace(string(raw)))
	if len(key) < 16 {
		return nil, fmt.Errorf("key in %s is shorter than 16 bytes", path)
	}
	return key, nil
}
