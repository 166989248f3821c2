package arena

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// ChunkSize is the unit of the digest: every 1 MiB chunk of an artifact is
// hashed on its own, as it is copied, by whichever core copies it, so the
// cores that copy also verify.
const ChunkSize = 1 << 20

// Digest is the content hash of a weights artifact: XXH3-64 over the
// little-endian XXH3-64 digests of its 1 MiB chunks, in order (the last
// chunk may be shorter; an empty artifact has no chunks). Chunks hash in
// parallel and as they are copied, so verification needs no separate pass
// once the copy is done. XXH3 runs at about twice xxHash64's speed;
// it detects corruption, it is not a signature (the fetcher checks the
// model's sha256 when it downloads it).
type Digest uint64

const digestPrefix = "xxh3c:"

// String formats d as "xxh3c:<16 hex digits>" (c for chunked).
func (d Digest) String() string { return fmt.Sprintf("%s%016x", digestPrefix, uint64(d)) }

// ParseDigest parses the String form.
func ParseDigest(s string) (Digest, error) {
	hex, ok := strings.CutPrefix(s, digestPrefix)
	if !ok || len(hex) != 16 {
		return 0, fmt.Errorf("digest %q is not of the form %s<16 hex digits>", s, digestPrefix)
	}
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("digest %q: %w", s, err)
	}
	return Digest(v), nil
}

// ErrMismatch is returned when restored bytes do not hash to the digest
// recorded when they were stored.
var ErrMismatch = errors.New("content hash mismatch")

// MismatchError reports which bytes failed verification.
type MismatchError struct {
	Source    string
	Want, Got Digest
	Bytes     int64
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%v: %d bytes from %s hash to %s, want %s", ErrMismatch, e.Bytes, e.Source, e.Got, e.Want)
}

// Unwrap makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// chunkSum hashes one chunk.
func chunkSum(b []byte) uint64 { return xxh3.Hash(b) }

// chunks is how many chunks n bytes have.
func chunks(n int) int { return (n + ChunkSize - 1) / ChunkSize }

// combine is the artifact digest of its chunk digests.
func combine(sums []uint64) Digest {
	b := make([]byte, 8*len(sums))
	for i, s := range sums {
		binary.LittleEndian.PutUint64(b[8*i:], s)
	}
	return Digest(xxh3.Hash(b))
}

// copyThenHash copies src into dst (as long) and returns xxh3.Hash(src),
// hashing src right after the copy read it: the way copyChunk takes where
// the fused pass is not available (no AVX2, not amd64, or the purego build
// tag) and for inputs too short for it. Go's copy of 1 MiB writes dst with
// non-temporal stores, which leave nothing in the cache, but its reads
// leave src there: the hash reads it from the cache, so each byte crosses
// the memory bus once in and once out, as in a plain copy. Hashing dst
// instead reads every byte from memory a second time. What the hash reads
// is what the copy read a moment before: a byte of the file that changes
// during the copy makes the digest differ; a byte corrupted on its way into
// dst does not.
func copyThenHash(dst, src []byte) uint64 {
	copy(dst, src)
	return chunkSum(src)
}

// eachChunk calls f with every chunk of n bytes, its index and its bounds,
// on DefaultWorkers goroutines (Parallel).
func eachChunk(n int, f func(i, off, end int)) {
	Parallel(chunks(n), DefaultWorkers(), func(i int) { f(i, i*ChunkSize, min((i+1)*ChunkSize, n)) })
}

// Parallel calls f with every index in [0, units) on up to workers
// goroutines, each taking the next index as soon as it is done with its
// last, and returns when every call has. A core that is busy elsewhere,
// or that the hypervisor takes away for a while, delays only the unit it
// holds: the other workers take the rest. With one unit or one worker, f
// runs on the caller's goroutine.
func Parallel(units, workers int, f func(i int)) {
	workers = max(1, min(workers, units))
	if workers == 1 {
		for i := range units {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < units; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// Sum hashes b, its chunks on DefaultWorkers cores.
func Sum(b []byte) Digest {
	sums := make([]uint64, chunks(len(b)))
	eachChunk(len(b), func(i, off, end int) { sums[i] = chunkSum(b[off:end]) })
	return combine(sums)
}

// VerifiedCopy copies src into dst, which must be as long, on
// DefaultWorkers cores each taking the next chunk (Parallel), each hashed on its way
// as FillFile hashes the chunks it copies out of a mapped file, and
// returns the digest of the bytes copied.
func VerifiedCopy(dst, src []byte) Digest {
	sums := make([]uint64, chunks(len(src)))
	eachChunk(len(src), func(i, off, end int) { sums[i] = copyChunk(dst[off:end], src[off:end]) })
	return combine(sums)
}

// Hasher computes a Digest over a stream written to it in any pieces.
type Hasher struct {
	cur  *xxh3.Hasher
	n    int // bytes in the current chunk
	sums []uint64
}

// NewHasher returns an empty Hasher.
func NewHasher() *Hasher { return &Hasher{cur: xxh3.New()} }

// Write implements io.Writer; it never fails.
func (h *Hasher) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		take := min(len(p), ChunkSize-h.n)
		if h.n == 0 && take == ChunkSize {
			h.sums = append(h.sums, chunkSum(p[:take])) // a whole chunk at once
		} else {
			_, _ = h.cur.Write(p[:take])
			h.n += take
			if h.n == ChunkSize {
				h.sums = append(h.sums, h.cur.Sum64())
				h.cur.Reset()
				h.n = 0
			}
		}
		p = p[take:]
	}
	return total, nil
}

// Sum is the digest of everything written so far.
func (h *Hasher) Sum() Digest {
	sums := h.sums
	if h.n > 0 {
		sums = append(sums[:len(sums):len(sums)], h.cur.Sum64())
	}
	return combine(sums)
}
