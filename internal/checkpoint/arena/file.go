package arena

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// FileOptions tune FillFile and ReadFile.
type FileOptions struct {
	// Direct opens the file with O_DIRECT, bypassing the page cache, when
	// the filesystem supports it (tmpfs does not: it is read normally).
	Direct bool
	// Workers read disjoint blocks at once (0: DefaultWorkers). Each worker
	// faults its block in before reading into it, so on a machine with two
	// cores one gets the next block's memory from the kernel while the
	// other copies.
	Workers int
	// Consume punches each block out of the file once it is in the arena:
	// the file is a one-shot copy (the level-1 offload a wake removes
	// anyway), and the pages it frees are the ones the next blocks of the
	// arena fault in, so a restore never holds the weights twice and takes
	// recently used pages rather than pages the hypervisor may have taken
	// back. If the fill fails or the bytes do not verify, the blocks are
	// written back, so the file is whole again. Needs Expect.
	Consume bool
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

func fillFile(a *Arena, path string, opts FileOptions, hash bool) (Digest, FillStats, error) {
	if opts.Consume && opts.Expect == nil {
		return 0, FillStats{}, errors.New("consuming a file needs the digest it must verify to")
	}
	r, err := openReader(path, opts.Direct, opts.Consume)
	if err != nil {
		return 0, FillStats{}, err
	}
	defer r.Close()
	fi, err := r.buffered.Stat()
	if err != nil {
		return 0, FillStats{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if fi.Size() != a.Len() {
		return 0, FillStats{}, fmt.Errorf("%s holds %d bytes, want %d", path, fi.Size(), a.Len())
	}
	n := int(a.Len())
	blocks := (n + BlockSize - 1) / BlockSize
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	workers = max(1, min(workers, blocks))
	st := FillStats{Direct: r.direct != nil, Workers: workers, Faulted: !a.faulted}
	if n == 0 {
		return Sum(nil), st, nil
	}

	start := time.Now()
	// ready[i] closes once block i is in the arena; abort stops everyone
	// at the first error.
	ready := make([]chan struct{}, blocks)
	for i := range ready {
		ready[i] = make(chan struct{})
	}
	abort := make(chan struct{})
	var once sync.Once
	var firstErr error
	fail := func(err error) {
		once.Do(func() { firstErr = err; close(abort) })
	}
	consumed := make([]bool, blocks) // written only by the block's worker
	sum := make(chan uint64, 1)
	go func() {
		h := xxhash.New()
		for i := range blocks {
			select {
			case <-ready[i]:
			case <-abort:
				sum <- 0
				return
			}
			if hash {
				_, _ = h.Write(a.full[i*BlockSize : min((i+1)*BlockSize, n)])
			}
		}
		sum <- h.Sum64()
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < blocks; i += workers {
				select {
				case <-abort:
					return
				default:
				}
				off := i * BlockSize
				end := min(off+BlockSize, n)
				// The mapping is page-rounded: the O_DIRECT read of the
				// tail may use the rest of the last page.
				buf := a.full[off:min(off+BlockSize, len(a.full))]
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
				if opts.Consume {
					if err := unix.Fallocate(int(r.buffered.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(end-off)); err != nil {
						fail(fmt.Errorf("releasing block %d of %s: %w", i, path, err))
						return
					}
					consumed[i] = true
				}
				close(ready[i])
			}
		}()
	}
	wg.Wait()
	copied := time.Now()
	d := Digest(<-sum)
	st.Copy, st.Verify = copied.Sub(start), time.Since(copied)
	if firstErr == nil {
		st.Bytes = int64(n)
		a.faulted = true
		if opts.Expect != nil && d != *opts.Expect {
			firstErr = &MismatchError{Source: path, Want: *opts.Expect, Got: d, Bytes: int64(n)}
		}
	}
	if firstErr != nil && opts.Consume {
		if err := writeBack(r.buffered, a.full[:n], consumed); err != nil {
			firstErr = fmt.Errorf("%w; writing the consumed blocks back to %s also failed, the copy is lost: %w", firstErr, path, err)
		}
	}
	return d, st, firstErr
}

// writeBack restores the consumed blocks of a failed fill into the file.
func writeBack(f *os.File, b []byte, consumed []bool) error {
	for i, c := range consumed {
		if !c {
			continue
		}
		off := i * BlockSize
		if _, err := f.WriteAt(b[off:min(off+BlockSize, len(b))], int64(off)); err != nil {
			return err
		}
	}
	return nil
}
