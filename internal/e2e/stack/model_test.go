package stack

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
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

// sinkFunc records the fetcher's progress reports.
type sinkFunc func(fetch.Status, bool)

func (f sinkFunc) Report(_ context.Context, s fetch.Status, final bool) error {
	f(s, final)
	return nil
}

// TestTinyModelResumesAndVerifies runs the fetcher's resume, verification
// and progress on the real model file the demo serves: the connection of
// the GGUF download drops after 100 KiB, the fetch continues from there
// (not from the start), checks the sha256 the mirror lists and reports the
// whole size as done and verified.
func TestTinyModelResumesAndVerifies(t *testing.T) {
	hub := &hubtest.Server{}
	repo := &hubtest.Repo{ID: DemoModel}
	var total int64
	for path, data := range TinyModelFiles() {
		repo.Files = append(repo.Files, hubtest.File{Path: path, Content: fetchtest.Bytes(data), LFS: filepath.Ext(path) == ".gguf"})
		total += int64(len(data))
	}
	hub.AddRepo(repo)
	hub.SetCDNBase("")
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()
	hub.Faults.DropNext(1, 100<<10)

	cfg := fetch.Default()
	cfg.Source = "hf://" + DemoModel
	cfg.Dest = t.TempDir()
	cfg.Format = fetch.FormatGGUF
	cfg.HFEndpoint = srv.URL
	cfg.Concurrency = 1
	var (
		mu   sync.Mutex
		last fetch.Status
	)
	res, err := fetch.Run(context.Background(), cfg, fetch.Options{Sinks: []fetch.ProgressSink{sinkFunc(func(s fetch.Status, _ bool) {
		mu.Lock()
		last = s
		mu.Unlock()
	})}})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		t.Fatalf("fetching the demo model through a dropped connection: %v", err)
	}
	if n := hub.Faults.Pending(); n != 0 {
		t.Fatal("the injected drop never happened")
	}
	if served := hub.Stats.BytesServed(); served > total+64<<10 {
		t.Errorf("served %d bytes for %d: the dropped download started again from the beginning", served, total)
	}
	got, err := os.ReadFile(filepath.Join(cfg.Dest, DemoFile))
	if err != nil || !bytes.Equal(got, TinyModelFiles()[DemoFile]) {
		t.Fatalf("cached %s differs from the served model (err %v)", DemoFile, err)
	}
	if res.Downloaded != total || last.BytesDone != total || last.BytesTotal != total || !last.Verified {
		t.Errorf("downloaded %d, last progress %+v; want %d bytes done of %d, verified", res.Downloaded, last, total, total)
	}
}
