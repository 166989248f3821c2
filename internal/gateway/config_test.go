package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestLoadConfig(t *testing.T) {
	cfg, err := LoadConfig("testdata/config.yaml")
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	want := Default()
	want.Server.DrainDelay = metav1.Duration{Duration: 5 * time.Second}
	want.Server.DrainTimeout = metav1.Duration{Duration: 2 * time.Minute}
	want.Models = []ModelConfig{
		{Name: "meta-llama/Llama-3.1-8B-Instruct", App: "llama-8b"},
		{Name: "bge-small", App: "embedder", OwnedBy: "search-team"},
	}
	want.Auth.HashKeyFile = "testdata/hash.key"
	want.Limits = LimitsConfig{MaxBodyBytes: 4 << 20, AssumedMaxTokens: 1024, Default: Limits{
		RequestsPerMinute: 120, TokensPerMinute: 200000, MaxConcurrent: 4,
	}}
	want.Timeouts = TimeoutsConfig{
		Request: metav1.Duration{Duration: 2 * time.Minute},
		Stream:  metav1.Duration{Duration: 20 * time.Minute},
	}
	want.Log.Level = "debug"
	want.Queue.URL = "nats://orchestra-nats:4222"
	want.Queue.Orchestra = "demo"
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
}

func TestParseConfigErrors(t *testing.T) {
	const models = "models: [{name: m, app: a}]\n"
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"no models", "", []string{"models: at least one model is required"}},
		{"unknown field", models + "limits: {maxBodyByte: 10}\n", []string{`unknown field "maxBodyByte"`}},
		{"model fields", "models: [{name: m}, {name: m, app: b}, {app: c}]\n", []string{
			"models[0].app is required", `models[1].name "m" is listed twice`, "models[2].name is required",
		}},
		{"no auth", models + "auth: {secretSelector: ''}\n", []string{
			"auth: set auth.secretSelector, or auth.anonymous: true",
		}},
		{"bad selector", models + "auth: {secretSelector: 'a in (b'}\n", []string{"auth.secretSelector:"}},
		{"missing key file", models + "auth: {hashKeyFile: /nonexistent/key}\n", []string{"auth.hashKeyFile:"}},
		{"negative limits", models + "limits: {default: {requestsPerMinute: -1, maxConcurrent: -2}}\n", []string{
			"limits.default.requestsPerMinute must not be negative",
			"limits.default.maxConcurrent must not be negative",
		}},
		{"unknown limit", models + "limits: {default: {maxConcurent: 2}}\n", []string{`unknown field "maxConcurent"`}},
		{"both names of maxConcurrent", models + "limits: {default: {maxConcurrent: 2, maxConcurrentStreams: 3}}\n", []string{
			"maxConcurrent is 2 but maxConcurrentStreams, its deprecated name, is 3: give maxConcurrent only",
		}},
		{"timeouts", models + "timeouts: {request: 0s, stream: -1s}\nserver: {drainTimeout: -1s}\n", []string{
			"timeouts.request must be positive", "timeouts.stream must be positive",
			"server.drainTimeout must not be negative",
		}},
		{"same addresses", models + "server: {address: ':80', opsAddress: ':80'}\n", []string{
			"server.opsAddress must differ from server.address",
		}},
		{"log level", models + "log: {level: loud}\n", []string{"log.level:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.yaml))
			if err == nil {
				t.Fatal("ParseConfig accepted the config")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestQueueConfigValidate(t *testing.T) {
	err := Default().Queue.Validate()
	for _, w := range []string{"queue.url is required", "queue.orchestra is required"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, want it to mention %q", err, w)
		}
	}
	q := Default().Queue
	q.URL, q.Orchestra = "nats://n:4222", "demo"
	if err := q.Validate(); err != nil {
		t.Errorf("Validate() = %v for a complete queue section", err)
	}
}

func TestParseConfigAnonymous(t *testing.T) {
	cfg, err := ParseConfig([]byte("models: [{name: m, app: a}]\nauth: {anonymous: true, secretSelector: ''}\n"))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	if !cfg.Auth.Anonymous || cfg.Auth.SecretSelector != "" {
		t.Errorf("auth = %+v", cfg.Auth)
	}
}

// TestMaxConcurrentDeprecatedName: configurations written before
// limits.default.maxConcurrentStreams took the resource's name,
// maxConcurrent, keep their limit.
func TestMaxConcurrentDeprecatedName(t *testing.T) {
	const models = "models: [{name: m, app: a}]\n"
	tests := []struct {
		name, limits string
		want         int
	}{
		{"default", "{}", 16},
		{"maxConcurrent", "{maxConcurrent: 3}", 3},
		{"deprecated maxConcurrentStreams", "{maxConcurrentStreams: 4}", 4},
		{"both, the same", "{maxConcurrent: 5, maxConcurrentStreams: 5}", 5},
		{"unlimited by the deprecated name", "{maxConcurrentStreams: 0}", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(models + "limits: {default: " + tt.limits + "}\n"))
			if err != nil {
				t.Fatal(err)
			}
			want := Default().Limits
			want.Default.MaxConcurrent = tt.want
			if diff := cmp.Diff(want, cfg.Limits); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
		})
	}
}
