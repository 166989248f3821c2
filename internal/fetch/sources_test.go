package fetch

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/s3test"
)

func TestHTTPSSingleFile(t *testing.T) {
	body := ggufBytes(fetchtest.Random(2<<20+99, 41))
	var stats fetchtest.Stats
	var faults fetchtest.Faults
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/models/tiny.gguf":
			fetchtest.ServeContent(w, r, "tiny.gguf", fetchtest.Bytes(body), &faults, &stats)
		case "/redirect/tiny.gguf":
			http.Redirect(w, r, "/models/tiny.gguf", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	sum := fetchtest.SHA256(fetchtest.Bytes(body))

	t.Run("with expected sha256 through a redirect", func(t *testing.T) {
		cfg := testConfig(t, srv.URL+"/redirect/tiny.gguf", "")
		cfg.SHA256 = sum
		cfg.Format = FormatGGUF
		faults.DropNext(1, 300<<10)
		res, err := runFetch(t, cfg, Options{})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		assertTree(t, cfg.Dest, map[string][]byte{"tiny.gguf": body})
		if faults.Pending() != 0 {
			t.Errorf("injected drop never reached")
		}
		if res.TotalBytes != int64(len(body)) {
			t.Errorf("TotalBytes = %d", res.TotalBytes)
		}
		stats.Reset()
		if res, err := runFetch(t, cfg, Options{}); err != nil || !res.CacheHit || stats.Requests("") != 0 || stats.BytesServed() != 0 {
			t.Errorf("re-run: err=%v cacheHit=%v served=%d, want a cache hit without network", err, res != nil && res.CacheHit, stats.BytesServed())
		}
	})
	t.Run("without sha256 records the computed one", func(t *testing.T) {
		cfg := testConfig(t, srv.URL+"/models/tiny.gguf", "")
		if _, err := runFetch(t, cfg, Options{}); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if m := mustManifest(t, cfg.Dest); m.Files[0].SHA256 != sum {
			t.Errorf("manifest sha256 = %s, want %s", m.Files[0].SHA256, sum)
		}
	})
	t.Run("wrong sha256", func(t *testing.T) {
		cfg := testConfig(t, srv.URL+"/models/tiny.gguf", "")
		cfg.SHA256 = strings.Repeat("0", 64)
		_, err := runFetch(t, cfg, Options{})
		if !errors.Is(err, ErrVerification) || !strings.Contains(err.Error(), "tiny.gguf") {
			t.Fatalf("err = %v, want a verification error naming tiny.gguf", err)
		}
		if _, err := os.Stat(filepath.Join(cfg.Dest, "tiny.gguf")); !os.IsNotExist(err) {
			t.Errorf("unverified file published")
		}
	})
	t.Run("not found", func(t *testing.T) {
		cfg := testConfig(t, srv.URL+"/models/missing.gguf", "")
		if _, err := runFetch(t, cfg, Options{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	})
}

func TestS3Prefix(t *testing.T) {
	s3 := s3test.New("AKTEST")
	t.Cleanup(s3.Close)
	s3.MaxKeys = 2 // paginated listing
	files := map[string][]byte{
		"model.safetensors":    safetensorsBytes(fetchtest.Random(2<<20+5, 51)),
		"config.json":          []byte(`{"a":1}`),
		"tokenizer/tok.json":   []byte(`{"t":true}`),
		"tokenizer/merges.txt": []byte("a b\n"),
	}
	for k, v := range files {
		s3.Put("models", "llama/v1/"+k, fetchtest.Bytes(v))
	}
	s3.Put("models", "llama/v2/other.bin", fetchtest.Bytes([]byte("not selected")))
	keyDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(keyDir, "access"), []byte("AKTEST\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keyDir, "secret"), []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s3cfg := func(t *testing.T, src string) Config {
		cfg := testConfig(t, src, "")
		cfg.S3Endpoint = s3.URL()
		cfg.S3AccessKeyFile = filepath.Join(keyDir, "access")
		cfg.S3SecretKeyFile = filepath.Join(keyDir, "secret")
		return cfg
	}

	t.Run("download with retries", func(t *testing.T) {
		cfg := s3cfg(t, "s3://models/llama/v1")
		cfg.Format = FormatSafetensors
		s3.Faults.FailNext(2, http.StatusInternalServerError)
		if _, err := runFetch(t, cfg, Options{}); err != nil {
			t.Fatalf("Run: %v", err)
		}
		assertTree(t, cfg.Dest, files)
		if n := s3.Faults.Pending(); n != 0 {
			t.Errorf("%d injected failures never reached", n)
		}
		m := mustManifest(t, cfg.Dest)
		for _, f := range m.Files {
			if f.ETag == "" || f.SHA256 != fetchtest.SHA256(fetchtest.Bytes(files[f.Path])) {
				t.Errorf("manifest entry %+v lacks etag or has a wrong sha256", f)
			}
		}
		s3.Stats.Reset()
		if res, err := runFetch(t, cfg, Options{}); err != nil || !res.CacheHit || s3.Stats.Requests("") != 0 {
			t.Errorf("re-run: err=%v, %d requests, want a cache hit without network", err, s3.Stats.Requests(""))
		}
	})
	t.Run("credentials from env", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", "AKTEST")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
		cfg := testConfig(t, "s3://models/llama/v1/tokenizer", "")
		cfg.S3Endpoint = s3.URL()
		if _, err := runFetch(t, cfg, Options{}); err != nil {
			t.Fatalf("Run: %v", err)
		}
		assertTree(t, cfg.Dest, map[string][]byte{"tok.json": files["tokenizer/tok.json"], "merges.txt": files["tokenizer/merges.txt"]})
	})
	t.Run("wrong access key", func(t *testing.T) {
		t.Setenv("AWS_ACCESS_KEY_ID", "AKWRONG")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "x")
		cfg := testConfig(t, "s3://models/llama/v1", "")
		cfg.S3Endpoint = s3.URL()
		cfg.S3Region = "us-east-1"
		_, err := runFetch(t, cfg, Options{})
		if !errors.Is(err, ErrAccessDenied) || ExitCode(err) != ExitBadInput {
			t.Fatalf("err = %v, want ErrAccessDenied", err)
		}
	})
	t.Run("empty prefix", func(t *testing.T) {
		cfg := s3cfg(t, "s3://models/nothing-here")
		if _, err := runFetch(t, cfg, Options{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	})
}

func writeModelDir(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPreConvertedIsVerifiedInPlace(t *testing.T) {
	files := map[string][]byte{
		"model.m":     fetchtest.Random(300<<10, 61),
		"tokenizer.t": []byte("tokens"),
	}
	dir := filepath.Join(t.TempDir(), "model")
	writeModelDir(t, dir, files)

	cfg := Default()
	cfg.PreConverted, cfg.Dest, cfg.Format = true, dir, FormatDllama
	res, err := runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("first verification: %v", err)
	}
	if res.Files != 2 || res.TotalBytes != totalSize(files) {
		t.Errorf("result = %+v, want 2 files / %d bytes", res, totalSize(files))
	}
	if m := mustManifest(t, dir); !m.Complete || len(m.Files) != 2 || m.Files[0].SHA256 == "" {
		t.Errorf("recorded manifest = %+v", m)
	}

	// Same size, different bytes: caught by the recorded sha256.
	b := append([]byte(nil), files["model.m"]...)
	b[1000] ^= 0xff
	if err := os.WriteFile(filepath.Join(dir, "model.m"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrVerification) || !strings.Contains(err.Error(), "model.m") || ExitCode(err) != ExitVerification {
		t.Fatalf("err = %v, want a verification error naming model.m", err)
	}

	if err := os.Remove(filepath.Join(dir, "model.m")); err != nil {
		t.Fatal(err)
	}
	if _, err := runFetch(t, cfg, Options{}); !errors.Is(err, ErrVerification) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("err = %v, want a verification error for the missing file", err)
	}
}

func TestPVCSourceUsesClaimMount(t *testing.T) {
	root := t.TempDir()
	files := map[string][]byte{"w.gguf": ggufBytes([]byte("weights"))}
	writeModelDir(t, filepath.Join(root, "shared-models", "llama", "q4"), files)
	cfg := Default()
	cfg.Source, cfg.PVCRoot, cfg.Format = "pvc://shared-models/llama/q4", root, FormatGGUF
	res, err := runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.TotalBytes != totalSize(files) || res.Dir != filepath.Join(root, "shared-models", "llama", "q4") {
		t.Errorf("result = %+v", res)
	}
	cfg.Source = "pvc://shared-models/absent"
	if _, err := runFetch(t, cfg, Options{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("absent path: err = %v, want ErrNotFound", err)
	}
}
