// Package hfllama reads Hugging Face llama-family checkpoints (config.json,
// safetensors shards, tokenizer.json, tokenizer_config.json): their
// configuration, their byte-level BPE tokenizer and a reference forward pass
// that follows Hugging Face's LlamaForCausalLM. It also generates tiny
// deterministic checkpoints for tests and demos.
package hfllama

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/model-orchestra/operator/internal/safetensors"
)

// Config is the part of config.json a llama-family model is defined by.
type Config struct {
	Architectures         []string        `json:"architectures"`
	ModelType             string          `json:"model_type"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads,omitempty"`
	HeadDim               int             `json:"head_dim,omitempty"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	RopeTheta             float64         `json:"rope_theta,omitempty"`
	RopeScaling           json.RawMessage `json:"rope_scaling,omitempty"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	VocabSize             int             `json:"vocab_size"`
	TieWordEmbeddings     bool            `json:"tie_word_embeddings"`
	AttentionBias         bool            `json:"attention_bias,omitempty"`
	MLPBias               bool            `json:"mlp_bias,omitempty"`
	HiddenAct             string          `json:"hidden_act,omitempty"`
	BOSTokenID            *int            `json:"bos_token_id,omitempty"`
	EOSTokenID            json.RawMessage `json:"eos_token_id,omitempty"`
	TorchDType            string          `json:"torch_dtype,omitempty"`
}

// KVHeads is the number of key/value heads (grouped-query attention).
func (c Config) KVHeads() int {
	if c.NumKeyValueHeads > 0 {
		return c.NumKeyValueHeads
	}
	return c.NumAttentionHeads
}

// HeadDimension is the size of one attention head.
func (c Config) HeadDimension() int {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	return c.HiddenSize / c.NumAttentionHeads
}

// Theta is the rotary base frequency (10000 when config.json omits it).
func (c Config) Theta() float64 {
	if c.RopeTheta > 0 {
		return c.RopeTheta
	}
	return 10000
}

// EOSTokenIDs are the end-of-sequence ids (config.json has one or a list).
func (c Config) EOSTokenIDs() []int {
	var one int
	if json.Unmarshal(c.EOSTokenID, &one) == nil {
		return []int{one}
	}
	var many []int
	_ = json.Unmarshal(c.EOSTokenID, &many)
	return many
}

// ErrUnsupported marks a checkpoint this package (and the converter) cannot
// handle; the message names what is missing or unsupported.
var ErrUnsupported = errors.New("unsupported checkpoint")

// SupportedArchitectures are the config.json architectures of the llama
// family read here.
var SupportedArchitectures = []string{"LlamaForCausalLM", "MistralForCausalLM"}

// Check reports what makes the configuration unusable, naming it.
func (c Config) Check() error {
	var problems []string
	arch := strings.Join(c.Architectures, ",")
	ok := false
	for _, a := range c.Architectures {
		for _, s := range SupportedArchitectures {
			ok = ok || a == s
		}
	}
	if !ok {
		problems = append(problems, fmt.Sprintf("architecture %q (supported: %s)", arch, strings.Join(SupportedArchitectures, ", ")))
	}
	if c.HiddenSize <= 0 || c.NumHiddenLayers <= 0 || c.NumAttentionHeads <= 0 || c.IntermediateSize <= 0 || c.VocabSize <= 0 {
		problems = append(problems, "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size must be positive")
	} else {
		if c.NumAttentionHeads%c.KVHeads() != 0 {
			problems = append(problems, fmt.Sprintf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.NumAttentionHeads, c.KVHeads()))
		}
		if c.HeadDimension()%2 != 0 {
			problems = append(problems, fmt.Sprintf("head dimension %d is odd", c.HeadDimension()))
		}
	}
	if len(c.RopeScaling) > 0 && string(c.RopeScaling) != "null" {
		problems = append(problems, "rope_scaling "+string(c.RopeScaling))
	}
	if c.AttentionBias {
		problems = append(problems, "attention_bias true")
	}
	if c.MLPBias {
		problems = append(problems, "mlp_bias true")
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" {
		problems = append(problems, fmt.Sprintf("hidden_act %q (only silu)", c.HiddenAct))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrUnsupported, strings.Join(problems, "; "))
	}
	return nil
}

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (Config, error) {
	var c Config
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return c, fmt.Errorf("%w: config.json is missing", ErrUnsupported)
		}
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%w: config.json: %w", ErrUnsupported, err)
	}
	return c, nil
}

// Checkpoint is a checkpoint directory with its safetensors shards open.
type Checkpoint struct {
	Dir    string
	Config Config
	Shards []*safetensors.File
	index  map[string]int // tensor name -> shard
}

// ShardFiles lists the *.safetensors files of dir, sorted.
func ShardFiles(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return files, nil
}

// Open reads config.json and opens every safetensors shard of dir.
func Open(dir string) (*Checkpoint, error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	files, err := ShardFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no *.safetensors file", ErrUnsupported)
	}
	ck := &Checkpoint{Dir: dir, Config: cfg, index: map[string]int{}}
	for _, f := range files {
		sf, err := safetensors.Open(f)
		if err != nil {
			_ = ck.Close()
			return nil, err
		}
		for _, t := range sf.Tensors {
			if _, dup := ck.index[t.Name]; dup {
				_ = ck.Close()
				return nil, fmt.Errorf("tensor %s is in two shards", t.Name)
			}
			ck.index[t.Name] = len(ck.Shards)
		}
		ck.Shards = append(ck.Shards, sf)
	}
	return ck, nil
}

// Close closes the shards.
func (ck *Checkpoint) Close() error {
	var err error
	for _, s := range ck.Shards {
		err = errors.Join(err, s.Close())
	}
	return err
}

// Has reports whether the checkpoint holds the named tensor.
func (ck *Checkpoint) Has(name string) bool {
	_, ok := ck.index[name]
	return ok
}

// Tensor returns a tensor's header entry and its shard.
func (ck *Checkpoint) Tensor(name string) (safetensors.Tensor, *safetensors.File, error) {
	i, ok := ck.index[name]
	if !ok {
		return safetensors.Tensor{}, nil, fmt.Errorf("%w: tensor %s is missing", ErrUnsupported, name)
	}
	t, _ := ck.Shards[i].Tensor(name)
	return t, ck.Shards[i], nil
}

// Float32 reads a tensor as float32, checking its shape.
func (ck *Checkpoint) Float32(name string, shape ...int64) ([]float32, error) {
	t, sf, err := ck.Tensor(name)
	if err != nil {
		return nil, err
	}
	if !sameShape(t.Shape, shape) {
		return nil, fmt.Errorf("%w: tensor %s has shape %v, expected %v", ErrUnsupported, name, t.Shape, shape)
	}
	return sf.Float32(t)
}

func sameShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TensorNames lists every tensor of the checkpoint, sorted.
func (ck *Checkpoint) TensorNames() []string {
	names := make([]string, 0, len(ck.index))
	for n := range ck.index {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
