package arena

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// misaligned returns a slice of n bytes inside buf whose first byte's
// address is mis past a multiple of 64.
func misaligned(buf []byte, mis, n int) []byte {
	skew := int(uintptr(unsafe.Pointer(&buf[0])) % 64)
	off := (64 - skew + mis) % 64
	return buf[off : off+n]
}

// TestCopyChunkMatchesXXH3 checks that copyChunk (the fused copy and hash
// where the CPU has AVX2) and copyThenHash return xxh3.Hash of the source,
// copy it exactly, and write nothing outside the destination, for every
// length up to 5000 bytes (the short inputs, the long input's partial
// blocks and last stripe, the first few full blocks) and lengths around a
// chunk, with the source and the destination aligned (non-temporal
// stores) or not.
func TestCopyChunkMatchesXXH3(t *testing.T) {
	t.Logf("fused copy and hash: %v", fusedAvailable())
	rng := rand.New(rand.NewPCG(1, 2))
	srcBuf := make([]byte, 2*ChunkSize+2048)
	for i := range srcBuf {
		srcBuf[i] = byte(rng.Uint32())
	}
	dstBuf := make([]byte, len(srcBuf))
	const guard = 0xa5

	lengths := make([]int, 0, 5200)
	for n := range 5001 {
		lengths = append(lengths, n)
	}
	for _, base := range []int{8 << 10, 64 << 10, ChunkSize, 2 * ChunkSize} {
		for _, d := range []int{-1025, -1024, -1023, -65, -64, -63, -1, 0, 1, 63, 64, 65, 1023, 1024, 1025} {
			lengths = append(lengths, base+d)
		}
	}
	lengths = append(lengths, 12345, 99999, 777777)
	alignments := []struct{ src, dst int }{{0, 0}, {0, 32}, {5, 0}, {0, 1}, {7, 13}, {33, 31}}
	ways := []struct {
		name string
		f    func(dst, src []byte) uint64
	}{{"copyChunk", copyChunk}, {"copyThenHash", copyThenHash}}

	for _, w := range ways {
		for _, a := range alignments {
			t.Run(fmt.Sprintf("%s/src%%64=%d/dst%%64=%d", w.name, a.src, a.dst), func(t *testing.T) {
				for _, n := range lengths {
					src := misaligned(srcBuf, a.src, n)
					region := dstBuf[:n+192] // the destination and 64 bytes or more either side
					for i := range region {
						region[i] = guard
					}
					dst := misaligned(region[64:], a.dst, n)
					got := w.f(dst, src)
					if want := xxh3.Hash(src); got != want {
						t.Fatalf("%d bytes: digest %#016x, want xxh3.Hash %#016x", n, got, want)
					}
					if !bytes.Equal(dst, src) {
						t.Fatalf("%d bytes: the copy differs from its source", n)
					}
					start := int(uintptr(unsafe.Pointer(unsafe.SliceData(dst))) - uintptr(unsafe.Pointer(&dstBuf[0])))
					for i, c := range region {
						if (i < start || i >= start+n) && c != guard {
							t.Fatalf("%d bytes: byte %d outside the destination [%d, %d) was written", n, i, start, start+n)
						}
					}
				}
			})
		}
	}
}
