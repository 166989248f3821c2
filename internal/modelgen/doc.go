// Package modelgen writes llama-architecture GGUF models that real engines
// (Ollama, llama.cpp) load and run: a byte-level BPE tokenizer of the gpt2
// kind trained here on a small built-in text, a ChatML chat template, and
// deterministic pseudo-random F16 weights from a seed. Their answers are
// gibberish; everything around them is real: tokenizer, forward pass,
// sampling, streaming, usage counts, load and unload.
//
// Tiny is the model of the tests and the demo (2 layers, about 300 KB);
// ForSize scales the same shape to hundreds of MiB or a few GiB for
// benchmarks where loading must take visible time.
//
// Files:
//
//	doc.go        this overview
//	config.go     Config: the model's dimensions, Tiny, ForSize, ParseSize
//	tokenizer.go  the byte-level BPE vocabulary, merges and chat template
//	weights.go    deterministic tensor data
//	write.go      Write: the GGUF file (metadata + tensors) via internal/gguf
//	corpus.txt    the text the tokenizer's merges are learnt from
package modelgen
