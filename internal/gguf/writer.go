package gguf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Magic opens every GGUF file ("GGUF" read as a little-endian uint32).
const Magic uint32 = 0x46554747

// Version is the GGUF version Encode writes.
const Version uint32 = 3

// File is what Encode writes: metadata in order, then tensors in order.
type File struct {
	Metadata []KV
	Tensors  []Tensor
}

// Tensor is one tensor: its info and the function that produces its bytes.
type Tensor struct {
	// Name is unique in the file, at most 64 bytes (token_embd.weight).
	Name string
	// Shape is in ggml order: Shape[0] is the row length (the
	// fastest-varying dimension), 1 to 4 dimensions.
	Shape []uint64
	// Type is the ggml type of the data.
	Type Type
	// Data writes exactly Type.DataSize(Shape) bytes to w; Encode calls it
	// once, when the writer reaches the tensor. Writes are buffered.
	Data func(w io.Writer) error
}

// Bytes returns a Tensor.Data that writes b.
func Bytes(b []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}
}

// ErrTensorSize is returned when a tensor's Data wrote more or fewer bytes
// than its shape and type take.
var ErrTensorSize = errors.New("tensor data size does not match its shape and type")

// maxNameLen is GGML_MAX_NAME - 1: llama.cpp refuses longer tensor names.
const maxNameLen = 63

// Encode writes f as GGUF v3 to w and returns the bytes written. It checks
// the whole header (names, shapes, types, metadata values) before writing
// anything.
func Encode(w io.Writer, f File) (int64, error) {
	align, err := alignment(f.Metadata)
	if err != nil {
		return 0, err
	}
	seen := make(map[string]bool, len(f.Metadata))
	for _, kv := range f.Metadata {
		if kv.Key == "" {
			return 0, errors.New("metadata with an empty key")
		}
		if seen[kv.Key] {
			return 0, fmt.Errorf("metadata %q appears twice", kv.Key)
		}
		seen[kv.Key] = true
		if kv.Value == nil {
			return 0, fmt.Errorf("metadata %q: no value", kv.Key)
		}
		if _, err := valueType(reflect.TypeOf(kv.Value)); err != nil {
			return 0, fmt.Errorf("metadata %q: %w", kv.Key, err)
		}
	}
	sizes := make([]uint64, len(f.Tensors))
	offsets := make([]uint64, len(f.Tensors))
	names := make(map[string]bool, len(f.Tensors))
	var off uint64
	for i, t := range f.Tensors {
		if t.Name == "" || len(t.Name) > maxNameLen || strings.ContainsRune(t.Name, 0) {
			return 0, fmt.Errorf("tensor %d: name %q: want 1 to %d bytes", i, t.Name, maxNameLen)
		}
		if names[t.Name] {
			return 0, fmt.Errorf("tensor %q appears twice", t.Name)
		}
		names[t.Name] = true
		if t.Data == nil {
			return 0, fmt.Errorf("tensor %q: no data", t.Name)
		}
		size, err := t.Type.DataSize(t.Shape)
		if err != nil {
			return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		sizes[i], offsets[i] = size, off
		off = alignUp(off+size, align)
	}

	bw := bufio.NewWriterSize(w, 1<<20)
	e := &encoder{w: bw}
	e.u32(Magic)
	e.u32(Version)
	e.u64(uint64(len(f.Tensors)))
	e.u64(uint64(len(f.Metadata)))
	for _, kv := range f.Metadata {
		if err := e.kv(kv); err != nil {
			return e.n, err
		}
	}
	for i, t := range f.Tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(offsets[i])
	}
	e.pad(align)
	for i, t := range f.Tensors {
		if e.err != nil {
			break
		}
		cw := &countingWriter{w: bw}
		if err := t.Data(cw); err != nil {
			return e.n + cw.n, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		e.n += cw.n
		if uint64(cw.n) != sizes[i] {
			return e.n, fmt.Errorf("tensor %q (%s %v): wrote %d bytes, want %d: %w", t.Name, t.Type, t.Shape, cw.n, sizes[i], ErrTensorSize)
		}
		if i < len(f.Tensors)-1 {
			e.pad(align)
		}
	}
	if e.err == nil {
		e.err = bw.Flush()
	}
	return e.n, e.err
}

// pad writes zeros up to the next multiple of align.
func (e *encoder) pad(align uint64) {
	n := alignUp(uint64(e.n), align) - uint64(e.n)
	if n > 0 {
		e.write(make([]byte, n))
	}
}

func alignUp(n, align uint64) uint64 { return (n + align - 1) / align * align }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
