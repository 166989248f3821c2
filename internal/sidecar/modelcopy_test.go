package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// linkReader is an engine that, like Ollama and llama.cpp's router, opens
// its model file at each load: its wake reads the link and keeps the bytes.
type linkReader struct {
	link   string
	loaded []byte
	asleep bool
	// refuse fails a load of a file whose path contains it (an engine
	// that cannot read a copy).
	refuse string
	// down fails every load without an answer (the engine is not
	// listening yet, or restarts).
	down bool
}

func (e *linkReader) Name() v1alpha1.Engine                  { return v1alpha1.EngineOllama }
func (e *linkReader) InFlight(context.Context) (int, error)  { return 0, nil }
func (e *linkReader) Sleep(context.Context, int) error       { e.asleep, e.loaded = true, nil; return nil }
func (e *linkReader) Sleeping(context.Context) (bool, error) { return e.asleep, nil }
func (e *linkReader) Wake(context.Context) (err error) {
	if e.down {
		return fmt.Errorf("POST /api/generate: %w", syscall.ECONNREFUSED)
	}
	if target, _ := os.Readlink(e.link); e.refuse != "" && strings.Contains(target, e.refuse) {
		// Ollama answers a load it cannot do with a 500 and its error.
		return &EngineError{Method: "POST", Path: "/api/generate", Status: 500, Body: `{"error":"open ` + target + `: permission denied"}`}
	}
	e.loaded, err = os.ReadFile(e.link)
	e.asleep = err != nil
	return err
}

