// Package fetchtest holds what the fake hub and the fake S3 server share:
// file contents (real or generated), byte-range serving with injected faults,
// and counters of what was served, so tests can assert on network use.
package fetchtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Content is the body of one served file.
type Content interface {
	io.ReaderAt
	Size() int64
}

// Bytes serves b.
func Bytes(b []byte) Content { return bytesContent(b) }

type bytesContent []byte

func (b bytesContent) Size() int64 { return int64(len(b)) }
func (b bytesContent) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Random returns n deterministic pseudo-random bytes for seed.
func Random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n - n%8; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Synthetic is a large deterministic file generated on the fly from a
// pseudo-random block (a prime number of bytes long, so the pattern does
// not line up with chunks). It costs no disk and little memory.
func Synthetic(size int64, seed uint64) Content {
	return &synthetic{size: size, block: Random(1<<20+7, seed)}
}

type synthetic struct {
	size  int64
	block []byte
}

func (s *synthetic) Size() int64 { return s.size }
func (s *synthetic) ReadAt(p []byte, off int64) (int, error) {
	if off >= s.size {
		return 0, io.EOF
	}
	want := min(int64(len(p)), s.size-off)
	n := 0
	for int64(n) < want {
		i := (off + int64(n)) % int64(len(s.block))
		n += copy(p[n:want], s.block[i:])
	}
	if int64(n) < int64(len(p)) {
		return n, io.EOF
	}
	return n, nil
}

// File serves a file from disk.
func File(path string) (Content, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close() // opened read-only
		return nil, err
	}
	return &fileContent{f: f, path: path, size: fi.Size()}, nil
}

type fileContent struct {
	f    *os.File
	path string
	size int64
}

// section opens the file again for one response, positioned at off and
// limited to n bytes: an *os.File behind an io.LimitedReader is what
// net/http sends with sendfile(2), so the bytes go from the page cache to
// the socket without passing through the server process.
func (f *fileContent) section(off, n int64) (io.Reader, func(), error) {
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, nil, err
	}
	if _, err := fh.Seek(off, io.SeekStart); err != nil {
		_ = fh.Close() // opened read-only
		return nil, nil, err
	}
	return io.LimitReader(fh, n), func() { _ = fh.Close() }, nil // opened read-only
}

func (f *fileContent) Size() int64                             { return f.size }
func (f *fileContent) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }

// SHA256 hashes c.
func SHA256(c Content) string {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(c, 0, c.Size())); err != nil {
		panic(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Segment is a run of bytes actually written to a client.
type Segment struct {
	Path  string
	Start int64
	N     int64
}

// Faults are injected into content responses, each consumed by the next
// matching request. The zero value injects nothing.
type Faults struct {
	mu sync.Mutex
	// failures: next n requests answer status.
	failN      int
	failStatus int
	// drops: next n responses are cut after dropAfter bytes.
	dropN     int
	dropAfter int64
	// stalls: next n responses send stallAfter bytes then hang.
	stallN     int
	stallAfter int64
	// delayPer slows every write of a chunk (throttling).
	throttle time.Duration
}

// FailNext makes the next n content requests answer status (e.g. 503).
func (f *Faults) FailNext(n, status int) {
	f.mu.Lock()
	f.failN, f.failStatus = n, status
	f.mu.Unlock()
}

// DropNext cuts the connection of the next n responses after the given
// number of body bytes.
func (f *Faults) DropNext(n int, after int64) {
	f.mu.Lock()
	f.dropN, f.dropAfter = n, after
	f.mu.Unlock()
}

// StallNext makes the next n responses send `after` bytes, then nothing
// until the client gives up.
func (f *Faults) StallNext(n int, after int64) {
	f.mu.Lock()
	f.stallN, f.stallAfter = n, after
	f.mu.Unlock()
}

// Throttle sleeps d after every 64 KiB written to any client.
func (f *Faults) Throttle(d time.Duration) {
	f.mu.Lock()
	f.throttle = d
	f.mu.Unlock()
}

// Pending is how many injected faults have not been used yet.
func (f *Faults) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failN + f.dropN + f.stallN
}

type plan struct {
	status     int
	dropAfter  int64 // -1 none
	stallAfter int64 // -1 none
	throttle   time.Duration
}

func (f *Faults) next() plan {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := plan{dropAfter: -1, stallAfter: -1, throttle: f.throttle}
	switch {
	case f.failN > 0:
		f.failN--
		p.status = f.failStatus
	case f.dropN > 0:
		f.dropN--
		p.dropAfter = f.dropAfter
	case f.stallN > 0:
		f.stallN--
		p.stallAfter = f.stallAfter
	}
	return p
}

// Stats counts requests and served bytes.
type Stats struct {
	mu       sync.Mutex
	requests map[string]int
	segments []Segment
	bytes    int64
}

// Count records one request of the given kind ("api", "content", ...).
func (s *Stats) Count(kind string) {
	s.mu.Lock()
	if s.requests == nil {
		s.requests = map[string]int{}
	}
	s.requests[kind]++
	s.mu.Unlock()
}

// Requests returns how many requests of kind were made ("" for all).
func (s *Stats) Requests(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if kind == "" {
		n := 0
		for _, v := range s.requests {
			n += v
		}
		return n
	}
	return s.requests[kind]
}

// BytesServed is the total content bytes written to clients.
func (s *Stats) BytesServed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Segments returns every served run of bytes.
func (s *Stats) Segments() []Segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Segment(nil), s.segments...)
}

