//go:build !amd64 || purego

package arena

// copyChunk copies src, at most one chunk, into dst (as long) and returns
// the chunk's digest, xxh3.Hash(src), hashing src right after the copy
// read it, while it is still in the cache.
func copyChunk(dst, src []byte) uint64 { return copyThenHash(dst, src) }

// fusedAvailable is whether copyChunk takes the fused pass.
func fusedAvailable() bool { return false }