// TestTheEngineLoadsTheHottestVerifiedCopy points an engine that opens its
// model file at each load through the sidecar's link: at the model cache
// while the node agent holds no copy, at the agent's hot copy once it
// placed one from the cache (verified against the fetcher's manifest),
// at the warm copy once the hot copy is evicted, and never at a partly
// written copy or at one whose recorded sha256 is not the manifest's. A
// cold copy that does not match the manifest is refused by the agent and
// never becomes visible. Each wake reports the tier it read and the bytes.
func TestTheEngineLoadsTheHottestVerifiedCopy(t *testing.T) {
	cache := t.TempDir()
	model := modelBytes(3<<20+17, 7)
	if err := os.WriteFile(filepath.Join(cache, "tiny.gguf"), model, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(model)
	want := fetch.ManifestFile{Path: "tiny.gguf", Size: int64(len(model)), SHA256: hex.EncodeToString(sum[:])}
	writeManifest(t, cache, fetch.Manifest{Version: fetch.ManifestVersion, Complete: true, Files: []fetch.ManifestFile{want}})

	s, cfg := copyStore(t, nodeapi.Budgets{Hot: 8 << 20, Warm: 8 << 20})
	k := nodeapi.Key{Namespace: "ns", Name: "rel-chat"}
	linkDir := t.TempDir()
	copies := NewModelCopies(ModelCopiesConfig{
		Link: filepath.Join(linkDir, "model"), ModelDir: cache, File: "tiny.gguf",
		HotDir: filepath.Join(cfg.HotDir, "ns"), WarmDir: filepath.Join(cfg.WarmDir, "ns"), Name: k.Name,
	})
	if errs := copies.cfg.validate(v1alpha1.EngineOllama); len(errs) > 0 {
		t.Fatal(errs)
	}
	inner := &linkReader{link: copies.cfg.Link}
	e := withModelCopies(inner, copies, nil).(*copyEngine)
	ctx := context.Background()
	wake := func(wantTier v1alpha1.Tier, wantPath string) {
		t.Helper()
		if next := e.ModelCopy(false); next == nil || next.Tier != wantTier || next.Path != wantPath {
			t.Errorf("asleep, the next wake would load %+v; want the %s copy %s", next, wantTier, wantPath)
		}
		if err := e.Wake(ctx); err != nil {
			t.Fatal(err)
		}
		if string(inner.loaded) != string(model) {
			t.Errorf("the engine loaded %d bytes that are not the model file", len(inner.loaded))
		}
		if target, _ := os.Readlink(copies.cfg.Link); target != wantPath {
			t.Errorf("the link points at %s; want %s", target, wantPath)
		}
		tr := e.LastTransfer()
		if tr == nil || tr.Tier != wantTier || tr.Bytes != int64(len(model)) || !tr.Verified {
			t.Errorf("the wake reported %+v; want %d verified bytes from %s", tr, len(model), wantTier)
		}
		if cur := e.ModelCopy(true); cur == nil || cur.Path != wantPath {
			t.Errorf("awake, the loaded copy is %+v; want %s", cur, wantPath)
		}
		if err := e.Sleep(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	coldPath := filepath.Join(cache, "tiny.gguf")
	hotPath, warmPath := s.Path(k, v1alpha1.TierHot), s.Path(k, v1alpha1.TierWarm)

	// No copy yet: the cache.
	wake(v1alpha1.TierCold, coldPath)

	// A cold file whose bytes are not the manifest's is refused, and
	// nothing is visible.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "tiny.gguf"), modelBytes(len(model), 8), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Promote(ctx, k, v1alpha1.TierHot, nodeagent.ModelFile(nodeagent.ColdFile(filepath.Join(bad, "tiny.gguf")), want), "", 0); !errors.Is(err, nodeagent.ErrManifestMismatch) {
		t.Fatalf("promoting a mismatching cold copy: %v; want ErrManifestMismatch", err)
	}
	if _, err := os.Stat(hotPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the refused copy %s exists (%v)", hotPath, err)
	}
	wake(v1alpha1.TierCold, coldPath)

	// A partly written copy (the agent's temporary name) is never used.
	if err := os.MkdirAll(filepath.Dir(hotPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(hotPath), "."+k.Name+".tmp-1"), model[:1<<20], 0o600); err != nil {
		t.Fatal(err)
	}
	wake(v1alpha1.TierCold, coldPath)

	// The agent's verified copies: hot first, then warm.
	cold := nodeagent.ModelFile(nodeagent.ColdFile(coldPath), want)
	if e, err := s.Promote(ctx, k, v1alpha1.TierWarm, cold, "", 0); err != nil || e.SHA256 != want.SHA256 {
		t.Fatalf("promoting to warm: %+v, %v; want the manifest's sha256 recorded", e, err)
	}
	wake(v1alpha1.TierWarm, warmPath)
	if e, err := s.Promote(ctx, k, v1alpha1.TierHot, cold, "", 0); err != nil || e.SHA256 != want.SHA256 {
		t.Fatalf("promoting to hot (from warm): %+v, %v; want the sha256 carried", e, err)
	}
	wake(v1alpha1.TierHot, hotPath)

	// An engine that cannot load the hot copy (its permissions, a bad
	// file) is not kept asleep: the wake loads the model cache, and says so.
	inner.refuse = "/hot/"
	if err := e.Wake(ctx); err != nil {
		t.Fatalf("a wake whose hot copy the engine cannot load: %v; want it loaded from the model cache", err)
	}
	if tr := e.LastTransfer(); tr == nil || tr.Tier != v1alpha1.TierCold || string(inner.loaded) != string(model) {
		t.Errorf("after a failed load of the hot copy the wake reported %+v; want the model cache", tr)
	}
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	inner.refuse = ""

	// An engine that does not answer (not listening yet, restarting) says
	// nothing about the copy: that wake fails, the link stays on the hot
	// copy, and the next wake loads it.
	inner.down = true
	if err := e.Wake(ctx); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a wake of an engine that does not answer: %v; want its error", err)
	}
	if target, _ := os.Readlink(copies.cfg.Link); target != hotPath {
		t.Errorf("after a wake the engine did not answer, the link points at %s; want the hot copy %s", target, hotPath)
	}
	inner.down = false
	wake(v1alpha1.TierHot, hotPath)

	// The hot copy goes (an eviction) while the engine is awake: the link
	// is re-pointed, and the next wake loads the warm copy.
	if err := e.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(k, v1alpha1.TierHot); err != nil {
		t.Fatal(err)
	}
	if !copies.Gone() {
		t.Error("the removed hot copy is not reported gone")
	}
	if err := e.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wake(v1alpha1.TierWarm, warmPath)

	// A copy whose metadata records another sha256 (another model file
	// under the same name) is not the engine's.
	mp := filepath.Join(filepath.Dir(warmPath), nodeapi.CopyMetaName(k.Name))
	b, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	var md nodeapi.CopyMeta
	if err := json.Unmarshal(b, &md); err != nil {
		t.Fatal(err)
	}
	md.SHA256 = hex.EncodeToString(make([]byte, 32))
	b, _ = json.Marshal(md)
	if err := os.WriteFile(mp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	wake(v1alpha1.TierCold, coldPath)
	// The sidecar says why it passed over each faster tier.
	if why := copies.PassedOver(); !strings.Contains(why, "Hot: the node agent holds no copy") || !strings.Contains(why, "Warm: the copy's metadata records") || !strings.Contains(why, want.SHA256) {
		t.Errorf("passed over the hot and warm copies because %q; want the missing hot copy and the warm copy's sha256 against the manifest's", why)
	}
}

// copyStore is a node agent's store, whose copies the sidecar points its
// engine at.
func copyStore(t *testing.T, b nodeapi.Budgets) (*nodeagent.Store, nodeagent.StoreConfig) {
	t.Helper()
	cfg := nodeagent.StoreConfig{HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"), Budgets: b}
	s, err := nodeagent.OpenStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return s, cfg
}

// modelBytes are n synthetic bytes of a model file.
func modelBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	arena.Synthesize(b, seed)
	return b
}

func writeManifest(t *testing.T, dir string, m fetch.Manifest) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	p := fetch.ManifestPath(dir)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
