package fetch

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// checkFormat makes sure the cache holds a loadable model of the requested
// format: the right files exist and their headers are what the engine reads.
func checkFormat(dir, format string, files []ManifestFile) error {
	if format == "" {
		return nil
	}
	var matched int
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		ext := strings.ToLower(path.Ext(f.Path))
		var err error
		switch {
		case format == FormatGGUF && ext == ".gguf":
			err = checkGGUF(p)
		case format == FormatSafetensors && ext == ".safetensors":
			err = checkSafetensors(p, f.Size)
		case format == FormatDllama && (ext == ".m" || ext == ".t"):
			if f.Size == 0 {
				err = fmt.Errorf("empty file")
			}
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %s is not a valid %s file: %w", ErrVerification, f.Path, format, err)
		}
		matched++
	}
	switch format {
	case FormatGGUF:
		if matched == 0 {
			return fmt.Errorf("%w: format gguf: no .gguf file in the selection", ErrVerification)
		}
	case FormatSafetensors:
		if matched == 0 {
			return fmt.Errorf("%w: format safetensors: no .safetensors file in the selection", ErrVerification)
		}
	case FormatDllama:
		var m, t bool
		for _, f := range files {
			m = m || strings.HasSuffix(f.Path, ".m")
			t = t || strings.HasSuffix(f.Path, ".t")
		}
		if !m || !t {
			return fmt.Errorf("%w: format dllama needs a model (.m) and a tokenizer (.t) file", ErrVerification)
		}
	}
	return nil
}

func readHeader(p string, n int) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // opened read-only
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("reading header: %w", err)
	}
	return b, nil
}

// checkGGUF checks the magic and a known version.
func checkGGUF(p string) error {
	h, err := readHeader(p, 8)
	if err != nil {
		return err
	}
	if string(h[:4]) != "GGUF" {
		return fmt.Errorf("bad magic %q", h[:4])
	}
	if v := binary.LittleEndian.Uint32(h[4:]); v < 1 || v > 3 {
		return fmt.Errorf("unsupported GGUF version %d", v)
	}
	return nil
}

// checkSafetensors checks the 8-byte header length and that the JSON header
// starts inside the file.
func checkSafetensors(p string, size int64) error {
	h, err := readHeader(p, 9)
	if err != nil {
		return err
	}
	n := binary.LittleEndian.Uint64(h[:8])
	if n == 0 || n > 100<<20 || int64(n)+8 > size {
		return fmt.Errorf("header length %d does not fit a %d-byte file", n, size)
	}
	if h[8] != '{' {
		return fmt.Errorf("header is not JSON")
	}
	return nil
}
