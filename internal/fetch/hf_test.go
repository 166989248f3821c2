package fetch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
)

func TestHFDownloadsWholeRepository(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	hub.PageSize = 2 // force a paginated listing
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.Format = FormatSafetensors

	res, err := runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if res.Files != len(fx.files) || res.TotalBytes != totalSize(fx.files) || res.Downloaded != totalSize(fx.files) {
		t.Errorf("result = %+v, want %d files / %d bytes downloaded", res, len(fx.files), totalSize(fx.files))
	}
	m := mustManifest(t, cfg.Dest)
	if !m.Complete || m.Source != "hf://acme/tiny-llm@main" || len(m.Revision) != 40 || m.TotalBytes != totalSize(fx.files) {
		t.Errorf("manifest = %+v", m)
	}
	for _, f := range m.Files {
		want := fetchtest.SHA256(fetchtest.Bytes(fx.files[f.Path]))
		if f.SHA256 != want || f.Size != int64(len(fx.files[f.Path])) {
			t.Errorf("manifest entry %s = %+v, want sha256 %s", f.Path, f, want)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.Dest, metaDir, partialDir)); !os.IsNotExist(err) {
		t.Errorf("partial directory left behind: %v", err)
	}
}

func TestHFIncludeExclude(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	tests := []struct {
		name             string
		include, exclude []string
		want             []string
	}{
		{"base-name glob", []string{"*.json"}, nil, []string{"config.json"}},
		{"path glob", []string{"gguf/*"}, nil, []string{"gguf/tiny-q4.gguf"}},
		{"several includes", []string{"*.safetensors", "config.json"}, nil,
			[]string{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}},
		{"exclude wins", []string{"*.safetensors"}, []string{"model-00002*"}, []string{"model-00001-of-00002.safetensors"}},
		{"exclude only", nil, []string{"*.safetensors", "*.gguf", "**/*.txt"}, []string{"README.md", "config.json"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
			cfg.Include, cfg.Exclude = tc.include, tc.exclude
			if _, err := runFetch(t, cfg, Options{}); err != nil {
				t.Fatalf("Run: %v", err)
			}
			assertTree(t, cfg.Dest, subset(fx.files, tc.want...))
		})
	}
	t.Run("nothing matches", func(t *testing.T) {
		cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
		cfg.Include = []string{"*.bin"}
		_, err := runFetch(t, cfg, Options{})
		if !errors.Is(err, ErrNotFound) || ExitCode(err) != ExitBadInput {
			t.Fatalf("err = %v, want ErrNotFound / exit %d", err, ExitBadInput)
		}
	})
}

func TestHFRerunOfCompleteCacheMakesNoRequests(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("first run: %v", err)
	}
	hub.Stats.Reset()
	start := time.Now()
	res, err := runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if n := hub.Stats.Requests(""); n != 0 {
		t.Errorf("second run made %d requests, want none", n)
	}
	if !res.CacheHit || res.Downloaded != 0 || res.TotalBytes != totalSize(fx.files) {
		t.Errorf("second run result = %+v, want a cache hit with %d bytes", res, totalSize(fx.files))
	}
	t.Logf("cache hit took %s", time.Since(start))

	// --refresh lists again but downloads nothing that is unchanged.
	cfg.Refresh = true
	hub.Stats.Reset()
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("refresh run: %v", err)
	}
	if n := hub.Stats.Requests("content") + hub.Stats.Requests("resolve"); n != 0 {
		t.Errorf("refresh run downloaded %d files again, want 0", n)
	}
	if hub.Stats.Requests("api") == 0 {
		t.Errorf("refresh run did not ask the hub")
	}

	// A file lost from the cache is fetched again, alone.
	if err := os.Remove(filepath.Join(cfg.Dest, "config.json")); err != nil {
		t.Fatal(err)
	}
	cfg.Refresh = false
	hub.Stats.Reset()
	res, err = runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("repair run: %v", err)
	}
	if res.Downloaded != int64(len(fx.files["config.json"])) {
		t.Errorf("repair run downloaded %d bytes, want only config.json (%d)", res.Downloaded, len(fx.files["config.json"]))
	}
	assertTree(t, cfg.Dest, fx.files)
}

