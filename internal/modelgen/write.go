package modelgen

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/model-orchestra/operator/internal/gguf"
)

// fileTypeMostlyF16 is llama.cpp's LLAMA_FTYPE_MOSTLY_F16.
const fileTypeMostlyF16 uint32 = 1

// Write writes the model c describes to w as GGUF and returns the bytes
// written.
func Write(w io.Writer, c Config) (int64, error) {
	if err := c.Validate(); err != nil {
		return 0, fmt.Errorf("model shape: %w", err)
	}
	f := File(c)
	n, err := gguf.Encode(w, f)
	if err != nil {
		return n, fmt.Errorf("writing model %s: %w", c.Name, err)
	}
	return n, nil
}

// File is the GGUF file of the model c describes, its tensors' data still
// to be made (gguf.Encode makes it as it writes). c must be valid.
func File(c Config) gguf.File {
	v := NewVocabulary()
	e, ff, nv := uint64(c.Embedding), uint64(c.FeedForward), uint64(len(v.Tokens))
	name := c.Name
	if name == "" {
		name = "orchestra-model"
	}
	md := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: name},
		{Key: "general.description", Value: "A model made by Model Orchestra's generator (internal/modelgen) for tests: real shape and tokenizer, pseudo-random weights; its answers are gibberish."},
		{Key: "general.file_type", Value: fileTypeMostlyF16},
		{Key: "general.seed", Value: c.Seed},
		{Key: gguf.AlignmentKey, Value: uint32(gguf.DefaultAlignment)},
		{Key: "llama.vocab_size", Value: uint32(nv)},
		{Key: "llama.context_length", Value: uint32(c.Context)},
		{Key: "llama.embedding_length", Value: uint32(c.Embedding)},
		{Key: "llama.block_count", Value: uint32(c.Layers)},
		{Key: "llama.feed_forward_length", Value: uint32(c.FeedForward)},
		{Key: "llama.rope.dimension_count", Value: uint32(c.HeadSize())},
		{Key: "llama.rope.freq_base", Value: float32(10000)},
		{Key: "llama.attention.head_count", Value: uint32(c.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(c.Heads)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: "tokenizer.ggml.model", Value: "gpt2"},
		{Key: "tokenizer.ggml.pre", Value: "default"},
		{Key: "tokenizer.ggml.tokens", Value: v.Tokens},
		{Key: "tokenizer.ggml.token_type", Value: v.Types},
		{Key: "tokenizer.ggml.merges", Value: v.Merges},
		{Key: "tokenizer.ggml.bos_token_id", Value: v.BOS},
		{Key: "tokenizer.ggml.eos_token_id", Value: v.EOS},
		{Key: "tokenizer.ggml.add_bos_token", Value: true},
		{Key: "tokenizer.ggml.add_eos_token", Value: false},
		{Key: "tokenizer.chat_template", Value: ChatTemplate},
	}

	var ts []gguf.Tensor
	mat := func(name string, rows, cols uint64) {
		scale := float32(1 / math.Sqrt(float64(cols)))
		ts = append(ts, gguf.Tensor{Name: name, Shape: []uint64{cols, rows}, Type: gguf.TypeF16, Data: randomF16(c.Seed, name, rows*cols, scale)})
	}
	norm := func(name string) {
		ts = append(ts, gguf.Tensor{Name: name, Shape: []uint64{e}, Type: gguf.TypeF32, Data: onesF32(e)})
	}
	mat("token_embd.weight", nv, e)
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		norm(p + "attn_norm.weight")
		mat(p+"attn_q.weight", e, e)
		mat(p+"attn_k.weight", e, e)
		mat(p+"attn_v.weight", e, e)
		mat(p+"attn_output.weight", e, e)
		norm(p + "ffn_norm.weight")
		mat(p+"ffn_gate.weight", ff, e)
		mat(p+"ffn_up.weight", ff, e)
		mat(p+"ffn_down.weight", e, ff)
	}
	norm("output_norm.weight")
	mat("output.weight", nv, e)
	return gguf.File{Metadata: md, Tensors: ts}
}

// WriteFile writes the model c describes to path (through a temporary file
// in the same directory, renamed when complete, so a reader never sees half
// a model) and returns its sha256 in hex and its size.
func WriteFile(path string, c Config) (sha string, size int64, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return "", 0, fmt.Errorf("writing model: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	size, err = Write(io.MultiWriter(tmp, h), c)
	if err != nil {
		return "", 0, err
	}
	if err = tmp.Chmod(0o644); err != nil {
		return "", 0, fmt.Errorf("writing model: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return "", 0, fmt.Errorf("writing model %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return "", 0, fmt.Errorf("writing model: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}
