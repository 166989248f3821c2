//go:build amd64 && !purego

package arena

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// fused is whether copyChunk copies and hashes a chunk in one pass; the
// pass needs AVX2.
var fused = cpu.X86.HasAVX2

// copyChunk copies src, at most one chunk, into dst (as long) and returns
// the chunk's digest, xxh3.Hash(src). With AVX2 it reads each byte once:
// copyHashLong loads each 64-byte stripe of src into registers, stores it
// to dst and hashes the same registers, so the hash costs no second read
// and the copy runs as close to a plain copy's bandwidth as the hash's
// arithmetic lets it. What is hashed is exactly what was stored: a byte of
// the file that changes during the copy makes the digest differ; a byte
// corrupted between the registers and memory does not. Inputs too short for XXH3's stripe loop (240
// bytes or less) are copied, then hashed.
func copyChunk(dst, src []byte) uint64 {
	if !fused || len(src) <= xxh3MidMax {
		return copyThenHash(dst, src)
	}
	return copyHashLong(dst, src)
}

// XXH3-64 with the default secret and seed 0, for inputs longer than
// xxh3MidMax bytes (the spec's "long input"): the input is cut into 64-byte
// stripes, 16 to a 1 KiB block; an accumulator of eight 64-bit lanes takes
// each stripe with the secret shifted 8 bytes further per stripe, and is
// scrambled after each block.
const (
	xxh3MidMax  = 240
	xxh3Stripe  = 64
	xxh3Block   = 1024
	prime32_1   = 0x9E3779B1
	prime32_2   = 0x85EBCA77
	prime32_3   = 0xC2B2AE3D
	prime64_1   = 0x9E3779B185EBCA87
	prime64_2   = 0xC2B2AE3D27D4EB4F
	prime64_3   = 0x165667B19E3779F9
	prime64_4   = 0x85EBCA77C2B2AE63
	prime64_5   = 0x27D4EB2F165667C5
	xxh3PrimeMx = 0x165667919E3779F9
)

// xxh3Secret is XXH3's default 192-byte secret (kSecret in the spec).
var xxh3Secret = [192]byte{
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}

// copyBlocksNT copies blocks 1 KiB blocks of src into dst with
// non-temporal stores, which do not read dst's lines into the cache, and
// accumulates and scrambles each block into acc; dst is 32-byte aligned.
//
//go:noescape
func copyBlocksNT(dst, src, secret *byte, blocks int, acc *[8]uint64)

// copyBlocks is copyBlocksNT with ordinary stores, for any dst.
//
//go:noescape
func copyBlocks(dst, src, secret *byte, blocks int, acc *[8]uint64)

// copyHashLong copies src (longer than xxh3MidMax) into dst and returns
// xxh3.Hash(src): the assembly copies and hashes every block but the last,
// partial or full, which is copied and hashed here.
func copyHashLong(dst, src []byte) uint64 {
	n := len(src)
	dst = dst[:n]
	acc := [8]uint64{prime32_3, prime64_1, prime64_2, prime64_3, prime64_4, prime32_2, prime64_5, prime32_1}
	blocks := (n - 1) / xxh3Block
	if blocks > 0 {
		if uintptr(unsafe.Pointer(&dst[0]))%32 == 0 {
			copyBlocksNT(&dst[0], &src[0], &xxh3Secret[0], blocks, &acc)
		} else {
			copyBlocks(&dst[0], &src[0], &xxh3Secret[0], blocks, &acc)
		}
	}
	last := src[blocks*xxh3Block:]
	copy(dst[blocks*xxh3Block:], last)
	for s := range (len(last) - 1) / xxh3Stripe {
		accumulate(&acc, last[s*xxh3Stripe:], xxh3Secret[8*s:])
	}
	accumulate(&acc, src[n-xxh3Stripe:], xxh3Secret[len(xxh3Secret)-xxh3Stripe-7:])
	return merge(&acc, xxh3Secret[11:], uint64(n)*prime64_1)
}

// accumulate takes the stripe at the start of p into acc with the secret
// at the start of key.
func accumulate(acc *[8]uint64, p, key []byte) {
	for i := range acc {
		v := binary.LittleEndian.Uint64(p[8*i:])
		k := v ^ binary.LittleEndian.Uint64(key[8*i:])
		acc[i^1] += v
		acc[i] += uint64(uint32(k)) * (k >> 32)
	}
}

// merge folds the accumulator into the 64-bit hash, starting from start,
// with the secret at the start of key, and avalanches it.
func merge(acc *[8]uint64, key []byte, start uint64) uint64 {
	h := start
	for i := 0; i < len(acc); i += 2 {
		hi, lo := bits.Mul64(acc[i]^binary.LittleEndian.Uint64(key[8*i:]), acc[i+1]^binary.LittleEndian.Uint64(key[8*i+8:]))
		h += hi ^ lo
	}
	h ^= h >> 37
	h *= xxh3PrimeMx
	return h ^ h>>32
}

// fusedAvailable is whether copyChunk takes the fused pass.
func fusedAvailable() bool { return fused }
