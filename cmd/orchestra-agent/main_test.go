package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/agent"
)

func TestCheckConfigPrintsTheFlagsAsConfig(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"--role", "node", "--hot-max-bytes", "1GiB", "--warm-max-bytes", "0.5GiB", "--hot-dir", "/dev/shm/x", "--check-config"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var cfg agent.Config
	if err := json.Unmarshal(out.Bytes(), &cfg); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if cfg.Role != "node" || cfg.Node.Store.Budgets.Hot != 1<<30 || cfg.Node.Store.Budgets.Warm != 1<<29 || cfg.Node.Store.HotDir != "/dev/shm/x" {
		t.Fatalf("config %+v", cfg.Node)
	}
	if cfg.Node.VerifyInterval != 15*time.Minute {
		t.Errorf("default verify interval %v, want 15m", cfg.Node.VerifyInterval)
	}
}

// The chart passes one --verify-interval per sleeping application: the
// shortest wins.
func TestVerifyIntervalTheShortestWins(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"--role", "node", "--verify-interval=15m0s", "--verify-interval=1m30s", "--verify-interval=1h0m0s", "--check-config"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var cfg agent.Config
	if err := json.Unmarshal(out.Bytes(), &cfg); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if cfg.Node.VerifyInterval != 90*time.Second {
		t.Errorf("verify interval %v, want the shortest given, 1m30s", cfg.Node.VerifyInterval)
	}
}

func TestInvalidConfigExits2NamingTheField(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--engine", "dllama", "--check-config"}, &out, &errb); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), "runtime.engine is dllama") {
		t.Fatalf("stderr %q does not name the field", errb.String())
	}
	if code := run([]string{"--hot-max-bytes", "lots"}, &out, &errb); code != 2 {
		t.Fatalf("bad size: exit %d, want 2", code)
	}
}

// --role seat, the sidecar's name before "seat" meant only a seat group's
// accelerator seat, still starts the sidecar for one release, with a
// warning: the chart's pods of the previous release keep their flags until
// they roll.
func TestRoleSeatIsADeprecatedAliasOfSidecar(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--role", "seat", "--check-config"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var cfg agent.Config
	if err := json.Unmarshal(out.Bytes(), &cfg); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if cfg.Role != agent.RoleSidecar {
		t.Errorf("role %q, want %q", cfg.Role, agent.RoleSidecar)
	}
	if !strings.Contains(errb.String(), "deprecated") || !strings.Contains(errb.String(), "--role sidecar") {
		t.Errorf("stderr %q does not warn that --role seat is deprecated", errb.String())
	}
	errb.Reset()
	if code := run([]string{"--role", "sidecar", "--check-config"}, &out, &errb); code != 0 || strings.Contains(errb.String(), "deprecated") {
		t.Errorf("--role sidecar: exit %d, stderr %q; want 0 and no warning", code, errb.String())
	}
}
