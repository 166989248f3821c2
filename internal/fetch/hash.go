package fetch

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
)

// fileHashers are the digests of one file: sha256, plus the git blob id
// (sha1 over "blob <size>\0" and the bytes) for small hub files.
type fileHashers struct {
	sha hash.Hash
	git hash.Hash
}

func (h *fileHashers) write(b []byte) {
	h.sha.Write(b) // hash.Hash writes never fail
	if h.git != nil {
		h.git.Write(b)
	}
}

// state is the serialized digests, as saved in the journal.
func (h *fileHashers) state() (sha, git []byte) {
	sha, _ = h.sha.(encoding.BinaryMarshaler).MarshalBinary() // the standard digests always marshal
	if h.git != nil {
		git, _ = h.git.(encoding.BinaryMarshaler).MarshalBinary()
	}
	return sha, git
}

// hashersFor builds the digests for ft, restored from its journal when it
// saved them; nil when verification is off. It resets ft.j.Hashed when the
// saved state is unusable.
func (d *downloader) hashersFor(ft *fileTask) *fileHashers {
	if !d.cfg.VerifySHA256 {
		return nil
	}
	h := &fileHashers{sha: sha256.New()}
	if ft.rf.SHA256 == "" && ft.rf.GitOID != "" {
		h.git = sha1.New()
	}
	if ft.j.Hashed > 0 && len(ft.j.SHAState) > 0 {
		ok := h.sha.(encoding.BinaryUnmarshaler).UnmarshalBinary(ft.j.SHAState) == nil
		if h.git != nil {
			ok = ok && len(ft.j.GitState) > 0 && h.git.(encoding.BinaryUnmarshaler).UnmarshalBinary(ft.j.GitState) == nil
		}
		if ok {
			return h
		}
		h.sha.Reset()
		if h.git != nil {
			h.git.Reset()
		}
	}
	ft.j.Hashed, ft.j.SHAState, ft.j.GitState = 0, nil, nil
	if h.git != nil {
		_, _ = fmt.Fprintf(h.git, "blob %d\x00", ft.rf.Size) // hash.Hash writes never fail
	}
	return h
}

// liveQueue is how many network buffers may wait for the hasher of one
// file. The worker writing at the hash frontier waits when the queue is
// full: hashing is then the bottleneck, and reading those bytes back later
// would only add work.
const liveQueue = 8

// hashStream folds one file into its digests in file order while it
// downloads, on its own goroutine so that hashing one file overlaps
// receiving the others. The range being written at the hash frontier hands
// each buffer over right after writing it, so those bytes are hashed from
// memory and never read again; bytes written ahead of the frontier (by the
// other ranges of the file, or a run before a restart) are read back from
// the partial file, normally from the page cache, when the frontier gets
// there.
type hashStream struct {
	ft      *fileTask
	h       *fileHashers
	release func(*[]byte) // takes back a handed-over buffer
	moved   func()        // called after each step forward

	// Guarded by ft.mu.
	hashed  int64      // bytes folded into h
	fed     int64      // hashed + bytes being read back or queued
	queue   []liveBuf  // handed-over buffers at [fed-queued, fed), in order
	snaps   []hashSnap // states at chunk boundaries, oldest first
	stopped bool       // run returned: take no more buffers
	space   *sync.Cond // the queue shrank or the hasher stopped

	ready    chan struct{} // a buffer was queued or bytes were written
	readBack int64         // bytes read back from the file; only run touches it
}

// liveBuf is n bytes at off of a worker's buffer, already written.
type liveBuf struct {
	off int64
	n   int
	bp  *[]byte
}

// hashSnap is the digest state after the first chunks of the file.
type hashSnap struct {
	chunks   int
	sha, git []byte
}

func newHashStream(ft *fileTask, h *fileHashers, release func(*[]byte), moved func()) *hashStream {
	start := int64(ft.j.Hashed) * ft.chunkSize
	return &hashStream{ft: ft, h: h, release: release, moved: moved, hashed: start, fed: start,
		space: sync.NewCond(&ft.mu), ready: make(chan struct{}, 1)}
}

// offer is called by a worker, with ft.mu held, after it wrote n bytes of
// *bp at off and before it counts them as written. When those bytes are
// the next ones the hasher needs it takes the buffer, waiting for room in
// the queue, and returns true: the worker must then use another buffer.
func (hs *hashStream) offer(off int64, bp *[]byte, n int) bool {
	for off == hs.fed && len(hs.queue) >= liveQueue && !hs.stopped {
		hs.space.Wait()
	}
	if off != hs.fed || hs.stopped {
		return false
	}
	hs.fed += int64(n)
	hs.queue = append(hs.queue, liveBuf{off: off, n: n, bp: bp})
	hs.wake()
	return true
}

