package modelsize

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/convert"
	"github.com/model-orchestra/operator/internal/hfllama"
)

func TestReadAndFit(t *testing.T) {
	dir := t.TempDir()
	o := hfllama.TinyOptions{Seed: 1, Hidden: 256, Intermediate: 1024, Layers: 4, MaxPositions: 2048}
	if err := hfllama.WriteTiny(dir, o); err != nil {
		t.Fatal(err)
	}
	res, err := convert.Run(context.Background(), convert.Options{Dir: dir, Type: convert.Q8_0})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, res.Output)
	small, err := Read(path, 512, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	big, err := Read(path, 0, 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("small %+v (%s)\nbig %+v (%s)", small, small.Summary(), big, big.Summary())
	if small.Architecture != "llama" || small.WeightType != "Q8_0" || small.ContextLength != 2048 || small.FileBytes != res.Size {
		t.Errorf("header: %+v", small)
	}
	// 4 layers of 4·256·256/2 + 3·256·1024, plus the embedding and head
	cfg, err := hfllama.ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := int64(cfg.VocabSize)
	wantParams := int64(4*(256*256*2+256*128*2+3*256*1024+2*256)) + 2*v*256 + 256
	if small.Parameters != wantParams {
		t.Errorf("parameters %d, want %d", small.Parameters, wantParams)
	}
	// the KV cache of 4 × 2048 tokens: 4 layers × 2 (K and V) × 128
	// values × 2 bytes (F16) per token
	kv := int64(4 * 2 * 128 * 2 * (4*2048 - 512))
	if big.MemoryBytes-small.MemoryBytes < kv {
		t.Errorf("memory for 4×2048 tokens %d, for 512 %d: the difference is below the KV cache's %d bytes", big.MemoryBytes, small.MemoryBytes, kv)
	}
	if small.MemoryBytes < small.FileBytes/2 {
		t.Errorf("memory %d below the weights' %d bytes", small.MemoryBytes, small.FileBytes)
	}
	if err := Fit(big, big.MemoryBytes*2, 10); err != nil {
		t.Errorf("twice the memory: %v", err)
	}
	err = Fit(big, big.MemoryBytes, 10)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), Bytes(big.MemoryBytes)) || !strings.Contains(err.Error(), "2048-token context × 4 sequences") {
		t.Errorf("Fit at the bare estimate with a 10%% margin: %v", err)
	}
	if err := Fit(big, 0, 10); err != nil {
		t.Errorf("no limit: %v", err)
	}
}
