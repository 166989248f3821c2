package nodeagent_test

import (
	"github.com/model-orchestra/operator/api/v1alpha1"

	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecar"
)

// modelDir writes a safetensors model directory (as vLLM loads it) into
// cache under root, with the fetcher's complete manifest listing every
// file with its sha256, and returns the files' contents by path.
func modelDir(t *testing.T, cache, root string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{
		"config.json":                      []byte(`{"architectures":["LlamaForCausalLM"],"hidden_size":64}`),
		"tokenizer.json":                   bytes.Repeat([]byte(`{"t":1}`), 300),
		"model.safetensors.index.json":     []byte(`{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`),
		"model-00001-of-00002.safetensors": bytes.Repeat([]byte("shard-one "), 120_000),
		"model-00002-of-00002.safetensors": bytes.Repeat([]byte("shard-two!"), 80_000),
		"generation_config.json":           {},
		"original/params.json":             []byte(`{"dim":64}`),
	}
	var m fetch.Manifest
	m.Version, m.Complete, m.Verified = 1, true, true
	for p, b := range files {
		full := filepath.Join(cache, root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		m.Files = append(m.Files, fetch.ManifestFile{Path: root + "/" + p, Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])})
	}
	// Another model of the same cache is not part of the copy.
	m.Files = append(m.Files, fetch.ManifestFile{Path: "other.gguf", Size: 1, SHA256: strings.Repeat("a", 64)})
	b, _ := json.Marshal(m)
	if err := os.MkdirAll(filepath.Dir(fetch.ManifestPath(cache)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fetch.ManifestPath(cache), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return files
}

// TestNodeKeepsAVerifiedCopyOfAModelDirectory: vLLM loads a directory of
// safetensors shards, config and tokenizer files. The agent copies the
// whole directory from the engine's sidecar into the hot tier as one copy,
// every file verified against the manifest's sha256 and the copy counted
// in the budget at the files' total size; it demotes it to warm, promotes
// it back, re-verifies it (a flipped byte in a shard drops it), indexes it
// again after a restart, and refuses a directory whose cache shard no
// longer matches the manifest, leaving nothing behind.
func TestNodeKeepsAVerifiedCopyOfAModelDirectory(t *testing.T) {
	cache := t.TempDir()
	files := modelDir(t, cache, "llama")
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	side := httptest.NewServer(sidecar.ModelFilesHandler(cache, "llama", ""))
	defer side.Close()
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 8 << 20, Warm: 8 << 20}, Namespace: "ns",
		},
		RuntimeVersion: "containerd://1.6.20",
	}
	_, srv := serveNode(t, cfg)
	call := func(path string, body any) (int, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	sameFiles := func(dir string) {
		t.Helper()
		for p, want := range files {
			got, err := os.ReadFile(filepath.Join(dir, p))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s in the copy %s: %d bytes (%v), want the cache's %d", p, dir, len(got), err, len(want))
			}
		}
	}
	hot := filepath.Join(cfg.Store.HotDir, "ns", "vllm-chat")
	warm := filepath.Join(cfg.Store.WarmDir, "ns", "vllm-chat")

	code, out := call("/promote", map[string]any{"namespace": "ns", "name": "vllm-chat", "to": "Hot", "sidecar": side.URL})
	if code != http.StatusOK {
		t.Fatalf("copy of the model directory to hot: %d %s", code, out)
	}
	var e nodeapi.Entry
	_ = json.Unmarshal([]byte(out), &e)
	if e.Files != len(files) || e.Bytes != total || e.Tier != v1alpha1.TierHot || e.SHA256 != "" {
		t.Errorf("hot copy %+v; want %d files, %d bytes", e, len(files), total)
	}
	sameFiles(hot)
	var meta nodeapi.CopyMeta
	b, err := os.ReadFile(filepath.Join(cfg.Store.HotDir, "ns", nodeapi.CopyMetaName("vllm-chat")))
	if err == nil {
		err = json.Unmarshal(b, &meta)
	}
	if err != nil || len(meta.Files) != len(files) || meta.Bytes != total {
		t.Errorf("the hot copy's metadata %+v (%v); want its %d files listed", meta, err, len(files))
	}

	if code, out := call("/demote", map[string]any{"namespace": "ns", "name": "vllm-chat"}); code != http.StatusOK || !strings.Contains(out, `"source":"store"`) {
		t.Fatalf("demoting the directory copy: %d %s", code, out)
	}
	if _, err := os.Stat(hot); !os.IsNotExist(err) {
		t.Errorf("the hot directory copy is still there after the demotion: %v", err)
	}
	sameFiles(warm)
	if code, out := call("/promote", map[string]any{"namespace": "ns", "name": "vllm-chat", "to": "Hot"}); code != http.StatusOK {
		t.Fatalf("promoting the warm directory copy back to hot: %d %s", code, out)
	}
	sameFiles(hot)

	// A restarted agent indexes both directory copies again.
	n2 := restarted(t, cfg)
	for _, tier := range []v1alpha1.Tier{v1alpha1.TierHot, v1alpha1.TierWarm} {
		if e, ok := n2.Store().Lookup(nodeapi.Key{Namespace: "ns", Name: "vllm-chat"}, tier); !ok || e.Files != len(files) || e.Bytes != total {
			t.Errorf("after a restart the %s copy is %+v (%v); want the directory's %d files", tier, e, ok, len(files))
		}
	}

	code, out = call("/verify", nil)
	if code != http.StatusOK || strings.Contains(out, `"dropped":true`) {
		t.Fatalf("verifying intact directory copies: %d %s", code, out)
	}
	shard := filepath.Join(warm, "model-00002-of-00002.safetensors")
	bad := bytes.Clone(files["model-00002-of-00002.safetensors"])
	bad[100] ^= 0xff
	if err := os.WriteFile(shard, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = call("/verify", nil)
	if code != http.StatusOK || !strings.Contains(out, `"dropped":true`) || !strings.Contains(out, `"tier":"Warm"`) {
		t.Errorf("verifying after a byte of a warm shard flipped: %d %s; want the warm copy dropped", code, out)
	}
	if _, err := os.Stat(warm); !os.IsNotExist(err) {
		t.Errorf("the corrupted warm directory copy is still there: %v", err)
	}

	// The cache's shard no longer matches the manifest: refused, nothing
	// placed, no temporary directory left.
	if err := os.WriteFile(filepath.Join(cache, "llama", "model-00001-of-00002.safetensors"), bytes.Repeat([]byte("shard-ONE "), 120_000), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = call("/promote", map[string]any{"namespace": "ns", "name": "other-vllm", "to": "Warm", "sidecar": side.URL})
	if code != http.StatusConflict || !strings.Contains(out, "does not match the fetcher's manifest") {
		t.Errorf("a directory with a shard that is not the manifest's: %d %s; want 409", code, out)
	}
	left, _ := os.ReadDir(filepath.Join(cfg.Store.WarmDir, "ns"))
	for _, f := range left {
		if strings.Contains(f.Name(), "other-vllm") {
			t.Errorf("the refused directory copy left %s behind", f.Name())
		}
	}
}
