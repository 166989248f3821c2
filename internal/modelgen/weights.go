package modelgen

import (
	"encoding/binary"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"

	"github.com/model-orchestra/operator/internal/gguf"
)

// chunk is how many bytes of a tensor are made before they are written.
const chunk = 64 << 10

// randomF16 writes n F16 values drawn uniformly from 256 levels in
// [-scale, scale], from a generator seeded by the model's seed and the
// tensor's name: the same tensor always gets the same bytes, whatever the
// other tensors are, and a GiB takes well under a second.
func randomF16(seed uint64, name string, n uint64, scale float32) func(io.Writer) error {
	return func(w io.Writer) error {
		h := fnv.New64a()
		_, _ = h.Write([]byte(name))
		rng := rand.NewPCG(seed, h.Sum64())
		var levels [256][2]byte
		for i := range levels {
			f := scale * (float32(i) - 127.5) / 127.5
			binary.LittleEndian.PutUint16(levels[i][:], gguf.Float16(f))
		}
		buf := make([]byte, chunk)
		for left := n * 2; left > 0; {
			m := min(left, chunk)
			for i := uint64(0); i < m; i += 16 {
				r := rng.Uint64()
				for j := uint64(0); j < 8 && i+2*j < m; j++ {
					l := levels[byte(r>>(8*j))]
					buf[i+2*j], buf[i+2*j+1] = l[0], l[1]
				}
			}
			if _, err := w.Write(buf[:m]); err != nil {
				return err
			}
			left -= m
		}
		return nil
	}
}

// onesF32 writes n float32 ones (the RMS norms' weights).
func onesF32(n uint64) func(io.Writer) error {
	return func(w io.Writer) error {
		buf := make([]byte, 4*n)
		for i := uint64(0); i < n; i++ {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(1))
		}
		_, err := w.Write(buf)
		return err
	}
}
