package nodeagent

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

func bw(what, method string, n int64, d time.Duration) nodeapi.Bandwidth {
	return nodeapi.Bandwidth{What: what, Bytes: n, Seconds: d.Seconds(), BytesPerSecond: float64(n) / max(d.Seconds(), 1e-9), Method: method}
}

// MeasureMemcpy copies n bytes between two pre-faulted arenas in huge pages,
// the memory a restore lands in (a Device's region), with one goroutine and
// then with arena.DefaultWorkers goroutines copying disjoint blocks, and
// returns both (the same when there is one worker). The faster is the bound
// for any restore into memory: a restore that uses two cores is held to what
// two cores can copy.
func MeasureMemcpy(n int64) (single, parallel nodeapi.Bandwidth, err error) {
	src, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return single, parallel, err
	}
	defer src.Free()
	dst, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return single, parallel, err
	}
	defer dst.Free()
	arena.Synthesize(src.Bytes(), 1)
	single, parallel = MeasureMemcpyBetween(dst, src)
	return single, parallel, nil
}

// MeasureMemcpyBetween is MeasureMemcpy between two arenas the caller
// keeps (of the same size), so that repeated measurements copy between the
// same pages.
func MeasureMemcpyBetween(dst, src *arena.Arena) (single, parallel nodeapi.Bandwidth) {
	n := min(dst.Len(), src.Len())
	start := time.Now()
	copy(dst.Bytes(), src.Bytes())
	single = bw("memcpy", "copy, 1 thread", n, time.Since(start))
	workers := arena.DefaultWorkers()
	if workers == 1 {
		return single, single
	}
	start = time.Now()
	parallelCopy(dst.Bytes()[:n], src.Bytes()[:n], workers)
	parallel = bw("memcpy", fmt.Sprintf("copy, %d threads", workers), n, time.Since(start))
	return single, parallel
}

// Peak is the faster of two measurements of the same transfer.
func Peak(a, b nodeapi.Bandwidth) nodeapi.Bandwidth {
	if b.BytesPerSecond > a.BytesPerSecond {
		return b
	}
	return a
}

// parallelCopy copies src to dst in blocks on workers goroutines, each
// taking the next block as it is done with its last, as a restore's
// workers do (arena.Parallel).
func parallelCopy(dst, src []byte, workers int) {
	blocks := (len(src) + arena.BlockSize - 1) / arena.BlockSize
	arena.Parallel(blocks, workers, func(i int) {
		off := i * arena.BlockSize
		end := min(off+arena.BlockSize, len(src))
		copy(dst[off:end], src[off:end])
	})
}

// MeasureFault maps n bytes and faults them in, as a wake does with the
// memory it gave back at sleep: the rate at which the kernel (and, in a
// virtual machine, the hypervisor) hands out fresh memory.
func MeasureFault(n int64) (nodeapi.Bandwidth, error) {
	start := time.Now()
	a, err := arena.New(n, arena.Options{})
	if err != nil {
		return nodeapi.Bandwidth{}, err
	}
	d := time.Since(start)
	a.Free()
	return bw("fresh memory", "mmap + MADV_POPULATE_WRITE", n, d), nil
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
	// A name of its own: the agents of several namespaces probe the same
	// tier directories, each as pid 1 of its container.
	f, err := os.CreateTemp(dir, ".bandwidth-probe-*")
	if err != nil {
		return "", err
	}
	path := f.Name()
	_ = f.Close()
	if err := arena.WriteFile(path, a.Bytes(), true); err != nil {
		_ = os.Remove(path)
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

// MeasureRead writes a probe file of n bytes in dir and reads it into a
// pre-faulted arena in huge pages, the memory a restore lands in (a
// Device's region), as MeasureReadInto does.
func MeasureRead(what, dir string, n int64, opts arena.FileOptions) (nodeapi.Bandwidth, error) {
	path, err := WriteProbe(dir, n)
	if err != nil {
		return nodeapi.Bandwidth{}, fmt.Errorf("writing a %d-byte probe in %s: %w", n, dir, err)
	}
	defer func() { _ = os.Remove(path) }()
	a, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return nodeapi.Bandwidth{}, err
	}
	defer a.Free()
	return MeasureReadInto(a, what, path, opts)
}

// MeasureReadInto reads the file at path into a (pre-faulted, exactly the
// file's size) with the blocks and workers of a restore (opts.Workers, 0
// for the restore's), without hashing. With opts.Direct, O_DIRECT bypasses
// the page cache where the filesystem supports it; otherwise the file's
// pages are dropped from the cache first (tmpfs pages are the file itself
// and stay).
func MeasureReadInto(a *arena.Arena, what, path string, opts arena.FileOptions) (nodeapi.Bandwidth, error) {
	_ = DropCache(path)
	st, err := arena.ReadFile(a, path, opts)
	if err != nil {
		return nodeapi.Bandwidth{}, err
	}
	method := "pread"
	switch {
	case st.Direct:
		method = "O_DIRECT pread"
	case !isTmpfs(path):
		method = "pread after fadvise(DONTNEED)"
	}
	return bw(what, fmt.Sprintf("%s, %d MiB blocks, %d threads", method, arena.BlockSize>>20, st.Workers), st.Bytes, st.Copy), nil
}

func isTmpfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
