package fetchtest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// TestServeFileRanges serves a file from disk (sendfile when no fault is
// pending, the copy loop otherwise) and checks the bytes and counters.
func TestServeFileRanges(t *testing.T) {
	want := Random(3<<20+5, 1)
	p := filepath.Join(t.TempDir(), "w.bin")
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := File(p)
	if err != nil {
		t.Fatal(err)
	}
	var faults Faults
	var stats Stats
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ServeContent(w, r, "w.bin", c, &faults, &stats)
	}))
	defer srv.Close()
	get := func(start, end int64) ([]byte, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end-1))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusPartialContent {
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		return io.ReadAll(resp.Body)
	}

	for _, r := range [][2]int64{{0, 1}, {0, int64(len(want))}, {12345, 2<<20 + 77}, {int64(len(want)) - 10, int64(len(want))}} {
		got, err := get(r[0], r[1])
		if err != nil {
			t.Fatalf("bytes %d-%d: %v", r[0], r[1], err)
		}
		if !bytes.Equal(got, want[r[0]:r[1]]) {
			t.Errorf("bytes %d-%d: got %d bytes, not the file's", r[0], r[1], len(got))
		}
	}
	if n := int64(len(want)) + 1 + (2<<20 + 77 - 12345) + 10; stats.BytesServed() != n {
		t.Errorf("BytesServed = %d, want %d", stats.BytesServed(), n)
	}

	faults.DropNext(1, 1000)
	if got, err := get(0, 1<<20); err == nil || len(got) > 1000 || !bytes.Equal(got, want[:len(got)]) {
		t.Errorf("dropped response: %d bytes, err %v; want at most the first 1000 bytes and an error", len(got), err)
	}
}
