package arena

import "encoding/binary"

// Synthesize fills b with deterministic pseudo-random bytes derived from
// seed (wyrand), so a simulator's synthetic weights are the same bytes on
// every start and every node, and their digest is reproducible.
func Synthesize(b []byte, seed uint64) {
	s := seed
	next := func() uint64 {
		s += 0xa0761d6478bd642f
		hi, lo := mul64(s, s^0xe7037ed1a0b428db)
		return hi ^ lo
	}
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], next())
	}
	if i < len(b) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], next())
		copy(b[i:], tail[:])
	}
}

func mul64(a, b uint64) (hi, lo uint64) {
	const mask32 = 1<<32 - 1
	a0, a1 := a&mask32, a>>32
	b0, b1 := b&mask32, b>>32
	w0 := a0 * b0
	t := a1*b0 + w0>>32
	w1, w2 := t&mask32, t>>32
	w1 += a0 * b1
	return a1*b1 + w2 + w1>>32, a * b
}
