package convert

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/model-orchestra/operator/internal/gguf"
	"github.com/model-orchestra/operator/internal/hfllama"
	"github.com/model-orchestra/operator/internal/safetensors"
)

// Type is the weight type of a converted model.
type Type string

// The weight types a conversion writes. Norms (1-D tensors) stay F32 at
// every type, as llama.cpp's convert_hf_to_gguf keeps them.
const (
	F16  Type = "F16"
	Q8_0 Type = "Q8_0"
	Q4_0 Type = "Q4_0"
)

// Types lists the supported weight types.
var Types = []Type{F16, Q8_0, Q4_0}

// ParseType accepts a weight type in any case.
func ParseType(s string) (Type, error) {
	for _, t := range Types {
		if strings.EqualFold(s, string(t)) {
			return t, nil
		}
	}
	return "", fmt.Errorf("weight type %q: want F16, Q8_0 or Q4_0", s)
}

func (t Type) ggml() gguf.Type {
	switch t {
	case Q8_0:
		return gguf.TypeQ8_0
	case Q4_0:
		return gguf.TypeQ4_0
	}
	return gguf.TypeF16
}

// fileType is general.file_type (llama_ftype): MOSTLY_F16 1, MOSTLY_Q4_0 2,
// MOSTLY_Q8_0 7.
func (t Type) fileType() uint32 {
	switch t {
	case Q8_0:
		return 7
	case Q4_0:
		return 2
	}
	return 1
}

// tensorPlan is one GGUF tensor: where it comes from and how it is stored.
type tensorPlan struct {
	name   string // GGUF name
	source string // checkpoint name
	rows   int64  // output features (1 for a vector)
	cols   int64  // input features: GGUF's first dimension
	typ    gguf.Type
	// permuteHeads > 0 reorders each head's rows from Hugging Face's
	// rotate_half layout to GGUF's interleaved pairs.
	permuteHeads int
}

func (p tensorPlan) shape() []uint64 {
	if p.rows == 1 {
		return []uint64{uint64(p.cols)}
	}
	return []uint64{uint64(p.cols), uint64(p.rows)}
}

// plan maps every checkpoint tensor to its GGUF tensor, refusing unknown
// tensors and shapes the quantized types cannot hold.
func plan(ck *hfllama.Checkpoint, t Type) ([]tensorPlan, error) {
	c := ck.Config
	h, v, d := int64(c.HiddenSize), int64(c.VocabSize), int64(c.HeadDimension())
	q, kv, ff := int64(c.NumAttentionHeads)*d, int64(c.KVHeads())*d, int64(c.IntermediateSize)
	var ps []tensorPlan
	mat := func(name, src string, rows, cols int64, heads int) {
		ps = append(ps, tensorPlan{name: name, source: src, rows: rows, cols: cols, typ: t.ggml(), permuteHeads: heads})
	}
	vec := func(name, src string, n int64) {
		ps = append(ps, tensorPlan{name: name, source: src, rows: 1, cols: n, typ: gguf.TypeF32})
	}
	mat("token_embd.weight", hfllama.NameEmbed, v, h, 0)
	for i := 0; i < c.NumHiddenLayers; i++ {
		b := fmt.Sprintf("blk.%d.", i)
		vec(b+"attn_norm.weight", hfllama.LayerName(i, "input_layernorm"), h)
		mat(b+"attn_q.weight", hfllama.LayerName(i, "self_attn.q_proj"), q, h, c.NumAttentionHeads)
		mat(b+"attn_k.weight", hfllama.LayerName(i, "self_attn.k_proj"), kv, h, c.KVHeads())
		mat(b+"attn_v.weight", hfllama.LayerName(i, "self_attn.v_proj"), kv, h, 0)
		mat(b+"attn_output.weight", hfllama.LayerName(i, "self_attn.o_proj"), h, q, 0)
		vec(b+"ffn_norm.weight", hfllama.LayerName(i, "post_attention_layernorm"), h)
		mat(b+"ffn_gate.weight", hfllama.LayerName(i, "mlp.gate_proj"), ff, h, 0)
		mat(b+"ffn_up.weight", hfllama.LayerName(i, "mlp.up_proj"), ff, h, 0)
		mat(b+"ffn_down.weight", hfllama.LayerName(i, "mlp.down_proj"), h, ff, 0)
	}
	vec("output_norm.weight", hfllama.NameNorm, h)
	if ck.Has(hfllama.NameLMHead) {
		mat("output.weight", hfllama.NameLMHead, v, h, 0)
	} else if !c.TieWordEmbeddings {
		return nil, fmt.Errorf("%w: tensor %s is missing and tie_word_embeddings is false", hfllama.ErrUnsupported, hfllama.NameLMHead)
	}
	// every checkpoint tensor must be used (rotary inv_freq buffers are
	// recomputed by every engine)
	used := map[string]bool{}
	for _, p := range ps {
		used[p.source] = true
		if !ck.Has(p.source) {
			return nil, fmt.Errorf("%w: tensor %s is missing", hfllama.ErrUnsupported, p.source)
		}
		tt, _, _ := ck.Tensor(p.source)
		want := []int64{p.rows, p.cols}
		if p.rows == 1 {
			want = want[1:]
		}
		if fmt.Sprint(tt.Shape) != fmt.Sprint(want) {
			return nil, fmt.Errorf("%w: tensor %s has shape %v, config.json says %v", hfllama.ErrUnsupported, p.source, tt.Shape, want)
		}
		if p.typ != gguf.TypeF32 && p.typ != gguf.TypeF16 && p.cols%blockSize != 0 {
			return nil, fmt.Errorf("%w: tensor %s has rows of %d values, not a multiple of %s's %d-value blocks; use F16", hfllama.ErrUnsupported, p.source, p.cols, t, blockSize)
		}
	}
	for _, n := range ck.TensorNames() {
		if !used[n] && !strings.HasSuffix(n, "rotary_emb.inv_freq") {
			return nil, fmt.Errorf("%w: tensor %s has no place in a llama GGUF", hfllama.ErrUnsupported, n)
		}
	}
	return ps, nil
}

