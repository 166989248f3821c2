package hfllama

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// The hand-written pre-tokenizer splits exactly as the Llama 3 pattern does
// when run by a regex engine with lookahead (regexp2, as Ollama runs it).
func TestPreTokenizeMatchesPattern(t *testing.T) {
	re := regexp2.MustCompile(Llama3Pattern, regexp2.RE2)
	split := func(s string) []string {
		r := []rune(s)
		var out []string
		off := 0
		for m, _ := re.FindRunesMatch(r); m != nil; m, _ = re.FindNextMatch(m) {
			if m.Index > off {
				out = append(out, string(r[off:m.Index]))
			}
			out = append(out, m.String())
			off = m.Index + m.Length
		}
		if off < len(r) {
			out = append(out, string(r[off:]))
		}
		return out
	}
	fixed := []string{
		"Hello world! It's 2026 and we're testing.",
		"  two spaces, then\n\nnew lines \r\n\ttabs\t and 1234567 digits",
		"I'LL SAY 'quoted' don't ... !!!\n\n  x",
		"trailing space ", " leading", "   ", "\n", "a\n  b", "über straße 12€ ½",
	}
	alphabet := []rune("ab Z1'\n\r\t.!?- éß5sltrevmd")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		n := rng.IntN(16)
		var sb strings.Builder
		for j := 0; j < n; j++ {
			sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		fixed = append(fixed, sb.String())
	}
	for _, s := range fixed {
		if got, want := PreTokenize(s), split(s); !reflect.DeepEqual(got, want) && (len(got) != 0 || len(want) != 0) {
			t.Fatalf("PreTokenize(%q) = %q, the pattern splits %q", s, got, want)
		}
	}
}

func tinyDir(t *testing.T, o TinyOptions) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteTiny(dir, o); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A fixed text encodes to ids derived by hand from the generated
// tokenizer.json: its vocabulary, merges and special tokens.
func TestTokenizerEncode(t *testing.T) {
	dir := tinyDir(t, TinyOptions{Seed: 1})
	tk, err := ReadTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Pre != "llama-bpe" || !tk.AddBOS || tk.BOS < 256 {
		t.Fatalf("tokenizer: pre %q addBOS %v bos %d", tk.Pre, tk.AddBOS, tk.BOS)
	}
	text := "<|start_header_id|>user<|end_header_id|>\n\nThe model's 12345 tokens, über!"
	ids := tk.Encode(text)
	var pieces []string
	for _, id := range ids {
		pieces = append(pieces, tk.Tokens[id])
	}
	t.Logf("ids %v pieces %q", ids, pieces)
	// Expected from the rules: BOS; the special tokens whole; the
	// pre-tokens "user", "\n\n", "The", " model", "'s", " ", "123", "45",
	// " tokens", ",", " über", "!" each in the vocabulary or merged.
	if got := tk.Decode(ids[1:]); got != text {
		t.Fatalf("decode(encode(text)) = %q", got)
	}
	// Derived from the rules: the BOS (add_bos_token); special tokens
	// whole; pre-tokens "user" "\n\n" "The" " model" "'s" " " "123" "45"
	// " tokens" "," " über" "!" (Llama 3 pattern: contractions apart,
	// digits in threes, a space joins the following word); each pre-token
	// that is a token stays whole (ignore_merges: "The", " model"), the
	// others are merged by rank from their bytes (" tokens" -> "Ġt" "okens",
	// "ü" is the two bytes C3 BC, shown as "Ã" "¼").
	want := []string{"<|begin_of_text|>", "<|start_header_id|>", "u", "s", "er", "<|end_header_id|>", "Ċ", "Ċ",
		"The", "Ġmodel", "'", "s", "Ġ", "1", "2", "3", "4", "5", "Ġt", "okens", ",", "Ġ", "Ã", "¼", "ber", "!"}
	if !reflect.DeepEqual(pieces, want) {
		t.Fatalf("pieces %q, want %q", pieces, want)
	}
	for _, w := range []string{"The", "Ġmodel"} {
		if _, ok := tk.Vocab[w]; !ok {
			t.Errorf("%q is not a token", w)
		}
	}
	if _, ok := tk.Vocab["Ġtokens"]; ok {
		t.Errorf(`" tokens" is a token: the test no longer exercises merging`)
	}
	// independent check of the BPE: the merges applied by rank, one pair at
	// a time, give the same pieces as Encode for each pre-token
	for _, p := range PreTokenize("The model's 12345 tokens, über!") {
		got := tk.bpe(ByteLevel(p))
		want := naiveBPE(tk, ByteLevel(p))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("bpe(%q) = %v, naive %v", p, got, want)
		}
	}
}

// naiveBPE merges the lowest-ranked adjacent pair, leftmost first, one at
// a time, as the Hugging Face BPE model does; a pre-token in the
// vocabulary is one token (ignore_merges).
func naiveBPE(tk *Tokenizer, w string) []int {
	if id, ok := tk.Vocab[w]; ok {
		return []int{id}
	}
	var syms []string
	for _, r := range w {
		syms = append(syms, string(r))
	}
	for {
		best, at := len(tk.Merges), -1
		for i := 0; i+1 < len(syms); i++ {
			for r, m := range tk.Merges {
				if r < best && m == syms[i]+" "+syms[i+1] {
					best, at = r, i
				}
			}
		}
		if at < 0 {
			break
		}
		syms = append(syms[:at], append([]string{syms[at] + syms[at+1]}, syms[at+2:]...)...)
	}
	var ids []int
	for _, s := range syms {
		ids = append(ids, tk.Vocab[s])
	}
	return ids
}

func TestGreedyTiedAndUntied(t *testing.T) {
	for _, tied := range []bool{false, true} {
		dir := tinyDir(t, TinyOptions{Seed: 7, Tied: tied})
		ck, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if ck.Has(NameLMHead) == tied {
			t.Fatalf("tied %v: lm_head present %v", tied, ck.Has(NameLMHead))
		}
		m, err := ck.Load()
		if err != nil {
			t.Fatal(err)
		}
		tk, err := ReadTokenizer(dir)
		if err != nil {
			t.Fatal(err)
		}
		steps := m.Greedy(tk.Encode("The quick brown fox"), 12, tk.IsEOG)
		var ids []int
		for _, s := range steps {
			ids = append(ids, s.Token)
		}
		t.Logf("tied %v: %v %q", tied, steps, tk.Decode(ids))
		_ = ck.Close()
	}
}

func TestWriteTinyDeterministic(t *testing.T) {
	a, b := tinyDir(t, TinyOptions{Seed: 3}), tinyDir(t, TinyOptions{Seed: 3})
	files, _ := filepath.Glob(filepath.Join(a, "*"))
	if len(files) < 6 {
		t.Fatalf("files %v", files)
	}
	for _, f := range files {
		x, _ := os.ReadFile(f)
		y, _ := os.ReadFile(filepath.Join(b, filepath.Base(f)))
		if string(x) != string(y) {
			t.Errorf("%s differs between two runs with one seed", filepath.Base(f))
		}
	}
}
