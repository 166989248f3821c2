package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteThenOpen(t *testing.T) {
	f32 := make([]byte, 4*6)
	for i := 0; i < 6; i++ {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(float32(i)-2.5))
	}
	bf := []byte{0x80, 0x3f, 0x00, 0xc0} // bfloat16 1, -2
	var b bytes.Buffer
	if err := Write(&b, []WriteTensor{{"a", F32, []int64{2, 3}, f32}, {"b", BF16, []int64{2}, bf}}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(b.Bytes()); n%8 != 0 {
		t.Errorf("header length %d is not padded to 8", n)
	}
	p := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sf.Close() }()
	if sf.Metadata["format"] != "pt" || len(sf.Tensors) != 2 {
		t.Fatalf("metadata %v tensors %v", sf.Metadata, sf.Tensors)
	}
	ta, _ := sf.Tensor("a")
	x, err := sf.Float32(ta)
	if err != nil || x[0] != -2.5 || x[5] != 2.5 {
		t.Fatalf("a = %v, %v", x, err)
	}
	tb, _ := sf.Tensor("b")
	y, err := sf.Float32(tb)
	if err != nil || y[0] != 1 || y[1] != -2 {
		t.Fatalf("b = %v, %v", y, err)
	}
	if r, err := sf.ReadRange(ta, 12, 12); err != nil || !bytes.Equal(r, f32[12:]) {
		t.Fatalf("ReadRange: %v", err)
	}
	if _, err := sf.ReadRange(ta, 20, 8); err == nil {
		t.Fatal("ReadRange past the tensor succeeded")
	}
}

func TestOpenRefusesBadFiles(t *testing.T) {
	hdr := func(js string, data int) []byte {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint64(b, uint64(len(js)))
		return append(append(b, js...), make([]byte, data)...)
	}
	for name, c := range map[string]struct {
		file []byte
		want string
	}{
		"header longer than the file": {[]byte{0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'}, "does not fit"},
		"not json":                    {hdr("nope", 0), "not a JSON object"},
		"range outside the data":      {hdr(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 8), "outside the data"},
		"size does not match shape":   {hdr(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, 16), "16 bytes for [3] F32"},
		"unknown dtype":               {hdr(`{"w":{"dtype":"Q4","shape":[3],"data_offsets":[0,3]}}`, 3), "unknown dtype"},
	} {
		p := filepath.Join(t.TempDir(), "x.safetensors")
		_ = os.WriteFile(p, c.file, 0o644)
		if _, err := Open(p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// F16 round trips and rounds to nearest even, as numpy does; F16ToF32 is
// exact on every half value.
func TestHalfConversions(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("half %#04x -> %g -> %#04x", h, f, back)
		}
	}
	// halfway between 1 and the next half (1 + 2^-10) rounds to even (1)
	if got := F32ToF16(1 + 1.0/2048); got != 0x3c00 {
		t.Errorf("1+2^-11 -> %#04x, want 0x3c00", got)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 100000; i++ {
		f := float32(rng.NormFloat64() * 100)
		h := F32ToF16(f)
		if d := math.Abs(float64(F16ToF32(h) - f)); d > math.Abs(float64(f))/2048+1e-7 {
			t.Fatalf("%g -> %g: error %g", f, F16ToF32(h), d)
		}
	}
	if got := F32ToBF16(1.00390625); got != 0x3f80 { // 1 + 2^-8: halfway, to even
		t.Errorf("bf16(1+2^-8) = %#04x", got)
	}
}
