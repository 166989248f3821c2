package modelgen_test

import (
	"crypto/sha256"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	parser "github.com/gpustack/gguf-parser-go"

	"github.com/model-orchestra/operator/internal/modelgen"
)

// generate writes c into a temporary file, returns its path and sha256.
func generate(t *testing.T, c modelgen.Config) (string, [32]byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := modelgen.Write(io.MultiWriter(f, h), c)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != n {
		t.Fatalf("Write returned %d bytes, the file has %d", n, fi.Size())
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return path, sum
}

func TestTinyModelReadsAsLlama(t *testing.T) {
	path, _ := generate(t, modelgen.Tiny())
	gf, err := parser.ParseGGUFFile(path)
	if err != nil {
		t.Fatalf("gguf-parser-go: %v", err)
	}
	md, arch, tok := gf.Metadata(), gf.Architecture(), gf.Tokenizer()

	if md.Architecture != "llama" || md.Name != "orchestra-tiny" || md.FileType != parser.GGUFFileTypeMostlyF16 || md.Alignment != 32 {
		t.Errorf("metadata: architecture %q name %q file type %v alignment %d", md.Architecture, md.Name, md.FileType, md.Alignment)
	}
	if arch.BlockCount != 2 || arch.EmbeddingLength != 64 || arch.AttentionHeadCount != 4 || arch.AttentionHeadCountKV != 4 ||
		arch.MaximumContextLength != 256 || !cmp.Equal(arch.FeedForwardLength, []uint64{128, 128}) || arch.VocabularyLength != 512 {
		t.Errorf("architecture: %d layers, embedding %d, %d/%d heads, context %d, feed-forward %v, vocabulary %d; want 2, 64, 4/4, 256, [128 128] (one a layer), 512",
			arch.BlockCount, arch.EmbeddingLength, arch.AttentionHeadCount, arch.AttentionHeadCountKV, arch.MaximumContextLength, arch.FeedForwardLength, arch.VocabularyLength)
	}
	if got, want := uint64(md.Parameters), modelgen.Tiny().Parameters(); got != want {
		t.Errorf("parameters: the parser counts %d, Config says %d", got, want)
	}
	if size := md.FileSize; size < 250<<10 || size > 350<<10 {
		t.Errorf("file size %d bytes, want about 300 KB", size)
	}

	// 2 norms and 7 matrices a layer, the embedding, the output norm and
	// the output: norms are F32, matrices F16.
	if n := len(gf.TensorInfos); n != 2*9+3 {
		t.Errorf("%d tensors, want 21", n)
	}
	for _, ti := range gf.TensorInfos {
		want := parser.GGMLTypeF16
		if strings.HasSuffix(ti.Name, "norm.weight") {
			want = parser.GGMLTypeF32
		}
		if ti.Type != want {
			t.Errorf("tensor %s is %v, want %v", ti.Name, ti.Type, want)
		}
	}
	for name, want := range map[string][]uint64{"token_embd.weight": {64, 512}, "output.weight": {64, 512}, "blk.1.ffn_down.weight": {128, 64}, "blk.0.ffn_up.weight": {64, 128}} {
		ti, ok := gf.TensorInfos.Get(name)
		if !ok || len(ti.Dimensions) != len(want) || ti.Dimensions[0] != want[0] || ti.Dimensions[1] != want[1] {
			t.Errorf("tensor %s: %v, want shape %v", name, ti.Dimensions, want)
		}
	}

	if tok.Model != "gpt2" || tok.TokensLength != 512 || tok.MergesLength != 253 {
		t.Errorf("tokenizer: %s, %d tokens, %d merges; want gpt2, 512, 253", tok.Model, tok.TokensLength, tok.MergesLength)
	}
	v := modelgen.NewVocabulary()
	if tok.BOSTokenID != int64(v.BOS) || tok.EOSTokenID != int64(v.EOS) || v.Tokens[v.BOS] != modelgen.BOS || v.Tokens[v.EOS] != modelgen.ChatEnd {
		t.Errorf("BOS %d EOS %d, want %d (%s) and %d (%s)", tok.BOSTokenID, tok.EOSTokenID, v.BOS, modelgen.BOS, v.EOS, modelgen.ChatEnd)
	}
	kv, _ := gf.Header.MetadataKV.Get("tokenizer.chat_template")
	if got := kv.ValueString(); got != modelgen.ChatTemplate || !strings.Contains(got, "<|im_start|>") {
		t.Errorf("chat template %q", got)
	}
	types, _ := gf.Header.MetadataKV.Get("tokenizer.ggml.token_type")
	tt := types.ValueArray().ValuesInt32()
	for id, typ := range tt {
		want := int32(1) // normal
		if id >= 509 {
			want = 3 // control
		}
		if typ != want {
			t.Errorf("token %d (%q) has type %d, want %d", id, v.Tokens[id], typ, want)
		}
	}
}

func TestVocabularyIsByteLevelBPE(t *testing.T) {
	v := modelgen.NewVocabulary()
	ids := map[string]int{}
	for i, tok := range v.Tokens {
		if _, dup := ids[tok]; dup {
			t.Fatalf("token %q appears twice", tok)
		}
		ids[tok] = i
	}
	// Every byte has its token, in byte order.
	for b := 0; b < 256; b++ {
		if got := modelgen.Decode(v.Tokens[b]); got != string([]byte{byte(b)}) {
			t.Fatalf("token %d decodes to %q, want byte %#x", b, got, b)
		}
	}
	if modelgen.Decode(v.Tokens[' ']) != " " || v.Tokens[' '] != "Ġ" {
		t.Errorf("the space is %q, want GPT-2's Ġ", v.Tokens[' '])
	}
	// Every merge joins two tokens into a token.
	for _, m := range v.Merges {
		l, r, ok := strings.Cut(m, " ")
		if !ok || strings.Contains(r, " ") {
			t.Fatalf("merge %q is not two tokens", m)
		}
		if _, ok := ids[l]; !ok {
			t.Errorf("merge %q: %q is no token", m, l)
		}
		if _, ok := ids[l+r]; !ok {
			t.Errorf("merge %q: %q is no token", m, l+r)
		}
	}
	if _, ok := ids["Ġthe"]; !ok {
		t.Errorf(`the commonest word of the text, " the", is not one token`)
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	_, a := generate(t, modelgen.Tiny())
	_, b := generate(t, modelgen.Tiny())
	other := modelgen.Tiny()
	other.Seed = 2
	_, c := generate(t, other)
	if a != b {
		t.Error("the same config wrote two different files")
	}
	if a == c {
		t.Error("another seed wrote the same file")
	}
}

func TestForSize(t *testing.T) {
	for _, s := range []string{"300MiB", "1GiB", "3GiB"} {
		size, err := modelgen.ParseSize(s)
		if err != nil {
			t.Fatal(err)
		}
		c, err := modelgen.ForSize(size)
		if err != nil {
			t.Fatalf("ForSize(%s): %v", s, err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("ForSize(%s) = %+v: %v", s, c, err)
		}
		if got := c.FileSize(); got > size || got < size*85/100 {
			t.Errorf("ForSize(%s): %+v is %s", s, c, modelgen.FormatSize(got))
		}
	}
	if _, err := modelgen.ForSize(1000); err == nil || !strings.Contains(err.Error(), "smallest model") {
		t.Errorf("ForSize(1000): %v, want a size error", err)
	}
	if _, err := modelgen.ParseSize("big"); err == nil {
		t.Error(`ParseSize("big") accepted`)
	}
}

func TestWriteStreamsLargeModels(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB")
	}
	c, err := modelgen.ForSize(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	n, err := modelgen.Write(io.Discard, c)
	if err != nil {
		t.Fatal(err)
	}
	if d := n - int64(c.FileSize()); d < 0 || d > 64<<10 {
		t.Errorf("wrote %d bytes, FileSize says %d", n, c.FileSize())
	}
}
