package gguf

import "fmt"

// Type is a ggml tensor type, as stored in a GGUF tensor info.
type Type uint32

// The ggml tensor types (ggml.h, enum ggml_type). Values missing here were
// removed from ggml and must not be written.
const (
	TypeF32  Type = 0
	TypeF16  Type = 1
	TypeQ4_0 Type = 2
	TypeQ4_1 Type = 3
	TypeQ5_0 Type = 6
	TypeQ5_1 Type = 7
	TypeQ8_0 Type = 8
	TypeQ8_1 Type = 9
	TypeQ2_K Type = 10
	TypeQ3_K Type = 11
	TypeQ4_K Type = 12
	TypeQ5_K Type = 13
	TypeQ6_K Type = 14
	TypeQ8_K Type = 15
	TypeI8   Type = 24
	TypeI16  Type = 25
	TypeI32  Type = 26
	TypeI64  Type = 27
	TypeF64  Type = 28
	TypeBF16 Type = 30
)

// traits is a type's block: how many elements one block holds and how many
// bytes it takes (ggml.c, type_traits).
type traits struct {
	name      string
	blockSize uint64
	typeSize  uint64
}

var typeTraits = map[Type]traits{
	TypeF32:  {"F32", 1, 4},
	TypeF16:  {"F16", 1, 2},
	TypeQ4_0: {"Q4_0", 32, 2 + 16},
	TypeQ4_1: {"Q4_1", 32, 2 + 2 + 16},
	TypeQ5_0: {"Q5_0", 32, 2 + 4 + 16},
	TypeQ5_1: {"Q5_1", 32, 2 + 2 + 4 + 16},
	TypeQ8_0: {"Q8_0", 32, 2 + 32},
	TypeQ8_1: {"Q8_1", 32, 4 + 4 + 32},
	TypeQ2_K: {"Q2_K", 256, 256/16 + 256/4 + 2 + 2},
	TypeQ3_K: {"Q3_K", 256, 256/8 + 256/4 + 12 + 2},
	TypeQ4_K: {"Q4_K", 256, 2 + 2 + 12 + 256/2},
	TypeQ5_K: {"Q5_K", 256, 2 + 2 + 12 + 256/8 + 256/2},
	TypeQ6_K: {"Q6_K", 256, 256/2 + 256/4 + 256/16 + 2},
	TypeQ8_K: {"Q8_K", 256, 4 + 256 + 256/16*2},
	TypeI8:   {"I8", 1, 1},
	TypeI16:  {"I16", 1, 2},
	TypeI32:  {"I32", 1, 4},
	TypeI64:  {"I64", 1, 8},
	TypeF64:  {"F64", 1, 8},
	TypeBF16: {"BF16", 1, 2},
}

// String is the type's ggml name (F16, Q8_0, ...).
func (t Type) String() string {
	if tr, ok := typeTraits[t]; ok {
		return tr.name
	}
	return fmt.Sprintf("Type(%d)", uint32(t))
}

// Known reports whether the writer knows the type's block layout.
func (t Type) Known() bool {
	_, ok := typeTraits[t]
	return ok
}

// BlockSize is the number of elements in one block of the type (1 for
// plain types, 32 or 256 for quantized ones). A row's length must be a
// multiple of it.
func (t Type) BlockSize() uint64 { return typeTraits[t].blockSize }

// BlockBytes is the size in bytes of one block of the type.
func (t Type) BlockBytes() uint64 { return typeTraits[t].typeSize }

// RowBytes is the size in bytes of n elements of the type; n must be a
// multiple of the block size.
func (t Type) RowBytes(n uint64) uint64 {
	tr := typeTraits[t]
	return n / tr.blockSize * tr.typeSize
}

// DataSize is the size in bytes of a tensor of the type and shape (ggml
// order: shape[0] is the row length, the fastest-varying dimension).
func (t Type) DataSize(shape []uint64) (uint64, error) {
	tr, ok := typeTraits[t]
	if !ok {
		return 0, fmt.Errorf("unknown ggml type %d", uint32(t))
	}
	if len(shape) == 0 || len(shape) > 4 {
		return 0, fmt.Errorf("a tensor has 1 to 4 dimensions, not %d", len(shape))
	}
	n := uint64(1)
	for i, d := range shape {
		if d == 0 {
			return 0, fmt.Errorf("dimension %d is 0", i)
		}
		n *= d
	}
	if shape[0]%tr.blockSize != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of %s's block size %d", shape[0], tr.name, tr.blockSize)
	}
	return n / tr.blockSize * tr.typeSize, nil
}
