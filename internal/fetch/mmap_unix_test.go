//go:build linux || darwin || freebsd

package fetch

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

// TestHashMappedFileTruncatedUnderneath checks that a partial file cut
// short while it is being read back fails the hash with an error instead
// of crashing the process with SIGBUS.
func TestHashMappedFileTruncatedUnderneath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.part")
	size := int64(4 * os.Getpagesize())
	if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()

	h := sha256.New()
	if got, err := hashMapped(f, 0, size, func(b []byte) { h.Write(b) }); err != nil || got != size {
		t.Fatalf("intact file: hashed to %d, err %v", got, err)
	}
	got, err := hashMapped(f, 0, size, func(b []byte) {
		if err := f.Truncate(0); err != nil {
			t.Error(err)
		}
		h.Write(b)
	})
	if err == nil {
		t.Fatalf("truncated file: hashed to %d without an error", got)
	}
	t.Logf("truncated file: %v", err)
}
