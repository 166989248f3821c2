package dispatch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadAppliesDefaultsAndValidates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dispatcher.yaml")
	raw := `
orchestra: demo
nats:
  url: nats://nats.demo:4222
stream:
  replicas: 3
ackWait: 45s
apps:
- name: chat
  service: chat-root
- name: embed
  endpoints: ["http://127.0.0.1:8000"]
  maxConcurrency: 4
`
	if err := os.WriteFile(path, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if cfg.AckWait.Duration != 45*time.Second || cfg.Stream.Replicas != 3 || cfg.MaxDeliver != 5 {
		t.Errorf("loaded %+v", cfg)
	}
	if a := cfg.Apps[0]; a.Port != 8000 || a.MaxConcurrency != 32 {
		t.Errorf("app defaults not applied: %+v", a)
	}
}

func TestLoadRejectsUnknownFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dispatcher.yaml")
	if err := os.WriteFile(path, []byte("orchestra: x\nackTimeout: 3s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Fatal("a misspelt field was accepted")
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	cfg := Default()
	cfg.Orchestra = "a.b"
	cfg.Stream.Replicas = 2
	cfg.Apps = []App{{Name: "x"}, {Name: "x", Endpoints: []string{"ftp://nope"}, MaxConcurrency: 1, Port: 1}}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"orchestra", "replicas", "needs a service or endpoints", "listed twice", "not an http(s) URL", "maxConcurrency"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