// skipPermutationForTest writes Q and K in Hugging Face's row order: only
// the tests set it, to show that the engine's output then differs.
var skipPermutationForTest bool

// permuteRows reorders each head's rows as llama.cpp's convert_hf_to_gguf
// permute() does: reshape(heads, 2, d/2, cols).swapaxes(1, 2). Row i of
// the first half and row i of the second half of a head (which
// rotate_half rotates together) become rows 2i and 2i+1 (which GGUF's
// llama rotary, ggml's NORM rope, rotates together).
func permuteRows(w []float32, heads int, cols int64) []float32 {
	rows := int64(len(w)) / cols
	d := rows / int64(heads)
	out := make([]float32, len(w))
	for hd := int64(0); hd < int64(heads); hd++ {
		for i := int64(0); i < d/2; i++ {
			for j := int64(0); j < 2; j++ {
				src := hd*d + j*d/2 + i
				dst := hd*d + 2*i + j
				copy(out[dst*cols:(dst+1)*cols], w[src*cols:(src+1)*cols])
			}
		}
	}
	return out
}

// chunkBytes bounds how much of a source tensor is converted at a time, so
// that converting a model needs tens of MiB of memory whatever its size.
var chunkBytes int64 = 8 << 20

// tensorData returns the function that produces a tensor's GGUF bytes,
// reading the source a block of whole rows (whole heads when permuted) at
// a time.
func tensorData(ck *hfllama.Checkpoint, p tensorPlan, skip func() bool) func(io.Writer) error {
	return func(w io.Writer) error {
		size, _ := p.typ.DataSize(p.shape())
		if skip != nil && skip() {
			// already in the partial file from an earlier run
			_, err := io.CopyN(w, zeros{}, int64(size))
			return err
		}
		t, sf, err := ck.Tensor(p.source)
		if err != nil {
			return err
		}
		rowBytes := p.cols * int64(t.DType.Size())
		step := max(1, chunkBytes/rowBytes)
		if p.permuteHeads > 0 {
			d := p.rows / int64(p.permuteHeads)
			step = max(1, step/d) * d
		}
		var out []byte
		for r := int64(0); r < p.rows; r += step {
			n := min(step, p.rows-r)
			raw, err := sf.ReadRange(t, r*rowBytes, n*rowBytes)
			if err != nil {
				return err
			}
			x, err := safetensors.ToFloat32(t.DType, raw)
			if err != nil {
				return fmt.Errorf("tensor %s: %w", p.source, err)
			}
			if p.permuteHeads > 0 && !skipPermutationForTest {
				x = permuteRows(x, int(n/(p.rows/int64(p.permuteHeads))), p.cols)
			}
			out = encodeRows(out[:0], p.typ, x)
			if _, err := w.Write(out); err != nil {
				return err
			}
		}
		return nil
	}
}