// wake makes a waiting hasher look for work again.
func (hs *hashStream) wake() {
	select {
	case hs.ready <- struct{}{}:
	default:
	}
}

// run hashes the whole file, then returns. It only stops early on a read
// error or when ctx ends.
func (hs *hashStream) run(ctx context.Context) (err error) {
	ft := hs.ft
	defer func() {
		ft.mu.Lock()
		hs.stopped = true
		hs.space.Broadcast()
		ft.mu.Unlock()
	}()
	var buf []byte // for reading back when the file cannot be mapped
	for {
		ft.mu.Lock()
		if hs.hashed == ft.rf.Size {
			ft.mu.Unlock()
			return nil
		}
		if len(hs.queue) > 0 {
			lb := hs.queue[0]
			hs.queue = hs.queue[1:]
			hs.space.Broadcast()
			ft.mu.Unlock()
			hs.h.write((*lb.bp)[:lb.n])
			hs.release(lb.bp)
			hs.advance(lb.off + int64(lb.n))
			continue
		}
		// Nothing queued: claim what is already written at the frontier (up
		// to the end of its chunk); buffers written after the claim queue
		// up behind it.
		start := hs.hashed
		c := int(start / ft.chunkSize)
		off, _ := ft.chunkRange(c)
		end := off + ft.written[c]
		hs.fed = max(hs.fed, end)
		ft.mu.Unlock()

		if end > start {
			if err := hs.readFile(start, end, &buf); err != nil {
				return err
			}
			hs.advance(end)
			continue
		}
		select {
		case <-hs.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// readFile hashes [start, end) of the partial file: through a memory
// map where the platform has one (no copy out of the page cache), else
// with pread into buf.
func (hs *hashStream) readFile(start, end int64, buf *[]byte) error {
	mapped, err := hashMapped(hs.ft.fh, start, end, hs.h.write)
	if errors.Is(err, errNoMap) {
		if *buf == nil {
			*buf = make([]byte, bufSize)
		}
		err = hashRead(hs.ft.fh, mapped, end, *buf, hs.h.write)
	}
	if err != nil {
		return fmt.Errorf("reading back %s: %w", hs.ft.rf.Path, err)
	}
	hs.readBack += end - start
	return nil
}

// errNoMap means the file cannot be memory-mapped; read it instead.
var errNoMap = errors.New("memory map unavailable")

// hashRead feeds [start, end) of f to write, read with pread into buf.
func hashRead(f *os.File, start, end int64, buf []byte, write func([]byte)) error {
	for off := start; off < end; {
		n := min(int64(len(buf)), end-off)
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		write(buf[:n])
		off += n
	}
	return nil
}

// advance records that the digests now cover [0, to), keeping their state
// when to ends a chunk so the journal can save it.
func (hs *hashStream) advance(to int64) {
	ft := hs.ft
	var snap *hashSnap
	if to%ft.chunkSize == 0 || to == ft.rf.Size {
		sha, git := hs.h.state()
		snap = &hashSnap{chunks: int((to + ft.chunkSize - 1) / ft.chunkSize), sha: sha, git: git}
	}
	ft.mu.Lock()
	hs.hashed = to
	hs.fed = max(hs.fed, to)
	if snap != nil {
		hs.snaps = append(hs.snaps, *snap)
	}
	ft.mu.Unlock()
	hs.moved()
}

// saveable returns the newest digest state that covers only chunks in
// the first doneChunks chunks, dropping older ones; ok is false when
// there is none newer than what the journal has. Called with ft.mu held.
func (hs *hashStream) saveable(doneChunks int) (s hashSnap, ok bool) {
	i := 0
	for i < len(hs.snaps) && hs.snaps[i].chunks <= doneChunks {
		i++
	}
	if i == 0 {
		return hashSnap{}, false
	}
	s = hs.snaps[i-1]
	hs.snaps = hs.snaps[i:]
	return s, true
}

// hashFile returns the hex sha256 of the file at p, counting bytes into t.
func hashFile(ctx context.Context, p string, t *tracker) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }() // opened read-only
	h := sha256.New()
	buf := make([]byte, bufSize)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		n, err := f.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			if t != nil {
				t.add(int64(n))
			}
		}
		if err == io.EOF {
			return hex.EncodeToString(h.Sum(nil)), nil
		}
		if err != nil {
			return "", err
		}
	}
}
