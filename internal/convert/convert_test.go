package convert

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggufparser "github.com/gpustack/gguf-parser-go"

	"github.com/model-orchestra/operator/internal/gguf"
	"github.com/model-orchestra/operator/internal/hfllama"
)

func tiny(t *testing.T, o hfllama.TinyOptions) string {
	t.Helper()
	dir := t.TempDir()
	if err := hfllama.WriteTiny(dir, o); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ggufModel loads a converted file into the reference forward pass as a
// GGUF engine sees it: dequantized weights in GGUF's row order, with the
// interleaved rotary pairs of ggml's llama. Nothing is un-permuted, so the
// logits match the checkpoint's only if the converter's Q/K permutation is
// exactly the one GGUF's rotary convention needs.
func ggufModel(t *testing.T, path string, cfg hfllama.Config) *hfllama.Model {
	t.Helper()
	gf, err := ggufparser.ParseGGUFFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) []float32 {
		for _, ti := range gf.TensorInfos {
			if ti.Name != name {
				continue
			}
			n := 1
			for _, d := range ti.Dimensions {
				n *= int(d)
			}
			b := raw[gf.TensorDataStartOffset+int64(ti.Offset):]
			switch gguf.Type(ti.Type) {
			case gguf.TypeF32:
				out := make([]float32, n)
				for i := range out {
					out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
				}
				return out
			case gguf.TypeF16:
				out := make([]float32, n)
				for i := range out {
					out[i] = gguf.Float32FromHalf(binary.LittleEndian.Uint16(b[2*i:]))
				}
				return out
			case gguf.TypeQ8_0:
				return dequantizeQ8_0(b, n)
			case gguf.TypeQ4_0:
				return dequantizeQ4_0(b, n)
			}
			t.Fatalf("tensor %s: type %v", name, ti.Type)
		}
		return nil
	}
	m := &hfllama.Model{Config: cfg, RopeInterleaved: true, Embed: get("token_embd.weight"), Norm: get("output_norm.weight")}
	m.LMHead = get("output.weight")
	if m.LMHead == nil {
		m.LMHead = m.Embed
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		b := fmt.Sprintf("blk.%d.", i)
		m.Layers = append(m.Layers, hfllama.Layer{
			InputNorm: get(b + "attn_norm.weight"), PostNorm: get(b + "ffn_norm.weight"),
			Q: get(b + "attn_q.weight"), K: get(b + "attn_k.weight"), V: get(b + "attn_v.weight"), O: get(b + "attn_output.weight"),
			Gate: get(b + "ffn_gate.weight"), Up: get(b + "ffn_up.weight"), Down: get(b + "ffn_down.weight"),
		})
	}
	return m
}

func cosine(a, b [][]float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		for j := range a[i] {
			x, y := float64(a[i][j]), float64(b[i][j])
			ab, aa, bb = ab+x*y, aa+x*x, bb+y*y
		}
	}
	return ab / math.Sqrt(aa*bb)
}

func rms(a [][]float32) float64 {
	var s float64
	var n int
	for i := range a {
		for _, v := range a[i] {
			s += float64(v) * float64(v)
			n++
		}
	}
	return math.Sqrt(s / float64(n))
}

func maxDiff(a, b [][]float32) float64 {
	var d float64
	for i := range a {
		for j := range a[i] {
			e := math.Abs(float64(a[i][j] - b[i][j]))
			if math.IsNaN(e) {
				return math.Inf(1)
			}
			d = math.Max(d, e)
		}
	}
	return d
}

// The converted model computes the checkpoint's logits: exactly (up to
// float32 summation order) at F16 from a bfloat16 checkpoint, whose values
// F16 holds exactly, and within the quantization error at Q8_0 and Q4_0.
// Untied and tied outputs both.
func TestConvertedLogitsMatchCheckpoint(t *testing.T) {
	for _, tied := range []bool{false, true} {
		dir := tiny(t, hfllama.TinyOptions{Seed: 11, Tied: tied})
		ck, err := hfllama.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := ck.Load()
		_ = ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		tk, err := hfllama.ReadTokenizer(dir)
		if err != nil {
			t.Fatal(err)
		}
		ids := tk.Encode("The quick brown fox jumps over the lazy dog")
		want := ref.Logits(ids)
		for _, c := range []struct {
			typ Type
			tol float64
		}{{F16, 1e-5}, {Q8_0, 0.99}, {Q4_0, 0.9}} {
			res, err := Run(context.Background(), Options{Dir: dir, Type: c.typ})
			if err != nil {
				t.Fatal(err)
			}
			got := ggufModel(t, filepath.Join(dir, res.Output), ref.Config).Logits(ids)
			// F16: the largest difference relative to the logits' spread;
			// quantized: the cosine similarity of all logits, as the
			// quantization noise travels through this small chaotic model
			d, cos := maxDiff(want, got)/rms(want), cosine(want, got)
			t.Logf("tied %v %s: %d bytes, max |Δlogit| %.2g of the logits' rms %.3g, cosine %.4f", tied, c.typ, res.Size, d, rms(want), cos)
			if (c.typ == F16 && d > c.tol) || (c.typ != F16 && cos < c.tol) {
				t.Errorf("tied %v %s: max |Δlogit|/rms %.3g, cosine %.4f (bound %g)", tied, c.typ, d, cos, c.tol)
			}
			if c.typ == F16 {
				// the permutation is what makes them equal: without it
				// (or with the wrong rotary convention) they are far apart
				m := ggufModel(t, filepath.Join(dir, res.Output), ref.Config)
				m.RopeInterleaved = false
				if d := maxDiff(want, m.Logits(ids)); d < 0.1 {
					t.Errorf("tied %v: the rotary layout makes no difference (%.3g): the test cannot see a wrong permutation", tied, d)
				}
			}
		}
	}
}

func TestQuantizersMatchGGMLReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 32*64)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	x[3] = 0 // a zero inside a block
	for i := 64; i < 96; i++ {
		x[i] = 0 // an all-zero block: scale 0, values 0 (Q8_0) and 8 (Q4_0)
	}
	q8 := quantizeQ8_0(nil, x)
	if len(q8) != len(x)/32*34 {
		t.Fatalf("Q8_0: %d bytes", len(q8))
	}
	q4 := quantizeQ4_0(nil, x)
	if len(q4) != len(x)/32*18 {
		t.Fatalf("Q4_0: %d bytes", len(q4))
	}
	// the all-zero block: ggml's d = max / -8 is -0 there
	if d := binary.LittleEndian.Uint16(q4[2*18:]); d != 0x8000 || q4[2*18+2] != 0x88 {
		t.Fatalf("Q4_0 zero block: d %#x first byte %#x, want 0x8000 (-0) and 0x88", d, q4[2*18+2])
	}
	// an element-wise check of the formulas on the first block
	blk := x[:32]
	var amax, m float32
	for _, v := range blk {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, m = a, v
		}
	}
	if got, want := binary.LittleEndian.Uint16(q8), gguf.Float16(amax/127); got != want {
		t.Fatalf("Q8_0 scale %#x, want %#x", got, want)
	}
	for j, v := range blk {
		if want := int8(math.Round(float64(v / (amax / 127)))); int8(q8[2+j]) != want {
			t.Fatalf("Q8_0 value %d = %d, want %d", j, int8(q8[2+j]), want)
		}
	}
	d := m / -8
	for j := 0; j < 16; j++ {
		lo, hi := q4[2+j]&15, q4[2+j]>>4
		wlo := min(15, int(float32(blk[j]*(1/d))+8.5))
		whi := min(15, int(float32(blk[j+16]*(1/d))+8.5))
		if int(lo) != wlo || int(hi) != whi {
			t.Fatalf("Q4_0 byte %d = %d/%d, want %d/%d", j, lo, hi, wlo, whi)
		}
	}
	// round trips within half a step of each block's scale
	for _, c := range []struct {
		name string
		back []float32
		step func(blk []float32) float64
	}{
		{"Q8_0", dequantizeQ8_0(q8, len(x)), func(b []float32) float64 { return amaxOf(b) / 127 }},
		{"Q4_0", dequantizeQ4_0(q4, len(x)), func(b []float32) float64 { return amaxOf(b) / 8 }},
	} {
		for b := 0; b < len(x); b += 32 {
			s := c.step(x[b : b+32])
			for j := b; j < b+32; j++ {
				// half a step, plus the scale's float16 rounding (2^-11 relative) times the largest value
				tol := s*0.5 + amaxOf(x[b:b+32])/1024
				if c.name == "Q4_0" {
					tol = s + amaxOf(x[b:b+32])/1024 // the largest value's sign decides the range: one step at the far end
				}
				if e := math.Abs(float64(x[j] - c.back[j])); e > tol {
					t.Fatalf("%s: value %d: %g came back as %g (step %g)", c.name, j, x[j], c.back[j], s)
				}
			}
		}
	}
}

func amaxOf(b []float32) float64 {
	var m float64
	for _, v := range b {
		m = math.Max(m, math.Abs(float64(v)))
	}
	return m
}

