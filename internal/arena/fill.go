package arena

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"
)

// BlockSize is the size of one read from a disk (O_DIRECT) and of one
// write: large enough that system calls and the device's per-request cost
// are noise. Reads from memory (tmpfs) go a chunk at a time, so the chunk
// is still in the CPU's cache when it is hashed.
const BlockSize = 8 << 20

// directAlign is the alignment O_DIRECT needs for offsets and lengths on
// every common block device (the logical block size is 512 or 4096).
const directAlign = 4096

// FillStats describes one Fill.
type FillStats struct {
	// Bytes read.
	Bytes int64
	// Copy is the time spent reading the bytes into memory, including
	// hashing each chunk right after it landed.
	Copy time.Duration
	// Verify is what was left after the copy: combining the chunk
	// digests and comparing (or, for Fill, the hashing still running).
	Verify time.Duration
	// Direct is true when the file was read with O_DIRECT (page cache
	// bypassed).
	Direct bool
	// Mapped is true when the file was mapped and copied out of the
	// mapping rather than read with pread.
	Mapped bool
	// Workers is how many blocks were read at once.
	Workers int
	// Faulted is true when the arena's pages were faulted in by the fill
	// (inside Copy) rather than before it.
	Faulted bool
}

// Total is the wall time of the fill.
func (s FillStats) Total() time.Duration { return s.Copy + s.Verify }

type span struct{ off, end int }

// Fill reads exactly len(dst) bytes from r into dst in BlockSize reads and
// returns their digest. Hashing runs in a second goroutine one block behind
// the reads.
func Fill(dst []byte, r io.Reader) (Digest, FillStats, error) {
	return fill(dst, len(dst), func(b []byte) (int, error) { return io.ReadFull(r, b) })
}

// fill reads n bytes into buf (len(buf) ≥ n) with read, and hashes buf[:n].
func fill(buf []byte, n int, read func([]byte) (int, error)) (Digest, FillStats, error) {
	start := time.Now()
	// Room for every block: the reader never waits for the hasher, so Copy
	// measures the read alone and Verify the hashing left after it.
	spans := make(chan span, len(buf)/BlockSize+2)
	sum := make(chan uint64, 1)
	go func() {
		h := NewHasher()
		for s := range spans {
			_, _ = h.Write(buf[s.off:s.end])
		}
		sum <- uint64(h.Sum())
	}()
	off := 0
	var err error
	for off < n {
		end := min(off+BlockSize, len(buf))
		var m int
		m, err = read(buf[off:end])
		if m > 0 {
			spans <- span{off, min(off+m, n)}
			off += m
		}
		if err != nil || m == 0 {
			break
		}
	}
	close(spans)
	copied := time.Now()
	d := Digest(<-sum)
	st := FillStats{Bytes: int64(min(off, n)), Copy: copied.Sub(start), Verify: time.Since(copied), Workers: 1}
	switch {
	case off >= n:
		return d, st, nil
	case err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return d, st, fmt.Errorf("source ended after %d of %d bytes", off, n)
	default:
		return d, st, err
	}
}

// open opens path for reading, with O_DIRECT when asked and supported.
func open(path string, direct bool) (*os.File, bool, error) {
	if direct {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECT, 0)
		if err == nil {
			return os.NewFile(uintptr(fd), path), true, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, false, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
	f, err := os.Open(path)
	return f, false, err
}

// HashFile streams the file at path through the hash, with O_DIRECT when
// direct, and returns its digest and size.
func HashFile(path string, direct bool) (Digest, int64, error) {
	f, _, err := open(path, direct)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	d, n, err := CopyHash(io.Discard, f)
	if err != nil {
		return 0, n, fmt.Errorf("hashing %s: %w", path, err)
	}
	return d, n, nil
}

// CopyHash copies src to dst in BlockSize blocks and returns the digest of
// the bytes copied.
func CopyHash(dst io.Writer, src io.Reader) (Digest, int64, error) {
	a, err := New(BlockSize, Options{Pages: PagesSmall})
	if err != nil {
		return 0, 0, err
	}
	defer a.Free()
	h := NewHasher()
	n, err := io.CopyBuffer(io.MultiWriter(dst, h), onlyReader{src}, a.Bytes())
	return h.Sum(), n, err
}

// onlyReader hides WriterTo/ReaderFrom so CopyBuffer uses the buffer.
type onlyReader struct{ io.Reader }

// writeHuge writes b into the empty file f through a shared mapping when f
// is on a tmpfs and b holds at least one huge page, and reports whether it
// did. A write() into a tmpfs allocates its pages without a mapping, so
// with the kernel's usual defrag=madvise it never compacts memory, and in
// fragmented memory most of a large file falls back to 4 KiB pages, which
// a restore then copies out of at a fraction of the speed. Pages faulted
// in through a mapping advised MADV_HUGEPAGE may compact. The mapping is
// populated for writing (MADV_POPULATE_WRITE) before the copy, so a full
// tmpfs is an error, not a SIGBUS. Without MADV_POPULATE_WRITE (kernels
// before 5.14) it leaves the write to the caller.
func writeHuge(f *os.File, b []byte) (bool, error) {
	var st unix.Statfs_t
	if len(b) < hugeBlock || unix.Fstatfs(int(f.Fd()), &st) != nil || st.Type != unix.TMPFS_MAGIC {
		return false, nil
	}
	if err := f.Truncate(int64(len(b))); err != nil {
		return true, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, len(b), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return false, nil // the caller writes over the sized file
	}
	defer func() { _ = unix.Munmap(m) }()
	_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
	if err := unix.Madvise(m, unix.MADV_POPULATE_WRITE); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false, nil
		}
		return true, fmt.Errorf("reserving %d bytes in the tmpfs (full, or out of memory): %w", len(b), err)
	}
	return true, copyIntoMapping(m, b)
}

// copyIntoMapping copies b into the populated mapping m; a page taken away
// meanwhile (the file truncated by someone else) is an error, not a crash.
func copyIntoMapping(m, b []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the file changed under the write: %v", p)
		}
	}()
	for off := 0; off < len(b); off += ChunkSize {
		copy(m[off:min(off+ChunkSize, len(b))], b[off:])
	}
	return nil
}

// WriteFile writes b to path atomically (a temporary file in the same
// directory, renamed into place) with mode 0600. With sync it fsyncs the file
// and the directory, for tiers that must survive a crash of the node.
func WriteFile(path string, b []byte, sync bool) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating a temporary file in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod %s: %w", f.Name(), err)
	}
	mapped, err := writeHuge(f, b)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if !mapped {
		if len(b) > 0 {
			_ = unix.Fallocate(int(f.Fd()), 0, 0, int64(len(b))) // best effort: fail early on a full disk
		}
		for off := 0; off < len(b); off += BlockSize {
			if _, err := f.Write(b[off:min(off+BlockSize, len(b))]); err != nil {
				return fmt.Errorf("writing %s: %w", path, err)
			}
		}
	}
	if sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("renaming into %s: %w", path, err)
	}
	if sync {
		if d, err := os.Open(dir); err == nil {
			_ = d.Sync()
			_ = d.Close()
		}
	}
	return nil
}
