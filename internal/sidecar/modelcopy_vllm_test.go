package sidecar

import (
	"github.com/model-orchestra/operator/api/v1alpha1"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// TestVLLMLoadsTheHottestVerifiedCopyOfItsModelDirectory drives the fake
// vLLM (its documented sleep API; its reload_weights reads the --model
// directory, here the sidecar's link) through the real adapter with model
// copies. The node agent copies the model directory from the sidecar
// (every file verified against the manifest). After a level-2 sleep the
// wake points the link at the hottest verified copy before the documented
// sequence, so reload_weights reads the hot copy, then the warm one once
// the hot copy is demoted, then the model cache once the warm copy's
// metadata no longer matches the manifest; each wake reports the tier and
// the directory's bytes. After a level-1 sleep the weights come back from
// vLLM's own RAM: no reload, and the wake says Hot with no bytes read.
func TestVLLMLoadsTheHottestVerifiedCopyOfItsModelDirectory(t *testing.T) {
	cache := t.TempDir()
	files := map[string][]byte{
		"config.json":                      []byte(`{"architectures":["LlamaForCausalLM"]}`),
		"tokenizer.json":                   []byte(`{"model":{"type":"BPE"}}`),
		"model.safetensors.index.json":     []byte(`{"weight_map":{}}`),
		"model-00001-of-00002.safetensors": modelBytes(1<<20+5, 1),
		"model-00002-of-00002.safetensors": modelBytes(700_001, 2),
	}
	var m fetch.Manifest
	m.Version, m.Complete = fetch.ManifestVersion, true
	var total, shards int64
	for p, b := range files {
		if err := os.MkdirAll(filepath.Join(cache, "llama"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cache, "llama", p), b, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		m.Files = append(m.Files, fetch.ManifestFile{Path: "llama/" + p, Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])})
		total += int64(len(b))
		if strings.HasSuffix(p, ".safetensors") {
			shards += int64(len(b))
		}
	}
	writeManifest(t, cache, m)

	s, cfg := copyStore(t, nodeapi.Budgets{Hot: 8 << 20, Warm: 8 << 20})
	k := nodeapi.Key{Namespace: "ns", Name: "rel-vllm"}
	copies := NewModelCopies(ModelCopiesConfig{
		Link: filepath.Join(t.TempDir(), "model"), ModelDir: cache, File: "llama",
		HotDir: filepath.Join(cfg.HotDir, "ns"), WarmDir: filepath.Join(cfg.WarmDir, "ns"), Name: k.Name,
	})
	if errs := copies.cfg.validate(v1alpha1.EngineVLLM); len(errs) > 0 {
		t.Fatal(errs)
	}
	f := enginetest.NewVLLM()
	defer f.Close()
	f.SetModel(copies.cfg.Link)
	inner, err := NewEngine(EngineConfig{Kind: v1alpha1.EngineVLLM, URL: f.URL()}, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	e := withModelCopies(inner, copies, nil).(*copyEngine)
	ctx := context.Background()
	// At start the link points at the model in the cache (vLLM's --model).
	if c, err := copies.Point(); err != nil || c.Tier != v1alpha1.TierCold || c.Path != filepath.Join(cache, "llama") || c.Bytes != total || c.Files != len(files) {
		t.Fatalf("at start the link points at %+v (%v); want the cache's model directory, %d files", c, err, len(files))
	}

	sleepWake := func(level int, wantTier v1alpha1.Tier, wantDir string) {
		t.Helper()
		before := len(f.Reloads())
		if err := e.Sleep(ctx, level); err != nil {
			t.Fatal(err)
		}
		next := e.ModelCopy(false)
		if level == 1 {
			if next == nil || next.Tier != v1alpha1.TierHot || next.Path != "" {
				t.Errorf("asleep at level 1, the next wake reads %+v; want vLLM's own RAM (hot, no copy)", next)
			}
		} else if next == nil || next.Tier != wantTier || next.Path != wantDir {
			t.Errorf("asleep at level 2, the next wake reads %+v; want the %s copy %s", next, wantTier, wantDir)
		}
		if err := e.Wake(ctx); err != nil {
			t.Fatal(err)
		}
		if !f.WeightsValid() || f.Crashed() != "" {
			t.Fatalf("vLLM woke on garbage weights or crashed: %q", f.Crashed())
		}
		reloads := f.Reloads()
		tr := e.LastTransfer()
		if level == 1 {
			if len(reloads) != before {
				t.Errorf("a level-1 wake reloaded the weights from %+v; want them from vLLM's RAM", reloads[before:])
			}
			if tr == nil || tr.Tier != v1alpha1.TierHot || tr.Bytes != 0 {
				t.Errorf("a level-1 wake reported %+v; want hot, no bytes read from a copy", tr)
			}
			return
		}
		if len(reloads) != before+1 || reloads[before].Dir != wantDir || reloads[before].Bytes != shards {
			t.Errorf("reload_weights read %+v; want %d shard bytes from %s", reloads[before:], shards, wantDir)
		}
		if tr == nil || tr.Tier != wantTier || tr.Bytes != total || !tr.Verified {
			t.Errorf("the level-2 wake reported %+v; want %d verified bytes from %s", tr, total, wantTier)
		}
	}

	// The agent's hot copy, made through the sidecar (as without a
	// ReadWriteMany cache), file by file against the manifest.
	side := httptest.NewServer(ModelFilesHandler(cache, "llama", ""))
	defer side.Close()
	src, err := nodeagent.SidecarModel(ctx, sidecarapi.Client{URL: side.URL})
	if err != nil {
		t.Fatal(err)
	}
	if en, err := s.Promote(ctx, k, v1alpha1.TierHot, src, "", 0); err != nil || en.Files != len(files) || en.Bytes != total {
		t.Fatalf("the hot copy of the directory: %+v, %v", en, err)
	}
	hot, warm := s.Path(k, v1alpha1.TierHot), s.Path(k, v1alpha1.TierWarm)
	sleepWake(2, v1alpha1.TierHot, hot)
	sleepWake(1, v1alpha1.TierHot, "")

	if _, _, err := s.Demote(k, "", 0); err != nil {
		t.Fatal(err)
	}
	sleepWake(2, v1alpha1.TierWarm, warm)

	// A warm copy whose metadata lists a file the manifest does not have
	// that way (another model under the same name) is passed over.
	mp := filepath.Join(filepath.Dir(warm), nodeapi.CopyMetaName(k.Name))
	b, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	var md nodeapi.CopyMeta
	if err := json.Unmarshal(b, &md); err != nil {
		t.Fatal(err)
	}
	md.Files[0].SHA256 = strings.Repeat("0", 64)
	b, _ = json.Marshal(md)
	if err := os.WriteFile(mp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	sleepWake(2, v1alpha1.TierCold, filepath.Join(cache, "llama"))
	if why := copies.PassedOver(); !strings.Contains(why, "Warm: the copy's metadata records") {
		t.Errorf("passed over the warm copy because %q; want its files against the manifest's", why)
	}
}