func TestHFTokenAuth(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	hub.Token = "hf_secret"

	t.Run("missing token is access denied", func(t *testing.T) {
		cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
		_, err := runFetch(t, cfg, Options{})
		if !errors.Is(err, ErrAccessDenied) || ExitCode(err) != ExitBadInput {
			t.Fatalf("err = %v, want ErrAccessDenied / exit %d", err, ExitBadInput)
		}
		if !strings.Contains(err.Error(), "Invalid credentials") {
			t.Errorf("error %q does not carry the hub's explanation", err)
		}
	})
	t.Run("token file", func(t *testing.T) {
		cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
		cfg.TokenFile = filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(cfg.TokenFile, []byte("hf_secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// The CDN refuses requests that still carry the hub token, so this
		// also proves the token is not forwarded across the redirect.
		if _, err := runFetch(t, cfg, Options{}); err != nil {
			t.Fatalf("Run: %v", err)
		}
		assertTree(t, cfg.Dest, fx.files)
	})
	t.Run("token from HF_TOKEN", func(t *testing.T) {
		cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
		cfg.Include = []string{"config.json"}
		cfg.ApplyEnv(func(k string) string {
			return map[string]string{"HF_TOKEN": "hf_secret"}[k]
		})
		if _, err := runFetch(t, cfg, Options{}); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
}

func TestHFEndpointFromEnv(t *testing.T) {
	cfg := Default()
	cfg.ApplyEnv(func(k string) string { return map[string]string{"HF_ENDPOINT": "http://mirror:8080"}[k] })
	if cfg.HFEndpoint != "http://mirror:8080" {
		t.Errorf("HFEndpoint = %q, want the HF_ENDPOINT value", cfg.HFEndpoint)
	}
	cfg = Default()
	cfg.HFEndpoint = "http://flag:1"
	cfg.ApplyEnv(func(k string) string { return map[string]string{"HF_ENDPOINT": "http://mirror:8080"}[k] })
	if cfg.HFEndpoint != "http://flag:1" {
		t.Errorf("HFEndpoint = %q, want the flag to win over HF_ENDPOINT", cfg.HFEndpoint)
	}
}

func TestHFUnknownRepoOrRevision(t *testing.T) {
	hub := startHub(t, defaultFixture())
	for _, src := range []string{"hf://acme/nope", "hf://acme/tiny-llm@v9"} {
		cfg := testConfig(t, src, hub.URL())
		_, err := runFetch(t, cfg, Options{})
		if !errors.Is(err, ErrNotFound) || ExitCode(err) != ExitBadInput {
			t.Errorf("%s: err = %v, want ErrNotFound", src, err)
		}
	}
}

func TestHFRetriesThroughServerErrors(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	hub.Faults.FailNext(4, http.StatusServiceUnavailable)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if n := hub.Faults.Pending(); n != 0 {
		t.Errorf("%d injected failures never reached", n)
	}
}

func TestHFGivesUpWhenErrorsPersist(t *testing.T) {
	hub := startHub(t, defaultFixture())
	hub.Faults.FailNext(1000, http.StatusBadGateway)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.MaxAttempts = 3
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrGaveUp) || ExitCode(err) != ExitNetwork {
		t.Fatalf("err = %v, want ErrGaveUp / exit %d", err, ExitNetwork)
	}
	if got := readTree(t, cfg.Dest); len(got) != 0 {
		t.Errorf("files published despite failure: %v", keys(got))
	}
}

func TestHFResumesDroppedConnections(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	hub.Faults.DropNext(3, 200<<10)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if n := hub.Faults.Pending(); n != 0 {
		t.Errorf("%d injected drops never reached", n)
	}
	// Each retry continues where the dropped response stopped.
	if served, total := hub.Stats.BytesServed(), totalSize(fx.files); served > total+3*(64<<10) {
		t.Errorf("served %d bytes for %d: dropped ranges were fetched again from their start", served, total)
	}
}

func TestHFStallIsDetected(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	hub.Faults.StallNext(1, 100<<10)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.StallTimeout = 300 * time.Millisecond
	start := time.Now()
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if n := hub.Faults.Pending(); n != 0 {
		t.Errorf("injected stall never reached")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("stalled response held the run for %s", d)
	}

	t.Run("always stalling gives up", func(t *testing.T) {
		hub.Faults.StallNext(1000, 0)
		defer hub.Faults.StallNext(0, 0)
		cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
		cfg.StallTimeout = 100 * time.Millisecond
		cfg.MaxAttempts = 2
		cfg.Include = []string{"config.json"}
		_, err := runFetch(t, cfg, Options{})
		if !errors.Is(err, ErrGaveUp) || !strings.Contains(err.Error(), "stalled") {
			t.Fatalf("err = %v, want ErrGaveUp mentioning the stall", err)
		}
	})
}

func TestHFChecksumMismatchPublishesNothing(t *testing.T) {
	fx := defaultFixture()
	repo := fx.repo()
	for i := range repo.Files {
		if repo.Files[i].Path == "model-00002-of-00002.safetensors" {
			repo.Files[i].ListedSHA256 = strings.Repeat("ab", 32)
		}
	}
	hub := hubtest.New(repo)
	t.Cleanup(hub.Close)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.Include = []string{"*.safetensors"}
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrVerification) || ExitCode(err) != ExitVerification {
		t.Fatalf("err = %v, want ErrVerification / exit %d", err, ExitVerification)
	}
	if !strings.Contains(err.Error(), "model-00002-of-00002.safetensors") {
		t.Errorf("error %q does not name the file", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dest, "model-00002-of-00002.safetensors")); !os.IsNotExist(err) {
		t.Errorf("corrupt file visible under its final name (stat err %v)", err)
	}
	m := mustManifest(t, cfg.Dest)
	if m.Complete {
		t.Errorf("manifest marked complete after a verification failure")
	}
	if _, ok := m.file("model-00002-of-00002.safetensors"); ok {
		t.Errorf("manifest lists the corrupt file")
	}
}

func TestHFGitFileChecksumIsVerified(t *testing.T) {
	// A git-stored file whose bytes do not match the listed blob id.
	repo := &hubtest.Repo{ID: "acme/git-only", Files: []hubtest.File{
		{Path: "config.json", Content: fetchtest.Bytes([]byte(`{"a":1}`))},
	}}
	hub := hubtest.New(repo)
	t.Cleanup(hub.Close)
	repo.Files[0].Content = fetchtest.Bytes([]byte(`{"a":2}`)) // changed after hashing
	cfg := testConfig(t, "hf://acme/git-only", hub.URL())
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrVerification) || !strings.Contains(err.Error(), "config.json") {
		t.Fatalf("err = %v, want a verification error naming config.json", err)
	}
}

func TestHFNotEnoughSpace(t *testing.T) {
	// The listing claims a 1 PiB file: the real free-space check of the
	// cache filesystem must refuse before any byte is requested.
	repo := &hubtest.Repo{ID: "acme/huge", Files: []hubtest.File{
		{Path: "huge.gguf", Content: fetchtest.Synthetic(1<<50, 1), LFS: true, ListedSHA256: strings.Repeat("00", 32)},
	}}
	hub := hubtest.New(repo)
	t.Cleanup(hub.Close)
	cfg := testConfig(t, "hf://acme/huge", hub.URL())
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrNoSpace) || ExitCode(err) != ExitNoSpace {
		t.Fatalf("err = %v, want ErrNoSpace / exit %d", err, ExitNoSpace)
	}
	if !strings.Contains(err.Error(), "available") {
		t.Errorf("error %q does not say what is available", err)
	}
	if n := hub.Stats.Requests("content") + hub.Stats.Requests("resolve"); n != 0 {
		t.Errorf("%d download requests made before the space check failed", n)
	}

	t.Run("headroom counts", func(t *testing.T) {
		fx := defaultFixture()
		hub := startHub(t, fx)
		cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
		cfg.MinFreeBytes = 1 << 20
		free := totalSize(fx.files) + 512<<10 // fits, but not with 1 MiB headroom
		_, err := runFetch(t, cfg, Options{FreeBytes: func(string) (int64, error) { return free, nil }})
		if !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err = %v, want ErrNoSpace", err)
		}
		cfg.MinFreeBytes = 0
		if _, err := runFetch(t, cfg, Options{FreeBytes: func(string) (int64, error) { return free, nil }}); err != nil {
			t.Fatalf("without headroom: %v", err)
		}
	})
}

