package arena

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FileOptions tune FillFile and ReadFile.
type FileOptions struct {
	// Direct opens the file with O_DIRECT, bypassing the page cache, when
	// the filesystem supports it (tmpfs does not: it is read from memory,
	// as Method says).
	Direct bool
	// Method is how a file not read with O_DIRECT gets into the arena.
	Method ReadMethod
	// Workers read disjoint chunks (blocks, with O_DIRECT) at once and
	// hash each right after reading it (0: DefaultWorkers, or
	// DirectWorkers with O_DIRECT). In an arena that is not pre-faulted
	// each worker faults its block in before reading into it, so one gets
	// memory from the kernel while the other copies.
	Workers int
	// Consume punches each block out of the file once it is in the arena:
	// the file is a one-shot copy (the level-1 offload a wake removes
	// anyway), and the pages it frees are the ones the next blocks of the
	// arena fault in, so a restore never holds the weights twice and takes
	// recently used pages rather than pages the hypervisor may have taken
	// back. If the fill fails or the bytes do not verify, the blocks are
	// written back, so the file is whole again. Needs Expect.
	Consume bool
	// Remove unlinks the file once its bytes are in the arena and
	// verified (the level-1 offload a wake no longer needs). The kernel
	// frees its pages at the last close, which runs in the background
	// after FillFile returns, so the caller does not wait for it. Needs
	// Expect.
	Remove bool
	// Expect, when set, is the digest the bytes must have: FillFile
	// returns a *MismatchError otherwise.
	Expect *Digest
}

// ReadMethod chooses how FillFile reads a file that lives in memory (a
// tmpfs, or the page cache).
type ReadMethod int

const (
	// ReadAuto maps files whose pages are huge (a tmpfs mounted with
	// huge=, which reports 2 MiB blocks in stat) and preads the others.
	// Mapping a huge-paged file with MAP_POPULATE installs one page
	// table entry per 2 MiB (about a millisecond per GiB), after which
	// the copy out of it runs at memcpy speed, about twice as fast as
	// pread's copy out of the same tmpfs. A file in 4 KiB pages needs a
	// mapping entry per 4 KiB, and populating it costs more than pread
	// saves.
	ReadAuto ReadMethod = iota
	// ReadPread always reads with pread(2).
	ReadPread
	// ReadMapped always maps the file (populated, read-only, shared) and
	// copies out of the mapping; where mapping fails it preads.
	ReadMapped
)

// hugeBlock is the st_blksize a tmpfs reports for a file it backs with
// huge pages (HPAGE_PMD_SIZE on x86-64 and arm64 with 4 KiB pages).
const hugeBlock = 2 << 20

// DirectWorkers is the number of parallel O_DIRECT readers: a disk serves
// several requests at once, and each reader hashes the block it just read
// while its request is not in flight. Eight keep a virtual or NVMe disk's
// queue full; the readers wait on the device, not on a core, so more
// readers than cores cost nothing.
const DirectWorkers = 8

// DefaultWorkers is the number of parallel readers: two where there are
// two cores (one more reader gains nothing once memory bandwidth is the
// bound, and the hasher needs a core too).
func DefaultWorkers() int { return max(1, min(2, runtime.GOMAXPROCS(0))) }

// FillFile reads the file at path into a, which must be exactly as large as
// the file, and returns the digest of its bytes.
func FillFile(a *Arena, path string, opts FileOptions) (Digest, FillStats, error) {
	return fillFile(a, path, opts, true)
}

// ReadFile is FillFile without hashing: the raw read, with the same
// blocks and workers, that FillFile is measured against.
func ReadFile(a *Arena, path string, opts FileOptions) (FillStats, error) {
	opts.Consume, opts.Expect = false, nil
	_, st, err := fillFile(a, path, opts, false)
	return st, err
}

// fileReader reads blocks of one file at given offsets.
type fileReader struct {
	path     string
	direct   *os.File // O_DIRECT, or nil
	buffered *os.File
	// mapped is the whole file, mapped read-only and populated, or nil.
	mapped []byte
}

