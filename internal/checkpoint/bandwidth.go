package checkpoint

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/checkpoint/arena"
)

// Bandwidth is one measured transfer.
type Bandwidth struct {
	// What was measured: memcpy, or a read from a tier directory.
	What           string  `json:"what"`
	Bytes          int64   `json:"bytes"`
	Seconds        float64 `json:"seconds"`
	BytesPerSecond float64 `json:"bytesPerSecond"`
	// Method: "copy", "read" (page cache or tmpfs), "O_DIRECT", or
	// "read after fadvise(DONTNEED)".
	Method string `json:"method"`
}

func bw(what, method string, n int64, d time.Duration) Bandwidth {
	return Bandwidth{What: what, Bytes: n, Seconds: d.Seconds(), BytesPerSecond: float64(n) / max(d.Seconds(), 1e-9), Method: method}
}

// MeasureMemcpy copies n bytes between two pre-faulted arenas: the bound for
// any restore into memory.
func MeasureMemcpy(n int64) (Bandwidth, error) {
	src, err := arena.New(n, arena.Options{})
	if err != nil {
		return Bandwidth{}, err
	}
	defer src.Free()
	dst, err := arena.New(n, arena.Options{})
	if err != nil {
		return Bandwidth{}, err
	}
	defer dst.Free()
	arena.Synthesize(src.Bytes(), 1)
	start := time.Now()
	copy(dst.Bytes(), src.Bytes())
	return bw("memcpy", "copy", n, time.Since(start)), nil
}

// MeasureMemcpyFresh copies n bytes into an arena it maps for the copy, and
// times both: the bound for a wake that gave its memory back while asleep
// and must get fresh pages from the kernel before it can copy into them.
func MeasureMemcpyFresh(n int64) (Bandwidth, error) {
	src, err := arena.New(n, arena.Options{})
	if err != nil {
		return Bandwidth{}, err
	}
	defer src.Free()
	arena.Synthesize(src.Bytes(), 2)
	start := time.Now()
	dst, err := arena.New(n, arena.Options{})
	if err != nil {
		return Bandwidth{}, err
	}
	copy(dst.Bytes(), src.Bytes())
	d := time.Since(start)
	dst.Free()
	return bw("memcpy into fresh memory", "mmap + pre-fault + copy", n, d), nil
}

// WriteProbe writes n synthetic bytes to a new file in dir and returns its
// path; the caller removes it.
func WriteProbe(dir string, n int64) (string, error) {
	a, err := arena.New(n, arena.Options{})
	if err != nil {
		return "", err
	}
	defer a.Free()
	arena.Synthesize(a.Bytes(), uint64(n))
	path := fmt.Sprintf("%s/.bandwidth-probe-%d", dir, os.Getpid())
	if err := arena.WriteFile(path, a.Bytes(), true); err != nil {
		return "", err
	}
	return path, nil
}

// DropCache asks the kernel to drop the file's clean pages from the page
// cache. Unlike writing /proc/sys/vm/drop_caches it needs no privilege and
// touches no other file.
func DropCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// MeasureRead reads a probe file of n bytes in dir into a pre-faulted
// arena. With direct, O_DIRECT bypasses the page cache where the
// filesystem supports it; otherwise the file's pages are dropped from the
// cache first (tmpfs pages are the file itself and stay).
func MeasureRead(what, dir string, n int64, direct bool) (Bandwidth, error) {
	path, err := WriteProbe(dir, n)
	if err != nil {
		return Bandwidth{}, fmt.Errorf("writing a %d-byte probe in %s: %w", n, dir, err)
	}
	defer func() { _ = os.Remove(path) }()
	return MeasureReadFile(what, path, direct)
}

// MeasureReadFile reads an existing file as MeasureRead does.
func MeasureReadFile(what, path string, direct bool) (Bandwidth, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Bandwidth{}, err
	}
	a, err := arena.New(fi.Size(), arena.Options{})
	if err != nil {
		return Bandwidth{}, err
	}
	defer a.Free()
	_ = DropCache(path)
	st, err := arena.ReadFile(a, path, direct)
	if err != nil {
		return Bandwidth{}, err
	}
	method := "read"
	switch {
	case st.Direct:
		method = "O_DIRECT"
	case !isTmpfs(path):
		method = "read after fadvise(DONTNEED)"
	}
	return bw(what, method, st.Bytes, st.Copy), nil
}

func isTmpfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