// Reset forgets everything counted so far.
func (s *Stats) Reset() {
	s.mu.Lock()
	s.requests, s.segments, s.bytes = nil, nil, 0
	s.mu.Unlock()
}

func (s *Stats) served(path string, start, n int64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.segments = append(s.segments, Segment{Path: path, Start: start, N: n})
	s.mu.Unlock()
}

func (s *Stats) addBytes(n int64) {
	s.mu.Lock()
	s.bytes += n
	s.mu.Unlock()
}

// ParseRange reads a single "bytes=a-b", "bytes=a-" or "bytes=-n" range.
func ParseRange(h string, size int64) (start, end int64, ok bool) {
	spec, found := strings.CutPrefix(h, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	a, b, found := strings.Cut(spec, "-")
	if !found {
		return 0, 0, false
	}
	if a == "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false
		}
		return max(0, size-n), size, true
	}
	s, err := strconv.ParseInt(a, 10, 64)
	if err != nil || s < 0 || s >= size {
		return 0, 0, false
	}
	e := size
	if b != "" {
		v, err := strconv.ParseInt(b, 10, 64)
		if err != nil || v < s {
			return 0, 0, false
		}
		e = min(v+1, size)
	}
	return s, e, true
}

// ServeContent answers a GET or HEAD for c with Range support, applying the
// next fault plan and counting what is written. Headers already set on w
// (ETag, ...) are kept.
func ServeContent(w http.ResponseWriter, r *http.Request, name string, c Content, faults *Faults, stats *Stats) {
	p := faults.next()
	if p.status != 0 {
		http.Error(w, "injected failure", p.status)
		return
	}
	size := c.Size()
	start, end := int64(0), size
	status := http.StatusOK
	w.Header().Set("Accept-Ranges", "bytes")
	if rh := r.Header.Get("Range"); rh != "" && size > 0 {
		s, e, ok := ParseRange(rh, size)
		if !ok {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			http.Error(w, "invalid range", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		start, end, status = s, e, http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, size))
	}
	w.Header().Set("Content-Length", strconv.FormatInt(end-start, 10))
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	pos := start
	defer func() { stats.served(name, start, pos-start) }()
	if fc, ok := c.(*fileContent); ok && p.dropAfter < 0 && p.stallAfter < 0 && p.throttle == 0 {
		// No fault to inject: let the kernel send the file.
		src, done, err := fc.section(start, end-start)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		defer done()
		n, _ := io.Copy(w, src) // a short copy means the client is gone
		stats.addBytes(n)
		pos += n
		return
	}
	buf := make([]byte, 64<<10)
	flusher, _ := w.(http.Flusher)
	for pos < end {
		n := min(int64(len(buf)), end-pos)
		if p.dropAfter >= 0 {
			n = min(n, start+p.dropAfter-pos)
		}
		if p.stallAfter >= 0 {
			n = min(n, start+p.stallAfter-pos)
		}
		if n <= 0 {
			if flusher != nil {
				flusher.Flush()
			}
			if p.stallAfter >= 0 {
				<-r.Context().Done() // hang until the client aborts
			}
			panic(http.ErrAbortHandler) // cut the connection mid-body
		}
		if _, err := c.ReadAt(buf[:n], pos); err != nil && !errors.Is(err, io.EOF) {
			panic(http.ErrAbortHandler)
		}
		m, err := w.Write(buf[:n])
		stats.addBytes(int64(m))
		pos += int64(m)
		if err != nil {
			return
		}
		if p.throttle > 0 && pos < end {
			time.Sleep(p.throttle)
		}
	}
}
