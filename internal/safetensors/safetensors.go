// Package safetensors reads and writes the safetensors format: an 8-byte
// little-endian header length, a JSON header mapping tensor names to their
// dtype, shape and byte range, and the raw little-endian tensor data.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// MaxHeaderBytes bounds the JSON header a reader accepts (the format's own
// limit is 100 MB).
const MaxHeaderBytes = 100 << 20

// DType is a safetensors element type.
type DType string

// Element types this package converts to float32.
const (
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
)

// Size is the size of one element in bytes, 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case F32, "I32", "U32":
		return 4
	case F16, BF16, "I16", "U16":
		return 2
	case "F64", "I64", "U64":
		return 8
	case "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2":
		return 1
	}
	return 0
}

// Tensor is one entry of a file's header.
type Tensor struct {
	Name  string
	DType DType
	Shape []int64
	// Begin and End are byte offsets relative to the start of the data
	// section.
	Begin, End int64
}

// Elements is the number of elements of the tensor.
func (t Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is an open safetensors file.
type File struct {
	f        *os.File
	dataBase int64
	Tensors  []Tensor // sorted by Begin
	Metadata map[string]string
}

type headerEntry struct {
	DType   DType    `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// Open reads the header of a safetensors file and checks that every
// tensor's byte range fits its dtype and shape and lies inside the file.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sf, err := parse(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sf, nil
}

func parse(f *os.File) (*File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderBytes || int64(n) > st.Size()-8 {
		return nil, fmt.Errorf("header length %d does not fit the file (%d bytes)", n, st.Size())
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("reading header: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, fmt.Errorf("header is not a JSON object: %w", err)
	}
	sf := &File{f: f, dataBase: 8 + int64(n)}
	dataLen := st.Size() - sf.dataBase
	for name, v := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(v, &sf.Metadata); err != nil {
				return nil, fmt.Errorf("__metadata__: %w", err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
		t := Tensor{Name: name, DType: e.DType, Shape: e.Shape, Begin: e.Offsets[0], End: e.Offsets[1]}
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("tensor %s: unknown dtype %q", name, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %s: negative dimension", name)
			}
		}
		if t.Begin < 0 || t.End < t.Begin || t.End > dataLen {
			return nil, fmt.Errorf("tensor %s: byte range [%d, %d) outside the data (%d bytes)", name, t.Begin, t.End, dataLen)
		}
		if t.End-t.Begin != t.Elements()*int64(t.DType.Size()) {
			return nil, fmt.Errorf("tensor %s: %d bytes for %v %s", name, t.End-t.Begin, t.Shape, t.DType)
		}
		sf.Tensors = append(sf.Tensors, t)
	}
	sort.Slice(sf.Tensors, func(i, j int) bool { return sf.Tensors[i].Begin < sf.Tensors[j].Begin })
	return sf, nil
}

// Close closes the file.
func (sf *File) Close() error { return sf.f.Close() }

// Tensor returns the named tensor's header entry.
func (sf *File) Tensor(name string) (Tensor, bool) {
	for _, t := range sf.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// Raw reads a tensor's bytes.
func (sf *File) Raw(t Tensor) ([]byte, error) {
	b := make([]byte, t.End-t.Begin)
	if _, err := sf.f.ReadAt(b, sf.dataBase+t.Begin); err != nil {
		return nil, fmt.Errorf("reading tensor %s: %w", t.Name, err)
	}
	return b, nil
}

// ReadRange reads n bytes of a tensor from byte off of the tensor.
func (sf *File) ReadRange(t Tensor, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > t.End-t.Begin {
		return nil, fmt.Errorf("tensor %s: range [%d, %d) outside its %d bytes", t.Name, off, off+n, t.End-t.Begin)
	}
	b := make([]byte, n)
	if _, err := sf.f.ReadAt(b, sf.dataBase+t.Begin+off); err != nil {
		return nil, fmt.Errorf("reading tensor %s: %w", t.Name, err)
	}
	return b, nil
}

// Float32 reads a F32, F16 or BF16 tensor as float32 values.
func (sf *File) Float32(t Tensor) ([]float32, error) {
	b, err := sf.Raw(t)
	if err != nil {
		return nil, err
	}
	return ToFloat32(t.DType, b)
}

// ErrDType is returned for tensors whose dtype is not a float type this
// package converts.
var ErrDType = errors.New("unsupported dtype")

// ToFloat32 decodes little-endian F32, F16 or BF16 data.
func ToFloat32(d DType, b []byte) ([]float32, error) {
	switch d {
	case F32:
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out, nil
	case F16:
		out := make([]float32, len(b)/2)
		for i := range out {
			out[i] = F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return out, nil
	case BF16:
		out := make([]float32, len(b)/2)
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w %s (F32, F16 and BF16 are)", ErrDType, d)
}

// F16ToF32 converts an IEEE half-precision value.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		mant &= 0x3ff
		return math.Float32frombits(sign | e<<23 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToF16 converts to IEEE half precision, rounding to nearest even, as
// numpy's astype(float16) and ggml's FP32_TO_FP16 do.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rest := mant & (1<<shift - 1)
		m := mant >> shift
		if rest > half || (rest == half && m&1 == 1) {
			m++
		}
		return sign | uint16(m)
	}
	m := mant >> 13
	rest := mant & 0x1fff
	out := uint32(e)<<10 | m
	if rest > 0x1000 || (rest == 0x1000 && m&1 == 1) {
		out++ // may carry into the exponent, which is still correct
	}
	return sign | uint16(out)
}

// F32ToBF16 converts to bfloat16, rounding to nearest even.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// WriteTensor is a tensor to write.
type WriteTensor struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
}

// Write writes tensors (in the given order) and metadata as a safetensors
// file. The header is padded with spaces to a multiple of 8 bytes, as the
// reference implementation does.
func Write(w io.Writer, tensors []WriteTensor, metadata map[string]string) error {
	hdr := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		hdr["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		n := int64(len(t.Data))
		want := int64(t.DType.Size())
		for _, d := range t.Shape {
			want *= d
		}
		if n != want {
			return fmt.Errorf("tensor %s: %d bytes for %v %s", t.Name, n, t.Shape, t.DType)
		}
		hdr[t.Name] = headerEntry{DType: t.DType, Shape: t.Shape, Offsets: [2]int64{off, off + n}}
		off += n
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	if _, err := w.Write(lenBuf[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}