// mapFile maps a file for reading; tests replace it to make it fail.
var mapFile = func(fd, n int) ([]byte, error) {
	return unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// mapIfWorth maps the file when method asks for it or, with ReadAuto, when
// its pages are huge. A file that cannot be mapped is read with pread.
func (r *fileReader) mapIfWorth(method ReadMethod, fi os.FileInfo) {
	if r.direct != nil || method == ReadPread || fi.Size() == 0 || int64(int(fi.Size())) != fi.Size() {
		return
	}
	if method == ReadAuto {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Blksize < hugeBlock {
			return
		}
	}
	if m, err := mapFile(int(r.buffered.Fd()), int(fi.Size())); err == nil {
		r.mapped = m
	}
}

func openReader(path string, direct, write bool) (*fileReader, error) {
	flags := os.O_RDONLY
	if write {
		flags = os.O_RDWR
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, err
	}
	r := &fileReader{path: path, buffered: f}
	if direct {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC|unix.O_DIRECT, 0)
		switch {
		case err == nil:
			r.direct = os.NewFile(uintptr(fd), path)
		case !errors.Is(err, unix.EINVAL):
			_ = f.Close()
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
	return r, nil
}

func (r *fileReader) Close() {
	if r.mapped != nil {
		_ = unix.Munmap(r.mapped) // unmapping a mapping we made cannot fail
		r.mapped = nil
	}
	if r.direct != nil {
		_ = r.direct.Close()
	}
	_ = r.buffered.Close()
}

// copyAt fills b from the mapping at off and returns how many bytes it
// copied: fewer than len(b) where the file ends. With sums, off is a
// multiple of ChunkSize and each chunk is hashed as copyChunk does, its
// digest in sums. A file truncated after it was mapped faults on access to
// its missing pages (SIGBUS): the fault becomes an error rather than a
// crash.
func (r *fileReader) copyAt(b []byte, off int64, sums []uint64) (n int, err error) {
	if off >= int64(len(r.mapped)) {
		return 0, nil
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			n, err = 0, fmt.Errorf("the mapped file changed under the read at offset %d: %v", off, p)
		}
	}()
	src := r.mapped[off:]
	src = src[:min(len(b), len(src))]
	if sums == nil {
		return copy(b, src), nil
	}
	for c := 0; c < len(src); c += ChunkSize {
		e := min(c+ChunkSize, len(src))
		sums[c/ChunkSize] = copyChunk(b[c:e], src[c:e])
	}
	return len(src), nil
}

// read fills b from off, out of the mapping if there is one. With sums,
// off is a multiple of ChunkSize and sums gets the digest of each chunk of
// b, hashed while it is in the core's registers or cache: as it is copied
// out of the mapping into b (copyChunk), or in b right after a read put it
// there.
func (r *fileReader) read(b []byte, off int64, sums []uint64) (int, error) {
	if r.mapped != nil {
		return r.copyAt(b, off, sums)
	}
	m, err := r.readAt(b, off)
	if err == nil && sums != nil {
		for c := 0; c < m; c += ChunkSize {
			sums[c/ChunkSize] = chunkSum(b[c:min(c+ChunkSize, m)])
		}
	}
	return m, err
}

// readAt fills b from off until b is full or the file ends. O_DIRECT needs
// aligned offsets and lengths: b starts aligned (blocks are multiples of
// directAlign in a page-aligned mapping), and an unaligned remainder (the
// file's tail, or after a short read) is read through the page cache.
func (r *fileReader) readAt(b []byte, off int64) (int, error) {
	done := 0
	for done < len(b) {
		f, chunk := r.buffered, b[done:]
		if r.direct != nil && done%directAlign == 0 {
			f = r.direct
			if rest := len(chunk) &^ (directAlign - 1); rest > 0 {
				chunk = chunk[:rest]
			} else {
				f = r.buffered
			}
		}
		m, err := f.ReadAt(chunk, off+int64(done))
		done += m
		if errors.Is(err, io.EOF) {
			return done, nil
		}
		if err != nil {
			return done, err
		}
		if m == 0 {
			return done, nil
		}
	}
	return done, nil
}

func fillFile(a *Arena, path string, opts FileOptions, hash bool) (d Digest, st FillStats, err error) {
	if (opts.Consume || opts.Remove) && opts.Expect == nil {
		return 0, FillStats{}, errors.New("consuming or removing a file needs the digest it must verify to")
	}
	// The mapping, where the file is mapped, is part of the copy's time.
	start := time.Now()
	r, err := openReader(path, opts.Direct, opts.Consume)
	if err != nil {
		return 0, FillStats{}, err
	}
	background := false
	defer func() {
		if background {
			// The last close of an unlinked file frees its pages: let
			// the kernel do that while the caller goes on.
			go r.Close()
			return
		}
		r.Close()
	}()
	fi, err := r.buffered.Stat()
	if err != nil {
		return 0, FillStats{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if fi.Size() != a.Len() {
		return 0, FillStats{}, fmt.Errorf("%s holds %d bytes, want %d", path, fi.Size(), a.Len())
	}
	r.mapIfWorth(opts.Method, fi)
	n := int(a.Len())
	// A read from memory (tmpfs, the page cache) is one chunk, hashed
	// right after, while the chunk is in the reading core's cache. A read
	// from a disk (O_DIRECT) is a larger block: the device wants large
	// requests, and its bytes arrive by DMA, not through the cache.
	unit := ChunkSize
	if r.direct != nil {
		unit = BlockSize
	} else if opts.Consume {
		// A hole punched through part of a huge page must split the
		// page, which fails while another worker still reads its other
		// part (the kernel then only zeroes the range and the page
		// stays): a consuming fill frees whole, aligned huge pages.
		unit = hugeBlock
	}
	units := (n + unit - 1) / unit
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers()
		if r.direct != nil {
			workers = DirectWorkers
		}
	}
	workers = max(1, min(workers, units))
	st = FillStats{Direct: r.direct != nil, Mapped: r.mapped != nil, Workers: workers, Faulted: !a.faulted}
	if n == 0 {
		return Sum(nil), st, nil
	}

	abort := make(chan struct{})
	var once sync.Once
	var firstErr error
	fail := func(err error) {
		once.Do(func() { firstErr = err; close(abort) })
	}
	sums := make([]uint64, chunks(n)) // each written by the chunk's worker
	consumed := make([]bool, units)   // likewise
	Parallel(units, workers, func(i int) {
		select {
		case <-abort:
			return
		default:
		}
		off := i * unit
		end := min(off+unit, n)
		// The mapping is page-rounded: the O_DIRECT read of the
		// tail may use the rest of the last page.
		buf := a.full[off:min(off+unit, len(a.full))]
		if !a.faulted {
			if err := populate(buf); err != nil {
				fail(fmt.Errorf("faulting in block %d of the arena: %w", i, err))
				return
			}
		}
		var unitSums []uint64
		if hash {
			unitSums = sums[off/ChunkSize:]
		}
		m, err := r.read(buf[:end-off], int64(off), unitSums)
		if err == nil && m < end-off {
			err = fmt.Errorf("source ended after %d of %d bytes", off+m, n)
		}
		if err != nil {
			fail(fmt.Errorf("reading %s: %w", path, err))
			return
		}
		if opts.Consume {
			if err := unix.Fallocate(int(r.buffered.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(end-off)); err != nil {
				fail(fmt.Errorf("releasing block %d of %s: %w", i, path, err))
				return
			}
			consumed[i] = true
		}
	})
	copied := time.Now()
	if hash && firstErr == nil {
		d = combine(sums)
	}
	if firstErr == nil {
		st.Bytes = int64(n)
		a.faulted = true
		if opts.Expect != nil && d != *opts.Expect {
			firstErr = &MismatchError{Source: path, Want: *opts.Expect, Got: d, Bytes: int64(n)}
		}
	}
	st.Copy, st.Verify = copied.Sub(start), time.Since(copied)
	if firstErr != nil && opts.Consume {
		if err := writeBack(r.buffered, a.full[:n], consumed, unit); err != nil {
			firstErr = fmt.Errorf("%w; writing the consumed blocks back to %s also failed, the copy is lost: %w", firstErr, path, err)
		}
	}
	if firstErr == nil && opts.Remove {
		if err := os.Remove(path); err != nil {
			return d, st, fmt.Errorf("removing %s after restoring it: %w", path, err)
		}
		background = true
	}
	return d, st, firstErr
}

// writeBack restores the consumed blocks of a failed fill into the file.
func writeBack(f *os.File, b []byte, consumed []bool, unit int) error {
	for i, c := range consumed {
		if !c {
			continue
		}
		off := i * unit
		if _, err := f.WriteAt(b[off:min(off+unit, len(b))], int64(off)); err != nil {
			return err
		}
	}
	return nil
}
