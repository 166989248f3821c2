package gguf_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	parser "github.com/gpustack/gguf-parser-go"

	"github.com/model-orchestra/operator/internal/gguf"
)

// writeFile encodes f into a temporary file and parses it back with
// gguf-parser-go, an independent reader.
func writeFile(t *testing.T, f gguf.File) (*parser.GGUFFile, []byte) {
	t.Helper()
	var buf bytes.Buffer
	n, err := gguf.Encode(&buf, f)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("Encode returned %d bytes, wrote %d", n, buf.Len())
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	gf, err := parser.ParseGGUFFile(path)
	if err != nil {
		t.Fatalf("gguf-parser-go cannot read the file: %v", err)
	}
	return gf, buf.Bytes()
}

func TestEncodeMetadataEveryType(t *testing.T) {
	md := []gguf.KV{
		{Key: "u8", Value: uint8(200)},
		{Key: "i8", Value: int8(-100)},
		{Key: "u16", Value: uint16(60000)},
		{Key: "i16", Value: int16(-30000)},
		{Key: "u32", Value: uint32(4000000000)},
		{Key: "i32", Value: int32(-2000000000)},
		{Key: "f32", Value: float32(1.5)},
		{Key: "bool", Value: true},
		{Key: "string", Value: "héllo"},
		{Key: "u64", Value: uint64(1) << 60},
		{Key: "i64", Value: int64(-1) << 60},
		{Key: "f64", Value: math.Pi},
		{Key: "strings", Value: []string{"a", "", "ccc"}},
		{Key: "i32s", Value: []int32{1, -2, 3}},
		{Key: "f32s", Value: []float32{0.5, -0.25}},
		{Key: "u8s", Value: []uint8{1, 2, 3}},
		{Key: "bools", Value: []bool{true, false}},
		{Key: "nested", Value: [][]uint32{{1, 2}, {3}}},
	}
	gf, _ := writeFile(t, gguf.File{Metadata: md})
	if gf.Header.Version != 3 || gf.Header.MetadataKVCount != uint64(len(md)) || gf.Header.TensorCount != 0 {
		t.Fatalf("header: version %d, %d key/values, %d tensors", gf.Header.Version, gf.Header.MetadataKVCount, gf.Header.TensorCount)
	}
	kv := func(k string) parser.GGUFMetadataKV {
		v, ok := gf.Header.MetadataKV.Get(k)
		if !ok {
			t.Fatalf("key %s missing", k)
		}
		return v
	}
	got := []any{
		kv("u8").ValueUint8(), kv("i8").ValueInt8(), kv("u16").ValueUint16(), kv("i16").ValueInt16(),
		kv("u32").ValueUint32(), kv("i32").ValueInt32(), kv("f32").ValueFloat32(), kv("bool").ValueBool(),
		kv("string").ValueString(), kv("u64").ValueUint64(), kv("i64").ValueInt64(), kv("f64").ValueFloat64(),
		kv("strings").ValueArray().ValuesString(), kv("i32s").ValueArray().ValuesInt32(),
		kv("f32s").ValueArray().ValuesFloat32(), kv("u8s").ValueArray().ValuesUint8(), kv("bools").ValueArray().ValuesBool(),
	}
	var want []any
	for _, m := range md[:len(md)-1] {
		want = append(want, m.Value)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("metadata read back (-written +read):\n%s", d)
	}
	nested := kv("nested").ValueArray().ValuesArray()
	if len(nested) != 2 || !cmp.Equal(nested[0].ValuesUint32(), []uint32{1, 2}) || !cmp.Equal(nested[1].ValuesUint32(), []uint32{3}) {
		t.Errorf("array of arrays read back as %+v", nested)
	}
}

func TestEncodeTensors(t *testing.T) {
	f32 := make([]byte, 4*3)
	for i := range f32 {
		f32[i] = byte(i + 1)
	}
	f16 := bytes.Repeat([]byte{0x00, 0x3c}, 8*2) // 1.0 in half precision
	q8 := bytes.Repeat([]byte{7}, 34*2)          // two Q8_0 blocks: a row of 64
	for _, align := range []uint32{0, 64} {
		t.Run(map[uint32]string{0: "default alignment", 64: "alignment 64"}[align], func(t *testing.T) {
			var md []gguf.KV
			want := uint64(gguf.DefaultAlignment)
			if align != 0 {
				md = append(md, gguf.KV{Key: gguf.AlignmentKey, Value: align})
				want = uint64(align)
			}
			tensors := []gguf.Tensor{
				{Name: "norm.weight", Shape: []uint64{3}, Type: gguf.TypeF32, Data: gguf.Bytes(f32)},
				{Name: "w.weight", Shape: []uint64{8, 2}, Type: gguf.TypeF16, Data: gguf.Bytes(f16)},
				{Name: "q.weight", Shape: []uint64{64, 1}, Type: gguf.TypeQ8_0, Data: gguf.Bytes(q8)},
			}
			gf, raw := writeFile(t, gguf.File{Metadata: md, Tensors: tensors})
			if uint64(gf.TensorDataStartOffset)%want != 0 {
				t.Errorf("tensor data starts at %d, not a multiple of %d", gf.TensorDataStartOffset, want)
			}
			data := [][]byte{f32, f16, q8}
			for i, ti := range gf.TensorInfos {
				tt := tensors[i]
				if ti.Name != tt.Name || uint32(ti.Type) != uint32(tt.Type) || !cmp.Equal(ti.Dimensions, tt.Shape) {
					t.Errorf("tensor %d read back as %s %v type %d, want %s %v %s", i, ti.Name, ti.Dimensions, ti.Type, tt.Name, tt.Shape, tt.Type)
				}
				if ti.Offset%want != 0 {
					t.Errorf("tensor %s at offset %d, not a multiple of %d", ti.Name, ti.Offset, want)
				}
				start := uint64(gf.TensorDataStartOffset) + ti.Offset
				if got := raw[start : start+uint64(len(data[i]))]; !bytes.Equal(got, data[i]) {
					t.Errorf("tensor %s data differs", ti.Name)
				}
			}
		})
	}
}

