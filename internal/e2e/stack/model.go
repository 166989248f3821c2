// Package stack drives a Model Orchestra stack on a real cluster, the way a
// user would: it installs the operator from its install chart, applies a
// ModelOrchestra whose model the operator's own fetch Job downloads from the
// local Hugging Face mirror (model.hubEndpoint), waits for it to be Ready
// (explaining why when it is not), and talks to the gateway's OpenAI API. The `make run` demo (hack/demo) and the end-to-end
// tests (internal/e2e) share it, so the demo shows exactly what the tests
// check.
package stack

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/model-orchestra/operator/internal/modelgen"
)

// Demo model repository served by the mirror: hf://DemoOrg/DemoRepo.
const (
	DemoOrg   = "demo"
	DemoRepo  = "tiny-gguf"
	DemoModel = DemoOrg + "/" + DemoRepo
	// DemoFile is the GGUF file the engine is told to load.
	DemoFile = "tiny-demo.gguf"
	// NodeAddress is the real node's address in the local cluster: pods
	// reach host processes listening on it (docs/localcluster.md).
	NodeAddress = "10.123.0.1"
)

// TinyModelFiles returns the files of the demo repository, by path: the
// generated tiny llama model (internal/modelgen: 2 layers, a real gpt2
// tokenizer and the ChatML template, about 300 KB) that Ollama and
// llama.cpp load and the simulator reads as its weights, a config.json of
// the same shape and a README. The mirror serves the GGUF file as an LFS
// file with its sha256, so the fetcher verifies a real model.
func TinyModelFiles() map[string][]byte {
	tiny := modelgen.Tiny()
	return map[string][]byte{
		DemoFile:      tinyModel(),
		"config.json": []byte(fmt.Sprintf(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","max_position_embeddings":%d,"hidden_size":%d,"num_hidden_layers":%d,"num_attention_heads":%d,"intermediate_size":%d,"vocab_size":%d}`+"\n", tiny.Context, tiny.Embedding, tiny.Layers, tiny.Heads, tiny.FeedForward, modelgen.VocabSize)),
		"README.md":   []byte("# tiny-gguf\n\nThe tiny llama model of the Model Orchestra demo and tests, made by `orchestra generate-model` (internal/modelgen): a real tokenizer and chat template, pseudo-random weights, gibberish answers.\n"),
	}
}

// tinyModel is the generated tiny model's GGUF file, made once.
var tinyModel = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	if _, err := modelgen.Write(&b, modelgen.Tiny()); err != nil {
		panic(fmt.Sprintf("generating the tiny model: %v", err)) // a fixed, valid config
	}
	return b.Bytes()
})

// WriteTinyModel writes the demo repository under root as
// <root>/<org>/<repo>/..., the layout hack/hubmirror serves. A file that
// already has the right content is left alone (a running mirror keeps
// serving it).
func WriteTinyModel(root string) error {
	dir := filepath.Join(root, DemoOrg, DemoRepo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range TinyModelFiles() {
		p := filepath.Join(dir, name)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data) {
			continue
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("writing demo model file %s: %w", name, err)
		}
	}
	return nil
}