// encodeRows appends x in the GGUF type.
func encodeRows(b []byte, typ gguf.Type, x []float32) []byte {
	switch typ {
	case gguf.TypeF32:
		for _, v := range x {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	case gguf.TypeF16:
		for _, v := range x {
			b = binary.LittleEndian.AppendUint16(b, gguf.Float16(v))
		}
	case gguf.TypeQ8_0:
		b = quantizeQ8_0(b, x)
	case gguf.TypeQ4_0:
		b = quantizeQ4_0(b, x)
	}
	return b
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Token types of tokenizer.ggml.token_type (llama_token_type).
const (
	tokenNormal      int32 = 1
	tokenControl     int32 = 3
	tokenUserDefined int32 = 4
	tokenUnused      int32 = 5
)

// metadata is the GGUF header of the converted model, with the keys
// llama.cpp's convert_hf_to_gguf writes for the llama architecture.
func metadata(ck *hfllama.Checkpoint, tk *hfllama.Tokenizer, t Type, name string) ([]gguf.KV, error) {
	c := ck.Config
	tokens := append([]string(nil), tk.Tokens...)
	if len(tokens) > c.VocabSize {
		return nil, fmt.Errorf("%w: tokenizer has %d tokens, config.json vocab_size is %d", hfllama.ErrUnsupported, len(tokens), c.VocabSize)
	}
	types := make([]int32, c.VocabSize)
	for i := range types {
		types[i] = tokenNormal
	}
	for i := len(tokens); i < c.VocabSize; i++ {
		tokens = append(tokens, fmt.Sprintf("[PAD%d]", i))
		types[i] = tokenUnused
	}
	for i, s := range tokens {
		if s == "" {
			tokens[i] = fmt.Sprintf("[PAD%d]", i)
			types[i] = tokenUnused
		}
	}
	for _, a := range tk.Added {
		if a.Special {
			types[a.ID] = tokenControl
		} else {
			types[a.ID] = tokenUserDefined
		}
	}
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.type", Value: "model"},
		{Key: "general.name", Value: name},
		{Key: "general.file_type", Value: t.fileType()},
		{Key: "llama.vocab_size", Value: uint32(c.VocabSize)},
		{Key: "llama.context_length", Value: uint32(c.MaxPositionEmbeddings)},
		{Key: "llama.embedding_length", Value: uint32(c.HiddenSize)},
		{Key: "llama.block_count", Value: uint32(c.NumHiddenLayers)},
		{Key: "llama.feed_forward_length", Value: uint32(c.IntermediateSize)},
		{Key: "llama.rope.dimension_count", Value: uint32(c.HeadDimension())},
		{Key: "llama.attention.head_count", Value: uint32(c.NumAttentionHeads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(c.KVHeads())},
		{Key: "llama.attention.key_length", Value: uint32(c.HeadDimension())},
		{Key: "llama.attention.value_length", Value: uint32(c.HeadDimension())},
		{Key: "llama.rope.freq_base", Value: float32(c.Theta())},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(c.RMSNormEps)},
		{Key: "tokenizer.ggml.model", Value: "gpt2"},
		{Key: "tokenizer.ggml.pre", Value: tk.Pre},
		{Key: "tokenizer.ggml.tokens", Value: tokens},
		{Key: "tokenizer.ggml.token_type", Value: types},
		{Key: "tokenizer.ggml.merges", Value: tk.Merges},
	}
	if t != F16 {
		kv = append(kv, gguf.KV{Key: "general.quantization_version", Value: uint32(2)})
	}
	if tk.BOS >= 0 {
		kv = append(kv, gguf.KV{Key: "tokenizer.ggml.bos_token_id", Value: uint32(tk.BOS)})
	}
	if tk.EOS >= 0 {
		kv = append(kv, gguf.KV{Key: "tokenizer.ggml.eos_token_id", Value: uint32(tk.EOS)})
	}
	kv = append(kv, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: tk.AddBOS})
	if tk.ChatTemplate != "" {
		kv = append(kv, gguf.KV{Key: "tokenizer.chat_template", Value: tk.ChatTemplate})
	}
	return kv, nil
}
