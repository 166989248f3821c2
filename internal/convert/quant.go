package convert

import (
	"encoding/binary"
	"math"

	"github.com/model-orchestra/operator/internal/gguf"
)

// The block formats of ggml (ggml-common.h), quantized the way
// llama.cpp's gguf-py (quants.py) and ggml's reference quantizers do.
// Each block covers 32 consecutive values of a row.
const blockSize = 32

// quantizeQ8_0 appends Q8_0 blocks: a float16 scale d = max|x|/127 and 32
// int8 values round(x/d) (rounding half away from zero).
func quantizeQ8_0(dst []byte, x []float32) []byte {
	for b := 0; b+blockSize <= len(x); b += blockSize {
		blk := x[b : b+blockSize]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		dst = binary.LittleEndian.AppendUint16(dst, gguf.Float16(d))
		for _, v := range blk {
			var q float32
			if d != 0 {
				q = float32(math.Round(float64(v / d)))
			}
			dst = append(dst, byte(int8(q)))
		}
	}
	return dst
}

// quantizeQ4_0 appends Q4_0 blocks: a float16 scale d = m/-8 where m is the
// value of largest magnitude (the first such), and 16 bytes whose low
// nibbles are values 0..15 and high nibbles values 16..31, each
// min(15, trunc(x/d + 8.5)).
func quantizeQ4_0(dst []byte, x []float32) []byte {
	for b := 0; b+blockSize <= len(x); b += blockSize {
		blk := x[b : b+blockSize]
		var amax, m float32
		for _, v := range blk {
			if a := float32(math.Abs(float64(v))); amax < a {
				amax, m = a, v
			}
		}
		d := m / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		dst = binary.LittleEndian.AppendUint16(dst, gguf.Float16(d))
		q := func(v float32) byte {
			return byte(min(15, int8(float32(v*id)+8.5)))
		}
		for j := 0; j < blockSize/2; j++ {
			dst = append(dst, q(blk[j])|q(blk[j+blockSize/2])<<4)
		}
	}
	return dst
}

// dequantizeQ8_0 and dequantizeQ4_0 invert the formats (as ggml's
// dequantize_row_* do); the tests and the reference pass use them.
func dequantizeQ8_0(b []byte, n int) []float32 {
	out := make([]float32, 0, n)
	for len(out) < n {
		d := gguf.Float32FromHalf(binary.LittleEndian.Uint16(b))
		for j := 0; j < blockSize; j++ {
			out = append(out, float32(int8(b[2+j]))*d)
		}
		b = b[2+blockSize:]
	}
	return out
}

func dequantizeQ4_0(b []byte, n int) []float32 {
	out := make([]float32, 0, n)
	for len(out) < n {
		d := gguf.Float32FromHalf(binary.LittleEndian.Uint16(b))
		var blk [blockSize]float32
		for j := 0; j < blockSize/2; j++ {
			blk[j] = float32(int(b[2+j]&0x0f)-8) * d
			blk[j+blockSize/2] = float32(int(b[2+j]>>4)-8) * d
		}
		out = append(out, blk[:]...)
		b = b[2+blockSize/2:]
	}
	return out
}
