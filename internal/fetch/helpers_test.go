package fetch

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
	"github.com/model-orchestra/operator/internal/polltest"
)

// repoFixture is a small model repository: LFS weights, a nested file and
// small git-stored files.
type repoFixture struct {
	id    string
	files map[string][]byte
	lfs   map[string]bool
}

func newRepoFixture(id string) *repoFixture {
	return &repoFixture{id: id, files: map[string][]byte{}, lfs: map[string]bool{}}
}

func (r *repoFixture) add(path string, content []byte, lfs bool) *repoFixture {
	r.files[path] = content
	r.lfs[path] = lfs
	return r
}

func (r *repoFixture) repo() *hubtest.Repo {
	hr := &hubtest.Repo{ID: r.id}
	for p, b := range r.files {
		hr.Files = append(hr.Files, hubtest.File{Path: p, Content: fetchtest.Bytes(b), LFS: r.lfs[p]})
	}
	return hr
}

// defaultFixture is ~3.6 MiB: two multi-chunk LFS files, one small LFS
// file in a subdirectory, and git-stored json/text files.
func defaultFixture() *repoFixture {
	return newRepoFixture("acme/tiny-llm").
		add("model-00001-of-00002.safetensors", safetensorsBytes(fetchtest.Random(2<<20+12345, 1)), true).
		add("model-00002-of-00002.safetensors", safetensorsBytes(fetchtest.Random(1<<20+1, 2)), true).
		add("gguf/tiny-q4.gguf", ggufBytes(fetchtest.Random(300<<10, 3)), true).
		add("config.json", []byte(`{"architectures":["LlamaForCausalLM"],"hidden_size":64}`), false).
		add("tokenizer/vocab.txt", []byte("hello\nworld\n"), false).
		add("README.md", []byte("# tiny\n"), false)
}

func safetensorsBytes(payload []byte) []byte {
	hdr := []byte(`{"__metadata__":{"format":"pt"}}`)
	b := make([]byte, 8, 8+len(hdr)+len(payload))
	b[0] = byte(len(hdr))
	b = append(b, hdr...)
	return append(b, payload...)
}

func ggufBytes(payload []byte) []byte {
	return append([]byte{'G', 'G', 'U', 'F', 3, 0, 0, 0}, payload...)
}

func startHub(t *testing.T, fixtures ...*repoFixture) *hubtest.Server {
	t.Helper()
	var repos []*hubtest.Repo
	for _, f := range fixtures {
		repos = append(repos, f.repo())
	}
	s := hubtest.New(repos...)
	t.Cleanup(s.Close)
	return s
}

// testConfig is a fast configuration: small chunks, short timeouts.
func testConfig(t *testing.T, source, hubURL string) Config {
	t.Helper()
	c := Default()
	c.Source = source
	c.Dest = filepath.Join(t.TempDir(), "cache")
	c.HFEndpoint = hubURL
	c.Concurrency = 4
	c.ChunkSize = 1 << 20
	c.MaxAttempts = 5
	c.RequestTimeout = 5 * time.Second
	c.StallTimeout = 2 * time.Second
	c.BackoffBase = 5 * time.Millisecond
	c.BackoffMax = 50 * time.Millisecond
	c.MinFreeBytes = 0
	c.ProgressInterval = 50 * time.Millisecond
	return c
}

// logBuffer captures the run's log so a failing test shows it.
func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	var buf bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fetch log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(&syncWriter{w: &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func runFetch(t *testing.T, cfg Config, opts Options) (*Result, error) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return Run(ctx, cfg, opts)
}

// readTree returns every file under dir except the cache metadata.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if rel == metaDir {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	return out
}

func assertTree(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	got := readTree(t, dir)
	if len(got) != len(want) {
		t.Errorf("cache holds %v, want %v", keys(got), keys(want))
	}
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s missing from cache", p)
		} else if !bytes.Equal(g, w) {
			t.Errorf("%s has wrong content (%d bytes, want %d)", p, len(g), len(w))
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func subset(m map[string][]byte, names ...string) map[string][]byte {
	out := map[string][]byte{}
	for _, n := range names {
		out[n] = m[n]
	}
	return out
}

func mustManifest(t *testing.T, dir string) *Manifest {
	t.Helper()
	m, err := ReadManifest(dir)
	if err != nil || m == nil {
		t.Fatalf("manifest of %s: %v (nil=%v)", dir, err, m == nil)
	}
	return m
}

func totalSize(files map[string][]byte) int64 {
	var n int64
	for _, b := range files {
		n += int64(len(b))
	}
	return n
}

func decodeStatus(t *testing.T, s string) Status {
	t.Helper()
	var st Status
	if err := json.Unmarshal([]byte(s), &st); err != nil {
		t.Fatalf("progress.json %q: %v", s, err)
	}
	return st
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func newBufLogger(b *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(&syncWriter{w: b}, nil))
}

// eventually polls f every 5 ms until it passes (polltest.Eventually): the
// interval is short because the waits here race a download on loopback.
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, 5*time.Millisecond, f)
}
