package nodeagent_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestPromoteVerifiesModelFilesAgainstTheManifest copies a model file (a
// GGUF, as llama.cpp and Ollama load) from an application's model cache
// into the hot and warm tiers: placed when its bytes match the sha256 of
// the fetcher's manifest, refused with 409 and nothing placed when they do
// not, when the manifest is not complete, or when it lists the file
// without a sha256.
func TestPromoteVerifiesModelFilesAgainstTheManifest(t *testing.T) {
	cold := t.TempDir()
	cache := filepath.Join(cold, "chat")
	if err := os.MkdirAll(filepath.Join(cache, "gguf"), 0o755); err != nil {
		t.Fatal(err)
	}
	model := bytes.Repeat([]byte("GGUF\x03\x00\x00\x00weights "), 100_000)
	if err := os.WriteFile(filepath.Join(cache, "gguf", "model.gguf"), model, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(model)
	writeManifest := func(m fetch.Manifest) {
		t.Helper()
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		p := fetch.ManifestPath(cache)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := fetch.ManifestFile{Path: "gguf/model.gguf", Size: int64(len(model)), SHA256: hex.EncodeToString(sum[:])}
	_, srv := serveNode(t, nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 8 << 20, Warm: 8 << 20}, Namespace: "ns",
		},
		ColdDir: cold, RuntimeVersion: "containerd://1.6.20",
	})
	promote := func(name, to string) (int, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"namespace": "ns", "name": name, "to": to, "coldPath": "chat/gguf/model.gguf"})
		resp, err := http.Post(srv.URL+"/promote", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tiers := func() string {
		t.Helper()
		resp, err := http.Get(srv.URL + "/tiers")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	for name, c := range map[string]struct {
		m    fetch.Manifest
		want string
	}{
		"a manifest that is not complete":   {fetch.Manifest{Version: 1, Complete: false, Files: []fetch.ManifestFile{file}}, "not complete"},
		"a file without a sha256":           {fetch.Manifest{Version: 1, Complete: true, Files: []fetch.ManifestFile{{Path: file.Path, Size: file.Size}}}, "without a sha256"},
		"bytes that are not the manifest's": {fetch.Manifest{Version: 1, Complete: true, Files: []fetch.ManifestFile{{Path: file.Path, Size: file.Size, SHA256: strings.Repeat("0", 64)}}}, "the manifest says " + strings.Repeat("0", 64)},
		"a size that is not the manifest's": {fetch.Manifest{Version: 1, Complete: true, Files: []fetch.ManifestFile{{Path: file.Path, Size: file.Size + 1, SHA256: file.SHA256}}}, "the manifest"},
	} {
		writeManifest(c.m)
		for _, to := range []string{"hot", "warm"} {
			if code, out := promote("refused", to); code != http.StatusConflict || !strings.Contains(out, "does not match the fetcher's manifest") || !strings.Contains(out, c.want) {
				t.Errorf("%s, copy to %s: %d %s; want 409 naming %q", name, to, code, out, c.want)
			}
		}
		if got := tiers(); strings.Contains(got, `"refused"`) {
			t.Errorf("%s: a refused copy was placed: %s", name, got)
		}
	}

	writeManifest(fetch.Manifest{Version: 1, Complete: true, Verified: true, Files: []fetch.ManifestFile{file}})
	// The earlier releases' lowercase spelling, as an old client sends it.
	for _, to := range []string{"warm", "hot"} {
		code, out := promote("chat-model", to)
		if code != http.StatusOK {
			t.Fatalf("copy of the manifest's file to %s: %d %s", to, code, out)
		}
		var e nodeapi.Entry
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatal(err)
		}
		if e.Bytes != int64(len(model)) || e.Tier != v1alpha1.ParseTier(to) || !strings.HasPrefix(e.Digest, "xxh3c:") || e.SHA256 != file.SHA256 {
			t.Errorf("copy to %s: entry %+v; want the model's %d bytes with the copy's own digest and the manifest's sha256 %s", to, e, len(model), file.SHA256)
		}
	}
}
