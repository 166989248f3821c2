package gguf

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"reflect"
)

// ValueType is the type of a metadata value (gguf.md, gguf_metadata_value_type).
type ValueType uint32

// The metadata value types.
const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

// KV is one metadata key/value. Value is a Go value of a fixed width that
// names its GGUF type: uint8, int8, uint16, int16, uint32, int32, float32,
// bool, string, uint64, int64 or float64; or a slice of one of them (a GGUF
// array), or a slice of slices (an array of arrays). int, uint and other
// types are refused: their width would be a guess.
type KV struct {
	Key   string
	Value any
}

// AlignmentKey is the metadata key of the tensor data alignment.
const AlignmentKey = "general.alignment"

// DefaultAlignment is the alignment when the file does not set one.
const DefaultAlignment = 32

var kindTypes = map[reflect.Kind]ValueType{
	reflect.Uint8:   ValueUint8,
	reflect.Int8:    ValueInt8,
	reflect.Uint16:  ValueUint16,
	reflect.Int16:   ValueInt16,
	reflect.Uint32:  ValueUint32,
	reflect.Int32:   ValueInt32,
	reflect.Float32: ValueFloat32,
	reflect.Bool:    ValueBool,
	reflect.String:  ValueString,
	reflect.Uint64:  ValueUint64,
	reflect.Int64:   ValueInt64,
	reflect.Float64: ValueFloat64,
}

// valueType is the GGUF type of a Go value (see KV).
func valueType(t reflect.Type) (ValueType, error) {
	if t.Kind() == reflect.Slice {
		if _, err := valueType(t.Elem()); err != nil {
			return 0, err
		}
		return ValueArray, nil
	}
	if vt, ok := kindTypes[t.Kind()]; ok {
		return vt, nil
	}
	return 0, fmt.Errorf("type %s has no GGUF metadata type (use a fixed-width integer, float32/64, bool, string or a slice of them)", t)
}

// encoder writes little-endian GGUF primitives and remembers the first error.
type encoder struct {
	w   io.Writer
	n   int64
	err error
	buf [8]byte
}

func (e *encoder) write(p []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(p)
	e.n += int64(n)
	e.err = err
}

func (e *encoder) u8(v uint8)   { e.buf[0] = v; e.write(e.buf[:1]) }
func (e *encoder) u16(v uint16) { binary.LittleEndian.PutUint16(e.buf[:], v); e.write(e.buf[:2]) }
func (e *encoder) u32(v uint32) { binary.LittleEndian.PutUint32(e.buf[:], v); e.write(e.buf[:4]) }
func (e *encoder) u64(v uint64) { binary.LittleEndian.PutUint64(e.buf[:], v); e.write(e.buf[:8]) }

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		n, err := io.WriteString(e.w, s)
		e.n += int64(n)
		e.err = err
	}
}

// kv writes one key/value.
func (e *encoder) kv(kv KV) error {
	if kv.Value == nil {
		return fmt.Errorf("metadata %q: no value", kv.Key)
	}
	v := reflect.ValueOf(kv.Value)
	vt, err := valueType(v.Type())
	if err != nil {
		return fmt.Errorf("metadata %q: %w", kv.Key, err)
	}
	e.str(kv.Key)
	e.u32(uint32(vt))
	e.value(v)
	return nil
}

// value writes a value whose type valueType accepted, without its type tag
// (arrays carry their element type).
func (e *encoder) value(v reflect.Value) {
	switch v.Kind() {
	case reflect.Uint8:
		e.u8(uint8(v.Uint()))
	case reflect.Int8:
		e.u8(uint8(v.Int()))
	case reflect.Uint16:
		e.u16(uint16(v.Uint()))
	case reflect.Int16:
		e.u16(uint16(v.Int()))
	case reflect.Uint32:
		e.u32(uint32(v.Uint()))
	case reflect.Int32:
		e.u32(uint32(v.Int()))
	case reflect.Uint64:
		e.u64(v.Uint())
	case reflect.Int64:
		e.u64(uint64(v.Int()))
	case reflect.Float32:
		e.u32(math.Float32bits(float32(v.Float())))
	case reflect.Float64:
		e.u64(math.Float64bits(v.Float()))
	case reflect.Bool:
		if v.Bool() {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case reflect.String:
		e.str(v.String())
	case reflect.Slice:
		et, _ := valueType(v.Type().Elem())
		e.u32(uint32(et))
		e.u64(uint64(v.Len()))
		if v.Type().Elem().Kind() == reflect.Uint8 {
			e.write(v.Bytes())
			return
		}
		for i := 0; i < v.Len() && e.err == nil; i++ {
			e.value(v.Index(i))
		}
	}
}

// alignment reads general.alignment from the metadata: a uint32, a
// multiple of 8.
func alignment(md []KV) (uint64, error) {
	for _, kv := range md {
		if kv.Key != AlignmentKey {
			continue
		}
		a, ok := kv.Value.(uint32)
		if !ok {
			return 0, fmt.Errorf("metadata %s must be a uint32, not %T", AlignmentKey, kv.Value)
		}
		if a == 0 || a%8 != 0 {
			return 0, fmt.Errorf("metadata %s is %d: want a positive multiple of 8", AlignmentKey, a)
		}
		return uint64(a), nil
	}
	return DefaultAlignment, nil
}
