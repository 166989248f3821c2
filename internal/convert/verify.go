package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	ggufparser "github.com/gpustack/gguf-parser-go"
)

// verify re-reads a written file: its size, its sha256 against the one
// computed while writing, and its header parsed by an independent GGUF
// reader with the expected number of tensors.
func verify(path string, size int64, sum string, tensors int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%d bytes on disk, %d written", n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("sha256 on disk %s, written %s", got, sum)
	}
	gf, err := ggufparser.ParseGGUFFile(path)
	if err != nil {
		return fmt.Errorf("parsing the header: %w", err)
	}
	if int(gf.Header.TensorCount) != tensors || len(gf.TensorInfos) != tensors {
		return fmt.Errorf("header lists %d tensors, %d written", gf.Header.TensorCount, tensors)
	}
	return nil
}
