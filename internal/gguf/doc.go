// Package gguf writes GGUF v3 files, the model format of llama.cpp and
// Ollama (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
//
// A file is a header (magic, version, tensor and metadata counts), the
// metadata key/values, one info record per tensor (name, shape, ggml type,
// offset into the data section), padding to the alignment, and the tensor
// data, each tensor starting at a multiple of the alignment
// (general.alignment, default 32). Encode streams all of it to an
// io.Writer: the header is computed from the tensors' shapes and types,
// and each tensor's bytes are produced by its own Data function as the
// writer reaches it, so files of many GiB never sit in memory.
//
// Files:
//
//	doc.go       this overview
//	metadata.go  metadata key/values: the GGUF value types and their encoding
//	types.go     ggml tensor types: block sizes, byte sizes, names
//	writer.go    Encode: header, tensor infos, alignment, streamed tensor data
//	float16.go   IEEE half-precision conversion for F16 tensors
//
// Quantized types (Q8_0, Q4_0, ...) need only a function that turns float32
// rows into the type's blocks; the writer already knows every type's size.
package gguf