func TestHFFormatCheck(t *testing.T) {
	fx := defaultFixture().add("broken.gguf", []byte("NOPE0000rest"), true)
	hub := startHub(t, fx)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.Format = FormatGGUF
	cfg.Include = []string{"*.gguf"}
	_, err := runFetch(t, cfg, Options{})
	if !errors.Is(err, ErrVerification) || !strings.Contains(err.Error(), "broken.gguf") {
		t.Fatalf("err = %v, want a format error naming broken.gguf", err)
	}
	cfg.Exclude = []string{"broken.gguf"}
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("valid gguf only: %v", err)
	}
	got := keys(readTree(t, cfg.Dest))
	sort.Strings(got)
	if diff := cmp.Diff([]string{"gguf/tiny-q4.gguf"}, got); diff != "" {
		t.Errorf("cache (-want +got):\n%s", diff)
	}
}

func TestVerifiedIsReportedHonestly(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.VerifySHA256 = false
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if mustManifest(t, cfg.Dest).Verified {
		t.Errorf("manifest claims verification for an unverified download")
	}
	var last Status
	sink := sinkFunc(func(s Status) { last = s })
	cfg.VerifySHA256 = true
	if _, err := runFetch(t, cfg, Options{Sinks: []ProgressSink{sink}}); err != nil {
		t.Fatalf("cache hit: %v", err)
	}
	if last.Verified || last.Phase != PhaseComplete {
		t.Errorf("cache hit of an unverified download reported %+v", last)
	}
	cfg.VerifyExisting = true
	if _, err := runFetch(t, cfg, Options{Sinks: []ProgressSink{sink}}); err != nil {
		t.Fatalf("re-hash run: %v", err)
	}
	if !last.Verified {
		t.Errorf("re-hashed cache not reported verified: %+v", last)
	}
}

