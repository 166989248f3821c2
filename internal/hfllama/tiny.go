package hfllama

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/model-orchestra/operator/internal/safetensors"
)

// TinyOptions shape a generated checkpoint. Zero values take the defaults
// of DefaultTiny.
type TinyOptions struct {
	Seed uint64
	// Tied shares the embedding with the output (tie_word_embeddings, no
	// lm_head.weight); untied writes its own lm_head.weight.
	Tied         bool
	Hidden       int
	Layers       int
	Heads        int
	KVHeads      int
	Intermediate int
	Merges       int
	MaxPositions int
	// DType of the weights: BF16 (default), F16 or F32.
	DType safetensors.DType
	// Shards is the number of safetensors files (default 2, with
	// model.safetensors.index.json).
	Shards int
}

// DefaultTiny is a two-layer model with grouped-query attention (4 query
// heads sharing 2 key/value heads of 16 dimensions) and 389 tokens.
var DefaultTiny = TinyOptions{Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 128, Merges: 128, MaxPositions: 256, DType: safetensors.BF16, Shards: 2}

// Special tokens of the generated tokenizer, in id order after the BPE
// vocabulary (Llama 3's names).
var tinySpecials = []string{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}

// TinyChatTemplate is the generated tokenizer's chat template: Llama 3
// Instruct's, character for character, so that engines which recognise
// known templates (Ollama) recognise it.
const TinyChatTemplate = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"

// tinyCorpus trains the generated tokenizer's merges.
const tinyCorpus = `The model orchestra serves language models on Kubernetes. A model is fetched once into a cache,
converted when the engine needs another format, and served by engines that share the work. The quick brown
fox jumps over the lazy dog. Tokens are pieces of text; the tokenizer splits the text into words and merges
frequent pairs of bytes into longer tokens. Hello world! It's 2026 and we're testing the conversion of weights
from safetensors to GGUF, at sixteen bits and at eight bits. Numbers like 12345 and 42 are split in groups of three.`