func TestEncodeRefuses(t *testing.T) {
	ok := gguf.Tensor{Name: "a", Shape: []uint64{4}, Type: gguf.TypeF32, Data: gguf.Bytes(make([]byte, 16))}
	for _, tc := range []struct {
		name string
		f    gguf.File
		want string
	}{
		{"int has no width", gguf.File{Metadata: []gguf.KV{{Key: "k", Value: 3}}}, `metadata "k": type int has no GGUF metadata type`},
		{"nil value", gguf.File{Metadata: []gguf.KV{{Key: "k"}}}, `metadata "k": no value`},
		{"duplicate key", gguf.File{Metadata: []gguf.KV{{Key: "k", Value: true}, {Key: "k", Value: false}}}, `metadata "k" appears twice`},
		{"alignment type", gguf.File{Metadata: []gguf.KV{{Key: gguf.AlignmentKey, Value: uint64(32)}}}, "general.alignment must be a uint32"},
		{"alignment value", gguf.File{Metadata: []gguf.KV{{Key: gguf.AlignmentKey, Value: uint32(12)}}}, "want a positive multiple of 8"},
		{"duplicate tensor", gguf.File{Tensors: []gguf.Tensor{ok, ok}}, `tensor "a" appears twice`},
		{"long name", gguf.File{Tensors: []gguf.Tensor{{Name: strings.Repeat("x", 64), Shape: []uint64{4}, Type: gguf.TypeF32, Data: ok.Data}}}, "want 1 to 63 bytes"},
		{"row not whole blocks", gguf.File{Tensors: []gguf.Tensor{{Name: "q", Shape: []uint64{48}, Type: gguf.TypeQ8_0, Data: ok.Data}}}, "row length 48 is not a multiple of Q8_0's block size 32"},
		{"unknown type", gguf.File{Tensors: []gguf.Tensor{{Name: "q", Shape: []uint64{4}, Type: 4, Data: ok.Data}}}, "unknown ggml type 4"},
		{"five dimensions", gguf.File{Tensors: []gguf.Tensor{{Name: "q", Shape: []uint64{1, 1, 1, 1, 1}, Type: gguf.TypeF32, Data: ok.Data}}}, "1 to 4 dimensions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := gguf.Encode(&buf, tc.f)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Encode: %v, want an error containing %q", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes of a file it refused", buf.Len())
			}
		})
	}
}

func TestEncodeTensorDataOfTheWrongSize(t *testing.T) {
	_, err := gguf.Encode(io.Discard, gguf.File{Tensors: []gguf.Tensor{
		{Name: "a", Shape: []uint64{4}, Type: gguf.TypeF32, Data: gguf.Bytes(make([]byte, 12))},
	}})
	if !errors.Is(err, gguf.ErrTensorSize) || !strings.Contains(err.Error(), "wrote 12 bytes, want 16") {
		t.Fatalf("Encode: %v, want ErrTensorSize saying 12 of 16 bytes", err)
	}
}

func TestTypeSizes(t *testing.T) {
	for _, tc := range []struct {
		typ   gguf.Type
		shape []uint64
		want  uint64
	}{
		{gguf.TypeF32, []uint64{64, 512}, 64 * 512 * 4},
		{gguf.TypeF16, []uint64{64, 512}, 64 * 512 * 2},
		{gguf.TypeQ8_0, []uint64{64, 10}, 2 * 34 * 10},
		{gguf.TypeQ4_0, []uint64{64, 10}, 2 * 18 * 10},
		{gguf.TypeQ4_K, []uint64{256, 2}, 144 * 2},
		{gguf.TypeQ6_K, []uint64{256, 2}, 210 * 2},
	} {
		got, err := tc.typ.DataSize(tc.shape)
		if err != nil || got != tc.want {
			t.Errorf("%s%v: %d, %v; want %d bytes", tc.typ, tc.shape, got, err, tc.want)
		}
	}
}

func TestFloat16(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{0, 0x0000}, {float32(math.Copysign(0, -1)), 0x8000}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800},
		{65504, 0x7bff}, {65520, 0x7c00}, {1e10, 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{0.1, 0x2e66}, {1.0 / 3, 0x3555},
		{6.103515625e-05, 0x0400},                                         // smallest normal
		{5.960464477539063e-08, 0x0001}, {2.9802322387695312e-08, 0x0000}, // smallest subnormal; half of it rounds to even (0)
		{1 + 1.0/2048, 0x3c00}, {1 + 3.0/2048, 0x3c02}, // ties to even
	} {
		if got := gguf.Float16(tc.f); got != tc.want {
			t.Errorf("Float16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
	if got := gguf.Float16(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("Float16(NaN) = %#04x, not a NaN", got)
	}
	for h := 0; h < 1<<16; h++ {
		f := gguf.Float32FromHalf(uint16(h))
		if f != f { // NaN
			continue
		}
		if back := gguf.Float16(f); back != uint16(h) {
			t.Fatalf("half %#04x -> %g -> %#04x", h, f, back)
		}
	}
}
