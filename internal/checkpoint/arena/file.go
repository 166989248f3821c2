package arena

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// FileOptions tune FillFile and ReadFile.
type FileOptions struct {
	// Direct opens the file with O_DIRECT, bypassing the page cache, when
	// the filesystem supports it (tmpfs does not: it is read normally).
	Direct bool
	// Workers read disjoint chunks (blocks, with O_DIRECT) at once and
	// hash each right after reading it (0: DefaultWorkers). In an arena
	// that is not pre-faulted each worker faults its block in before
	// reading into it, so one gets memory from the kernel while the other
	// copies.
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
	if r.direct != nil {
		_ = r.direct.Close()
	}
	_ = r.buffered.Close()
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
	n := int(a.Len())
	// A read from memory (tmpfs, the page cache) is one chunk, hashed
	// right after, while the chunk is in the reading core's cache. A read
	// from a disk (O_DIRECT) is a larger block: the device wants large
	// requests, and its bytes arrive by DMA, not through the cache.
	unit := ChunkSize
	if r.direct != nil {
		unit = BlockSize
	}
	units := (n + unit - 1) / unit
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	workers = max(1, min(workers, units))
	st = FillStats{Direct: r.direct != nil, Workers: workers, Faulted: !a.faulted}
	if n == 0 {
		return Sum(nil), st, nil
	}

	start := time.Now()
	abort := make(chan struct{})
	var once sync.Once
	var firstErr error
	fail := func(err error) {
		once.Do(func() { firstErr = err; close(abort) })
	}
	sums := make([]uint64, chunks(n)) // each written by the chunk's worker
	consumed := make([]bool, units)   // likewise
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < units; i += workers {
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
				m, err := r.readAt(buf[:end-off], int64(off))
				if err == nil && m < end-off {
					err = fmt.Errorf("source ended after %d of %d bytes", off+m, n)
				}
				if err != nil {
					fail(fmt.Errorf("reading %s: %w", path, err))
					return
				}
				if hash {
					for c := off; c < end; c += ChunkSize {
						sums[c/ChunkSize] = chunkSum(a.full[c:min(c+ChunkSize, end)])
					}
				}
				if opts.Consume {
					if err := unix.Fallocate(int(r.buffered.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(end-off)); err != nil {
						fail(fmt.Errorf("releasing block %d of %s: %w", i, path, err))
						return
					}
					consumed[i] = true
				}
			}
		}()
	}
	wg.Wait()
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