// WriteTiny writes a deterministic llama checkpoint into dir (created if
// needed): config.json, safetensors shards (and their index when there
// are several), tokenizer.json, tokenizer_config.json and
// generation_config.json.
func WriteTiny(dir string, o TinyOptions) error {
	d := DefaultTiny
	if o.Hidden == 0 {
		o.Hidden = d.Hidden
	}
	if o.Layers == 0 {
		o.Layers = d.Layers
	}
	if o.Heads == 0 {
		o.Heads = d.Heads
	}
	if o.KVHeads == 0 {
		o.KVHeads = d.KVHeads
	}
	if o.Intermediate == 0 {
		o.Intermediate = d.Intermediate
	}
	if o.Merges == 0 {
		o.Merges = d.Merges
	}
	if o.MaxPositions == 0 {
		o.MaxPositions = d.MaxPositions
	}
	if o.DType == "" {
		o.DType = d.DType
	}
	if o.Shards == 0 {
		o.Shards = d.Shards
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tokens, merges := trainBPE(tinyCorpus, o.Merges)
	vocab := len(tokens) + len(tinySpecials)
	bos, eos, eot := len(tokens), len(tokens)+1, len(tokens)+4

	cfg := map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"hidden_size":             o.Hidden,
		"intermediate_size":       o.Intermediate,
		"num_hidden_layers":       o.Layers,
		"num_attention_heads":     o.Heads,
		"num_key_value_heads":     o.KVHeads,
		"head_dim":                o.Hidden / o.Heads,
		"hidden_act":              "silu",
		"rms_norm_eps":            1e-5,
		"rope_theta":              10000.0,
		"rope_scaling":            nil,
		"max_position_embeddings": o.MaxPositions,
		"vocab_size":              vocab,
		"tie_word_embeddings":     o.Tied,
		"attention_bias":          false,
		"mlp_bias":                false,
		"bos_token_id":            bos,
		"eos_token_id":            []int{eos, eot},
		"torch_dtype":             map[safetensors.DType]string{safetensors.BF16: "bfloat16", safetensors.F16: "float16", safetensors.F32: "float32"}[o.DType],
		"transformers_version":    "4.46.0",
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), cfg); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "generation_config.json"), map[string]any{"bos_token_id": bos, "eos_token_id": []int{eos, eot}}); err != nil {
		return err
	}

	// Weights. Larger than a trained model's initialisation, so that
	// attention is sharp (a wrong rotary layout changes the output) and
	// greedy choices are well separated.
	rng := rand.New(rand.NewPCG(o.Seed, 0x6f72636865737472))
	normal := func(n int, std float64) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * std)
		}
		return w
	}
	ones := func(n int) []float32 {
		w := normal(n, 0.1)
		for i := range w {
			w[i] += 1
		}
		return w
	}
	h, hd := o.Hidden, o.Hidden/o.Heads
	// With a tied head the residual stream's copy of the input embedding
	// would make every token predict itself; stronger attention and MLP
	// outputs let the context decide.
	outGain := 1.0
	if o.Tied {
		outGain = 4
	}
	type named struct {
		name  string
		shape []int64
		w     []float32
	}
	var ws []named
	add := func(name string, w []float32, shape ...int64) { ws = append(ws, named{name, shape, w}) }
	// The output rows of the byte tokens 0x80-0xff are damped to 1%:
	// their logits stay near 0 while the others spread around it, so
	// greedy text is valid UTF-8 (engines hold back and drop partial
	// UTF-8 sequences when they stream, which would hide tokens).
	damp := func(w []float32) []float32 {
		for id := 0x80; id <= 0xff; id++ {
			for i := id * h; i < (id+1)*h; i++ {
				w[i] *= 0.01
			}
		}
		return w
	}
	embed := normal(vocab*h, 1)
	if o.Tied {
		embed = damp(embed)
	}
	add(NameEmbed, embed, int64(vocab), int64(h))
	for i := 0; i < o.Layers; i++ {
		in := 1 / math.Sqrt(float64(h))
		add(LayerName(i, "input_layernorm"), ones(h), int64(h))
		add(LayerName(i, "self_attn.q_proj"), normal(o.Heads*hd*h, in), int64(o.Heads*hd), int64(h))
		add(LayerName(i, "self_attn.k_proj"), normal(o.KVHeads*hd*h, in), int64(o.KVHeads*hd), int64(h))
		add(LayerName(i, "self_attn.v_proj"), normal(o.KVHeads*hd*h, in), int64(o.KVHeads*hd), int64(h))
		add(LayerName(i, "self_attn.o_proj"), normal(h*o.Heads*hd, outGain/math.Sqrt(float64(o.Heads*hd))), int64(h), int64(o.Heads*hd))
		add(LayerName(i, "post_attention_layernorm"), ones(h), int64(h))
		add(LayerName(i, "mlp.gate_proj"), normal(o.Intermediate*h, in), int64(o.Intermediate), int64(h))
		add(LayerName(i, "mlp.up_proj"), normal(o.Intermediate*h, in), int64(o.Intermediate), int64(h))
		add(LayerName(i, "mlp.down_proj"), normal(h*o.Intermediate, outGain/math.Sqrt(float64(o.Intermediate))), int64(h), int64(o.Intermediate))
	}
	add(NameNorm, ones(h), int64(h))
	if !o.Tied {
		add(NameLMHead, damp(normal(vocab*h, 4/math.Sqrt(float64(h)))), int64(vocab), int64(h))
	}

	// shards of about equal size, in order
	var total int
	for _, w := range ws {
		total += len(w.w)
	}
	weightMap := map[string]string{}
	var shard []safetensors.WriteTensor
	k, acc := 1, 0
	flush := func() error {
		name := "model.safetensors"
		if o.Shards > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", k, o.Shards)
		}
		for _, t := range shard {
			weightMap[t.Name] = name
		}
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := safetensors.Write(f, shard, map[string]string{"format": "pt"}); err != nil {
			_ = f.Close()
			return err
		}
		shard = nil
		k++
		return f.Close()
	}
	for _, w := range ws {
		shard = append(shard, safetensors.WriteTensor{Name: w.name, DType: o.DType, Shape: w.shape, Data: encode(o.DType, w.w)})
		acc += len(w.w)
		if k < o.Shards && acc >= total*k/o.Shards {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if o.Shards > 1 {
		idx := map[string]any{"metadata": map[string]any{"total_size": total * o.DType.Size()}, "weight_map": weightMap}
		if err := writeJSON(filepath.Join(dir, "model.safetensors.index.json"), idx); err != nil {
			return err
		}
	}

	// tokenizer.json in the shape Llama 3's has
	vocabMap := make(map[string]int, len(tokens))
	for i, t := range tokens {
		vocabMap[t] = i
	}
	var added []map[string]any
	for i, s := range tinySpecials {
		added = append(added, map[string]any{"id": len(tokens) + i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	pairs := make([][2]string, len(merges))
	for i, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		pairs[i] = [2]string{a, b}
	}
	tj := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]string{"Regex": Llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": tinySpecials[0], "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{tinySpecials[0]: map[string]any{"id": tinySpecials[0], "ids": []int{bos}, "tokens": []string{tinySpecials[0]}}},
		},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
			"vocab": vocabMap, "merges": pairs},
	}
	if err := writeJSON(filepath.Join(dir, "tokenizer.json"), tj); err != nil {
		return err
	}
	tc := map[string]any{
		"add_bos_token":    true,
		"bos_token":        tinySpecials[0],
		"eos_token":        tinySpecials[4],
		"chat_template":    TinyChatTemplate,
		"model_max_length": o.MaxPositions,
		"tokenizer_class":  "PreTrainedTokenizerFast",
	}
	return writeJSON(filepath.Join(dir, "tokenizer_config.json"), tc)
}

