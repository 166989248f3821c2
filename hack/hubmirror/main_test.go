package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch/hubtest"
)

func TestMirrorServesDirectoryAsHub(t *testing.T) {
	root := t.TempDir()
	write := func(p string, n int) {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("demo/tiny/model.gguf", 10)
	write("demo/tiny/config.json", 5)
	write("demo/tiny/sub/big.txt", 1<<20)
	write("demo/tiny/.git/HEAD", 3)
	write("loose-file", 1)

	repos, err := loadRepos(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(repos) != 1 || repos[0].ID != "demo/tiny" || len(repos[0].Files) != 3 {
		t.Fatalf("repos = %+v, want demo/tiny with 3 files (hidden dirs skipped)", repos)
	}
	srv := &hubtest.Server{}
	srv.AddRepo(repos[0])
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	resp, err := http.Get(hs.URL + "/api/models/demo/tiny/tree/main?recursive=true")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var entries []struct {
		Type string `json:"type"`
		Path string `json:"path"`
		LFS  *struct {
			OID string `json:"oid"`
		} `json:"lfs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil {
		t.Fatal(err)
	}
	lfs := map[string]bool{}
	for _, e := range entries {
		if e.Type == "file" {
			lfs[e.Path] = e.LFS != nil
		}
	}
	want := map[string]bool{"model.gguf": true, "config.json": false, "sub/big.txt": true}
	for p, w := range want {
		if got, ok := lfs[p]; !ok || got != w {
			t.Errorf("%s: listed=%v lfs=%v, want lfs=%v", p, ok, got, w)
		}
	}

	// LFS files redirect to the mirror's own /cdn/ path and download.
	resp2, err := http.Get(hs.URL + "/demo/tiny/resolve/main/model.gguf")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp2.Body.Close() // only the status and length are checked
	if resp2.StatusCode != http.StatusOK || resp2.ContentLength != 10 {
		t.Errorf("download through the relative CDN redirect: %d, %d bytes", resp2.StatusCode, resp2.ContentLength)
	}
}

func TestMirrorServesAFileInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.gguf")
	if err := os.WriteFile(path, []byte("GGUF-of-mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	var files fileFlags
	if err := files.Set("local/my-model=" + path); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"my-model=" + path, "local/my-model", "a/b/c=" + path, "/x=" + path} {
		if err := files.Set(bad); err == nil {
			t.Errorf("--file %s accepted", bad)
		}
	}
	repo, err := fileRepo(files[0].repo, files[0].path)
	if err != nil {
		t.Fatal(err)
	}
	if repo.ID != "local/my-model" || len(repo.Files) != 1 || repo.Files[0].Path != "mine.gguf" || !repo.Files[0].LFS {
		t.Fatalf("repo = %+v, want local/my-model with mine.gguf as LFS", repo)
	}
	if _, err := fileRepo("local/x", filepath.Dir(path)); err == nil {
		t.Error("a directory was accepted as a file")
	}
	srv := &hubtest.Server{}
	srv.AddRepo(repo)
	srv.SetCDNBase("")
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/local/my-model/resolve/main/mine.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len("GGUF-of-mine")) {
		t.Errorf("download: %d, %d bytes", resp.StatusCode, resp.ContentLength)
	}
}
