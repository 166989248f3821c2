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
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
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

// TinyModelFiles returns the files of the demo repository, by path: a
// GGUF file with a valid header and metadata but no tensors (the simulator
// reads only metadata, and orchestra-fetch --format=gguf checks the magic
// and version), a config.json and a README.
func TinyModelFiles() map[string][]byte {
	return map[string][]byte{
		DemoFile: tinyGGUF(map[string]any{
			"general.architecture":   "llama",
			"general.name":           "orchestra-demo-tiny",
			"llama.context_length":   uint32(2048),
			"llama.embedding_length": uint32(64),
			"llama.block_count":      uint32(2),
		}),
		"config.json": []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","max_position_embeddings":2048,"hidden_size":64,"num_hidden_layers":2}` + "\n"),
		"README.md":   []byte("# tiny-gguf\n\nA metadata-only GGUF model for the Model Orchestra demo and end-to-end tests.\n"),
	}
}

// WriteTinyModel writes the demo repository under root as
// <root>/<org>/<repo>/..., the layout hack/hubmirror serves.
func WriteTinyModel(root string) error {
	dir := filepath.Join(root, DemoOrg, DemoRepo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range TinyModelFiles() {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("writing demo model file %s: %w", name, err)
		}
	}
	return nil
}

// tinyGGUF encodes a GGUF v3 file with the given metadata (uint32 and
// string values) and no tensors.
func tinyGGUF(meta map[string]any) []byte {
	const (
		typeUint32 = 4
		typeString = 8
	)
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	le(uint32(3))         // version
	le(uint64(0))         // tensors
	le(uint64(len(meta))) // metadata key/value pairs
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		str(k)
		switch v := meta[k].(type) {
		case uint32:
			le(uint32(typeUint32))
			le(v)
		case string:
			le(uint32(typeString))
			str(v)
		default:
			panic(fmt.Sprintf("gguf metadata %s: unsupported type %T", k, v))
		}
	}
	// Pad to the default alignment, as writers do before tensor data.
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}
