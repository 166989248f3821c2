package nodeagent_test

import (
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

// TestPromoteReadsTheModelFileFromTheSidecar: an agent that does not
// mount the model cache (a ReadWriteOnce claim: only the engine's pod
// does) copies the model file from the engine's sidecar, which serves it
// from its read-only mount of the cache with the release's caller token.
// The copy is placed, hot and warm, with the manifest's sha256; a cache
// file whose bytes no longer match the manifest (one byte flipped, same
// size), a manifest that is not complete, a sidecar that refuses the
// agent's token, and a sidecar address that is not a pod's are refused,
// and nothing is placed. The sidecar hands nothing out without the token.
func TestPromoteReadsTheModelFileFromTheSidecar(t *testing.T) {
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cache, "gguf"), 0o755); err != nil {
		t.Fatal(err)
	}
	model := bytes.Repeat([]byte("GGUF\x03\x00\x00\x00weights "), 100_000)
	modelPath := filepath.Join(cache, "gguf", "model.gguf")
	if err := os.WriteFile(modelPath, model, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(model)
	file := fetch.ManifestFile{Path: "gguf/model.gguf", Size: int64(len(model)), SHA256: hex.EncodeToString(sum[:])}
	writeManifest := func(m fetch.Manifest) {
		t.Helper()
		b, _ := json.Marshal(m)
		p := fetch.ManifestPath(cache)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeManifest(fetch.Manifest{Version: 1, Complete: true, Verified: true, Files: []fetch.ManifestFile{file}})

	tokens := t.TempDir()
	token := func(name, value string) nodeapi.TokenFile {
		p := filepath.Join(tokens, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return nodeapi.TokenFile(p)
	}
	release := token("release", "the-release-token")
	side := httptest.NewServer(sidecar.ModelFilesHandler(cache, "gguf/model.gguf", release))
	defer side.Close()
	other := httptest.NewServer(sidecar.ModelFilesHandler(cache, "gguf/model.gguf", token("other", "another-release")))
	defer other.Close()

	_, srv := serveNode(t, nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 8 << 20, Warm: 8 << 20}, Namespace: "ns",
		},
		RuntimeVersion: "containerd://1.6.20", CallerTokenFile: string(release),
	})
	promote := func(name, to, sidecarURL string) (int, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"namespace": "ns", "name": name, "to": to, "sidecar": sidecarURL})
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/promote", bytes.NewReader(body))
		nodeapi.Authorize(req, "the-release-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	placed := func() string {
		t.Helper()
		resp, err := http.Get(srv.URL + "/tiers")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// The sidecar's files are the release's: no token, no bytes.
	for _, p := range []string{"/model/files", "/model/files/model.gguf"} {
		resp, err := http.Get(side.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the caller token: %d, want 401", p, resp.StatusCode)
		}
	}

	for _, to := range []string{"Hot", "Warm"} {
		code, out := promote("chat-model", to, side.URL)
		if code != http.StatusOK {
			t.Fatalf("copy to %s from the sidecar: %d %s", to, code, out)
		}
		var e nodeapi.Entry
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatal(err)
		}
		if e.Bytes != int64(len(model)) || string(e.Tier) != to || e.SHA256 != file.SHA256 || !strings.HasPrefix(e.Digest, "xxh3c:") {
			t.Errorf("copy to %s: %+v; want the model's %d bytes with the manifest's sha256 %s", to, e, len(model), file.SHA256)
		}
	}

	refused := map[string]struct {
		sidecar string
		prepare func()
		status  int
		want    string
	}{
		"a sidecar that refuses the agent's token": {other.URL, nil, http.StatusBadGateway, "answered 401"},
		"a sidecar address that is a name":         {"http://localhost:1", nil, http.StatusBadRequest, "must be http://"},
		"a manifest that is not complete": {side.URL, func() {
			writeManifest(fetch.Manifest{Version: 1, Complete: false, Files: []fetch.ManifestFile{file}})
		}, http.StatusConflict, "not complete"},
		"a cache file whose bytes are not the manifest's": {side.URL, func() {
			writeManifest(fetch.Manifest{Version: 1, Complete: true, Verified: true, Files: []fetch.ManifestFile{file}})
			bad := bytes.Clone(model)
			bad[len(bad)/2] ^= 0xff
			if err := os.WriteFile(modelPath, bad, 0o644); err != nil {
				t.Fatal(err)
			}
		}, http.StatusConflict, "the manifest says " + file.SHA256},
	}
	for _, name := range []string{"a sidecar that refuses the agent's token", "a sidecar address that is a name", "a manifest that is not complete", "a cache file whose bytes are not the manifest's"} {
		c := refused[name]
		if c.prepare != nil {
			c.prepare()
		}
		for _, to := range []string{"Hot", "Warm"} {
			if code, out := promote("refused", to, c.sidecar); code != c.status || !strings.Contains(out, c.want) {
				t.Errorf("%s, copy to %s: %d %s; want %d naming %q", name, to, code, out, c.status, c.want)
			}
		}
		if got := placed(); strings.Contains(got, `"refused"`) {
			t.Errorf("%s: a refused copy was placed: %s", name, got)
		}
	}
	if code, out := promote("refused", "Hot", side.URL+"/x"); code != http.StatusBadRequest {
		t.Errorf("a sidecar URL with a path: %d %s, want 400", code, out)
	}
	if code, out := promote("refused", "Hot", ""); code != http.StatusNotFound {
		t.Errorf("a promotion naming no source for a key no tier holds: %d %s, want 404", code, out)
	}
}
