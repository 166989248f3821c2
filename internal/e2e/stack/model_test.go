package stack

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
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

func TestTinyGGUFHeader(t *testing.T) {
	b := TinyModelFiles()[DemoFile]
	if string(b[:4]) != "GGUF" || b[4] != 3 || len(b)%32 != 0 {
		t.Errorf("header = %q version %d, length %d; want GGUF v3 padded to 32 bytes", b[:4], b[4], len(b))
	}
}
