package stack

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/model-orchestra/operator/internal/hfllama"
)

// The demo's Hugging Face checkpoint, served by the mirror as
// hf://demo/tiny-llama-hf: safetensors and a tokenizer, which the fetch
// Job converts to GGUF (model.convert) for Ollama or llama.cpp.
const (
	DemoHFRepo  = "tiny-llama-hf"
	DemoHFModel = DemoOrg + "/" + DemoHFRepo
)

// TinyHFModelFiles returns the files of the demo checkpoint, by path:
// internal/hfllama's tiny llama (seed 1, untied output, two BF16 shards,
// a byte-level BPE tokenizer with the Llama 3 pre-tokenizer and chat
// template), about 200 KB.
func TinyHFModelFiles() map[string][]byte { return tinyHF() }

var tinyHF = sync.OnceValue(func() map[string][]byte {
	dir, err := os.MkdirTemp("", "tiny-llama-hf-")
	if err != nil {
		panic(fmt.Sprintf("generating the tiny checkpoint: %v", err))
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := hfllama.WriteTiny(dir, hfllama.TinyOptions{Seed: 1}); err != nil {
		panic(fmt.Sprintf("generating the tiny checkpoint: %v", err))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		panic(err)
	}
	files := map[string][]byte{"README.md": []byte("# tiny-llama-hf\n\nA tiny Hugging Face llama checkpoint (safetensors, internal/hfllama) for the Model Orchestra conversion demo: pseudo-random weights, gibberish answers.\n")}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		files[e.Name()] = b
	}
	return files
})

// WriteTinyHFModel writes the demo checkpoint under root as
// <root>/demo/tiny-llama-hf/..., leaving identical files alone.
func WriteTinyHFModel(root string) error {
	dir := filepath.Join(root, DemoOrg, DemoHFRepo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range TinyHFModelFiles() {
		p := filepath.Join(dir, name)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data) {
			continue
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("writing demo checkpoint file %s: %w", name, err)
		}
	}
	return nil
}
