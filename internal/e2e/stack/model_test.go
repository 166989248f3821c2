package stack

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
	"github.com/model-orchestra/operator/internal/modelgen"
)

// TestTinyModelFetchesAndHitsCache checks what the demo relies on:
// orchestra-fetch downloads the demo repository from a mirror and accepts
// its GGUF file (--format gguf), as the operator's fetch Job does with
// model.hubEndpoint; and a second run for the same source and format (a
// recreated fetch Job) is a cache hit that never contacts a hub.
func TestTinyModelFetchesAndHitsCache(t *testing.T) {
	hub := &hubtest.Server{}
	repo := &hubtest.Repo{ID: DemoModel}
	for path, data := range TinyModelFiles() {
		repo.Files = append(repo.Files, hubtest.File{Path: path, Content: fetchtest.Bytes(data), LFS: filepath.Ext(path) == ".gguf"})
	}
	hub.AddRepo(repo)
	hub.SetCDNBase("")
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()

	dest := t.TempDir()
	cfg := fetch.Default()
	cfg.Source = "hf://" + DemoModel
	cfg.Dest = dest
	cfg.Format = fetch.FormatGGUF
	cfg.HFEndpoint = srv.URL
	res, err := fetch.Run(context.Background(), cfg, fetch.Options{})
	if err != nil {
		t.Fatalf("fetching the demo model from the mirror: %v", err)
	}
	if res.Files != len(TinyModelFiles()) || res.CacheHit {
		t.Errorf("first fetch: %d files, cache hit %v; want %d files downloaded", res.Files, res.CacheHit, len(TinyModelFiles()))
	}
	got, err := os.ReadFile(filepath.Join(dest, DemoFile))
	if err != nil || string(got) != string(TinyModelFiles()[DemoFile]) {
		t.Fatalf("cached %s differs from the served file (err %v)", DemoFile, err)
	}

	srv.Close() // the second run must not need the hub
	cfg.HFEndpoint = fetch.DefaultHFEndpoint
	res, err = fetch.Run(context.Background(), cfg, fetch.Options{})
	if err != nil {
		t.Fatalf("second fetch into the complete cache: %v", err)
	}
	if !res.CacheHit || res.Downloaded != 0 {
		t.Errorf("second fetch: cache hit %v, downloaded %d bytes; want a cache hit", res.CacheHit, res.Downloaded)
	}
}

func TestDemoModelIsTheGeneratedTinyModel(t *testing.T) {
	var want bytes.Buffer
	if _, err := modelgen.Write(&want, modelgen.Tiny()); err != nil {
		t.Fatal(err)
	}
	if got := TinyModelFiles()[DemoFile]; !bytes.Equal(got, want.Bytes()) {
		t.Errorf("the demo's %s (%d bytes) is not the generated tiny model (%d bytes)", DemoFile, len(got), want.Len())
	}
}