func encode(d safetensors.DType, w []float32) []byte {
	switch d {
	case safetensors.F32:
		b := make([]byte, 4*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b
	case safetensors.F16:
		b := make([]byte, 2*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint16(b[2*i:], safetensors.F32ToF16(v))
		}
		return b
	}
	b := make([]byte, 2*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint16(b[2*i:], safetensors.F32ToBF16(v))
	}
	return b
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// trainBPE returns the 256 byte tokens followed by up to n merged tokens
// learnt from corpus (the most frequent adjacent pair each round, ties to
// the smallest pair), and the merges in rank order.
func trainBPE(corpus string, n int) (tokens, merges []string) {
	for b := 0; b < 256; b++ {
		tokens = append(tokens, string(byteToRune(byte(b))))
	}
	counts := map[string]int{}
	for _, p := range PreTokenize(corpus) {
		counts[ByteLevel(p)]++
	}
	type word struct {
		syms  []string
		count int
	}
	var words []word
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var syms []string
		for _, r := range k {
			syms = append(syms, string(r))
		}
		words = append(words, word{syms, counts[k]})
	}
	for len(merges) < n {
		pc := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pc[[2]string{w.syms[i], w.syms[i+1]}] += w.count
			}
		}
		var best [2]string
		bestN := 1
		for p, c := range pc {
			if c > bestN || (c == bestN && c > 1 && (p[0]+" "+p[1]) < (best[0]+" "+best[1])) {
				best, bestN = p, c
			}
		}
		if bestN < 2 {
			break
		}
		merged := best[0] + best[1]
		merges = append(merges, best[0]+" "+best[1])
		tokens = append(tokens, merged)
		for wi := range words {
			s := words[wi].syms
			out := s[:0:0]
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best[0] && s[i+1] == best[1] {
					out = append(out, merged)
					i++
					continue
				}
				out = append(out, s[i])
			}
			words[wi].syms = out
		}
	}
	return tokens, merges
}