type sinkFunc func(Status)

func (f sinkFunc) Report(_ context.Context, s Status, final bool) error {
	if final {
		f(s)
	}
	return nil
}

func TestHFStalledListingIsRetried(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	stalls := 1
	var mu sync.Mutex
	// A proxy in front of the hub that hangs the first listing forever.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		stall := strings.Contains(r.URL.Path, "/tree/") && stalls > 0
		if stall {
			stalls--
		}
		mu.Unlock()
		if stall {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte("[")) // the client stalls on this; its errors don't matter
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		hub.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	hub.SetCDNBase(hub.URL())
	cfg := testConfig(t, "hf://acme/tiny-llm", proxy.URL)
	cfg.RequestTimeout = 50 * time.Millisecond
	cfg.Include = []string{"*.json"}
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	assertTree(t, cfg.Dest, subset(fx.files, "config.json"))
}

func TestVerifyExistingReplacesCorruptedFile(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Bit rot: same size, different bytes.
	p := filepath.Join(cfg.Dest, "model-00002-of-00002.safetensors")
	b, _ := os.ReadFile(p)
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}

	if res, err := runFetch(t, cfg, Options{}); err != nil || !res.CacheHit {
		t.Fatalf("plain re-run: %v (a size-only check cannot see bit rot)", err)
	}
	cfg.VerifyExisting = true
	res, err := runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("verify-existing run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if want := int64(len(fx.files["model-00002-of-00002.safetensors"])); res.Downloaded != want {
		t.Errorf("downloaded %d bytes, want only the corrupted file (%d)", res.Downloaded, want)
	}
}
