package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/ollamatest"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// The Ollama adapter's contract, against the real engine: the pinned
// Ollama (bin/ollama) serving the generated tiny model, created under a
// name without a tag as the chart does (`ollama create "$SERVED_MODEL_NAME"`),
// which Ollama lists as NAME:latest.
func TestOllamaAdapterAgainstRealOllama(t *testing.T) {
	s := ollamatest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var model bytes.Buffer
	if _, err := modelgen.Write(&model, modelgen.Tiny()); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "tiny", model.Bytes()); err != nil {
		t.Fatal(err)
	}
	e, err := sidecar.NewEngine(sidecar.EngineConfig{Kind: v1alpha1.EngineOllama, URL: s.URL, Model: "tiny", KeepAlive: "-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}

	if asleep, err := e.Sleeping(ctx); err != nil || !asleep {
		t.Fatalf("a created, never used model: Sleeping = %v, %v; want true", asleep, err)
	}
	if err := e.Wake(ctx); err != nil {
		t.Fatalf("wake: %v", err)
	}
	if names := psNames(t, s.URL); len(names) != 1 || names[0] != "tiny:latest" {
		t.Fatalf("/api/ps lists %v after the wake, want [tiny:latest]", names)
	}
	if asleep, err := e.Sleeping(ctx); err != nil || asleep {
		t.Fatalf("after the wake: Sleeping = %v, %v; want false", asleep, err)
	}
	if n, err := e.InFlight(ctx); err != nil || n != -1 {
		t.Errorf("InFlight = %d, %v; want -1 (Ollama has no request gauge)", n, err)
	}
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	if names := psNames(t, s.URL); len(names) != 0 {
		t.Fatalf("/api/ps lists %v after the sleep, want nothing", names)
	}
	// A second cycle: the reload after an unload.
	if err := e.Wake(ctx); err != nil {
		t.Fatalf("second wake: %v", err)
	}
	if asleep, _ := e.Sleeping(ctx); asleep {
		t.Fatal("not loaded after the second wake")
	}
	// The tagged name and another case are the same model to Ollama.
	for _, name := range []string{"tiny:latest", "TINY"} {
		other, _ := sidecar.NewEngine(sidecar.EngineConfig{Kind: v1alpha1.EngineOllama, URL: s.URL, Model: name}, nil)
		if asleep, err := other.Sleeping(ctx); err != nil || asleep {
			t.Errorf("model %q: Sleeping = %v, %v; want false", name, asleep, err)
		}
	}

	// A model Ollama does not have: the wake waits for it to be created
	// (as the engine's start does) and fails at its deadline, saying so.
	absent, _ := sidecar.NewEngine(sidecar.EngineConfig{Kind: v1alpha1.EngineOllama, URL: s.URL, Model: "absent", PollInterval: 50 * time.Millisecond}, nil)
	actx, acancel := context.WithTimeout(ctx, time.Second)
	defer acancel()
	if err := absent.Wake(actx); err == nil || !strings.Contains(err.Error(), "ollama to have the model absent") {
		t.Errorf("the wake of a model Ollama does not have: %v; want it to wait for the model and fail", err)
	}
}

// The name rule on its own, against the fake (which lists names as Ollama
// does): runs under -short too.
func TestOllamaAdapterUntaggedName(t *testing.T) {
	f := enginetest.NewOllama()
	defer f.Close()
	f.Create("tiny")
	e := newEngine(t, sidecar.EngineConfig{Kind: "ollama", URL: f.URL(), Model: "tiny", KeepAlive: "-1"})
	ctx := ctxT(t)
	if err := e.Wake(ctx); err != nil {
		t.Fatalf("wake of %q, listed as tiny:latest: %v", "tiny", err)
	}
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

func psNames(t *testing.T, base string) []string {
	t.Helper()
	resp, err := http.Get(base + "/api/ps")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var ps struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ps.Models {
		names = append(names, m.Name)
	}
	return names
}

// A wake that comes before the engine's start created the model (a pod
// woken from zero: its sidecar asks at once, the chart's script creates the
// model a moment later) waits for the create and then loads it, instead of
// failing on Ollama's "model not found".
func TestOllamaWakeWaitsForTheModelToBeCreated(t *testing.T) {
	f := enginetest.NewOllama()
	defer f.Close()
	e := newEngine(t, sidecar.EngineConfig{Kind: "ollama", URL: f.URL(), Model: "tiny", KeepAlive: "-1", PollInterval: 10 * time.Millisecond})
	ctx := ctxT(t)
	woke := make(chan error, 1)
	go func() { woke <- e.Wake(ctx) }()
	select {
	case err := <-woke:
		t.Fatalf("the wake ended before the model existed: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	f.Create("tiny")
	if err := <-woke; err != nil {
		t.Fatalf("wake after the create: %v", err)
	}
	if asleep, err := e.Sleeping(ctx); err != nil || asleep {
		t.Fatalf("after the wake: Sleeping = %v, %v; want false", asleep, err)
	}
}