// A conversion killed half way resumes from its journal and produces the
// same bytes as one that ran through; a second run finds it done.
func TestConvertResumesAndIsIdempotent(t *testing.T) {
	// a few MiB, so that the encoder's buffer passes several writes
	opts := hfllama.TinyOptions{Seed: 2, Hidden: 256, Intermediate: 1024, Layers: 4}
	dir := tiny(t, opts)
	fresh := t.TempDir()
	if err := hfllama.WriteTiny(fresh, opts); err != nil {
		t.Fatal(err)
	}
	whole, err := Run(context.Background(), Options{Dir: fresh, Type: Q8_0, Name: "tiny"})
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var stoppedAt int64
	_, err = Run(ctx, Options{Dir: dir, Name: "tiny", Type: Q8_0, JournalEvery: 256 << 10, Progress: func(done, total int64) {
		if done > total/2 && stoppedAt == 0 {
			stoppedAt = done
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, OutputName(Q8_0))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an interrupted conversion published its output: %v", err)
	}
	var resumedFrom int64 = -1
	res, err := Run(context.Background(), Options{Dir: dir, Name: "tiny", Type: Q8_0, Progress: func(done, total int64) {
		if resumedFrom < 0 {
			resumedFrom = done
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped at %d of %d bytes, resumed writing at %d", stoppedAt, whole.Size, resumedFrom)
	if resumedFrom < whole.Size/3 {
		t.Errorf("the resumed run started writing at byte %d: it did not resume", resumedFrom)
	}
	if res.SHA256 != whole.SHA256 || res.Size != whole.Size {
		t.Fatalf("resumed output %s (%d bytes), uninterrupted %s (%d bytes)", res.SHA256, res.Size, whole.SHA256, whole.Size)
	}
	again, err := Run(context.Background(), Options{Dir: dir, Name: "tiny", Type: Q8_0})
	if err != nil || !again.Cached {
		t.Fatalf("second run: cached %v, %v", again.Cached, err)
	}
	// another weight type replaces the output and the manifest
	f16, err := Run(context.Background(), Options{Dir: dir, Type: F16})
	if err != nil || f16.Cached {
		t.Fatalf("F16 after Q8_0: cached %v, %v", f16.Cached, err)
	}
	if _, err := os.Stat(filepath.Join(dir, OutputName(Q8_0))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale Q8_0 output is still in the cache")
	}
}

func TestUnsupportedCheckpointsNameWhatIsMissing(t *testing.T) {
	edit := func(t *testing.T, file string, from, to string) string {
		dir := tiny(t, hfllama.TinyOptions{Seed: 1})
		p := filepath.Join(dir, file)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), from) {
			t.Fatalf("%s has no %q", file, from)
		}
		if err := os.WriteFile(p, []byte(strings.Replace(string(b), from, to, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := []struct {
		name string
		dir  func(t *testing.T) string
		want string
	}{
		{"architecture", func(t *testing.T) string { return edit(t, "config.json", "LlamaForCausalLM", "GPT2LMHeadModel") }, `architecture "GPT2LMHeadModel"`},
		{"rope scaling", func(t *testing.T) string {
			return edit(t, "config.json", `"rope_scaling": null`, `"rope_scaling": {"rope_type": "llama3", "factor": 8}`)
		}, "rope_scaling"},
		{"sentencepiece", func(t *testing.T) string {
			d := tiny(t, hfllama.TinyOptions{Seed: 1})
			_ = os.Remove(filepath.Join(d, "tokenizer.json"))
			return d
		}, "tokenizer.json is missing"},
		{"pre-tokenizer", func(t *testing.T) string { return edit(t, "tokenizer.json", `"use_regex": false`, `"use_regex": true`) }, "pre_tokenizer"},
		{"no weights", func(t *testing.T) string {
			d := tiny(t, hfllama.TinyOptions{Seed: 1, Shards: 1})
			_ = os.Remove(filepath.Join(d, "model.safetensors"))
			return d
		}, "no *.safetensors file"},
		{"missing tensor", func(t *testing.T) string {
			return edit(t, "config.json", `"num_hidden_layers": 2`, `"num_hidden_layers": 3`)
		}, "model.layers.2.input_layernorm.weight is missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := c.dir(t)
			err := Check(dir, Q8_0)
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check: %v, want ErrUnsupported naming %q", err, c.want)
			}
			if _, err := Run(context.Background(), Options{Dir: dir, Type: Q8_0}); !errors.Is(err, ErrUnsupported) {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// Converting a few rows (whole heads for Q and K) at a time writes the
// same bytes as converting each tensor whole.
func TestChunkedConversionIsIdentical(t *testing.T) {
	for _, typ := range []Type{F16, Q8_0} {
		whole := tiny(t, hfllama.TinyOptions{Seed: 9})
		a, err := Run(context.Background(), Options{Dir: whole, Type: typ, Name: "x"})
		if err != nil {
			t.Fatal(err)
		}
		chunked := tiny(t, hfllama.TinyOptions{Seed: 9})
		old := chunkBytes
		chunkBytes = 1000 // 3 rows of 64 BF16 values for most tensors, one head of Q/K
		b, err := Run(context.Background(), Options{Dir: chunked, Type: typ, Name: "x"})
		chunkBytes = old
		if err != nil {
			t.Fatal(err)
		}
		if a.SHA256 != b.SHA256 {
			t.Errorf("%s: chunked output %s, whole %s", typ, b.SHA256, a.SHA256)
		}
	}
}
