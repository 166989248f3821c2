package modelgen

import (
	_ "embed"
	"regexp"
	"sort"
	"strings"
)

// The special tokens, control tokens at the end of the vocabulary.
const (
	BOS       = "<|begin_of_text|>"
	ChatStart = "<|im_start|>"
	ChatEnd   = "<|im_end|>" // also the end-of-sequence token
)

// VocabSize is the number of tokens: 256 byte tokens, the merged tokens,
// and the 3 special tokens.
const VocabSize = 512

// Token types (llama.cpp, enum llama_token_type).
const (
	tokenNormal  int32 = 1
	tokenControl int32 = 3
)

// ChatTemplate is ChatML as Hugging Face models write it. Ollama recognises
// it as its "chatml" template (with the <|im_start|> and <|im_end|> stops);
// llama.cpp's chat-template detection recognises <|im_start|>.
const ChatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

//go:embed corpus.txt
var corpus string

// Vocabulary is a gpt2-style byte-level BPE tokenizer.
type Vocabulary struct {
	// Tokens are the token texts in the GPT-2 byte-to-unicode alphabet
	// (a space is "Ġ"), indexed by token id.
	Tokens []string
	// Types are the tokens' llama.cpp types: normal or control.
	Types []int32
	// Merges are the BPE merges, "left right", in priority order.
	Merges []string
	// BOS and EOS are the ids of the begin and end of sequence tokens.
	BOS, EOS uint32
}

// byteRunes maps each byte to its printable rune in GPT-2's byte-level
// alphabet (bytes_to_unicode in openai/gpt-2's encoder.py): printable
// Latin-1 bytes stand for themselves, the others are shifted past 255.
func byteRunes() [256]rune {
	var m [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}

// pretokenize splits text roughly as GPT-2 does (a word keeps its leading
// space); the engines split with their own expression at run time.
var pretokenize = regexp.MustCompile(`'s|'t|'re|'ve|'m|'ll|'d| ?\pL+| ?\pN+| ?[^\s\pL\pN]+|\s+`)

// NewVocabulary learns VocabSize-259 merges from the built-in text, the
// same every time.
func NewVocabulary() Vocabulary {
	runes := byteRunes()
	var v Vocabulary
	known := make(map[string]bool, VocabSize)
	for b := 0; b < 256; b++ {
		t := string(runes[b])
		v.Tokens = append(v.Tokens, t)
		v.Types = append(v.Types, tokenNormal)
		known[t] = true
	}

	// The words of the text as symbol sequences, with their counts.
	counts := map[string]int{}
	for _, w := range pretokenize.FindAllString(corpus, -1) {
		counts[w]++
	}
	type word struct {
		syms  []string
		count int
	}
	keys := make([]string, 0, len(counts))
	for w := range counts {
		keys = append(keys, w)
	}
	sort.Strings(keys)
	words := make([]word, 0, len(keys))
	for _, w := range keys {
		syms := make([]string, 0, len(w))
		for _, b := range []byte(w) {
			syms = append(syms, string(runes[b]))
		}
		words = append(words, word{syms, counts[w]})
	}

	specials := []string{BOS, ChatStart, ChatEnd}
	for len(v.Tokens) < VocabSize-len(specials) {
		pairs := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[[2]string{w.syms[i], w.syms[i+1]}] += w.count
			}
		}
		if len(pairs) == 0 {
			break // every word is one token: the text is too short
		}
		var best [2]string
		bestN := 0
		for p, n := range pairs {
			if n > bestN || (n == bestN && p[0]+" "+p[1] < best[0]+" "+best[1]) {
				best, bestN = p, n
			}
		}
		merged := best[0] + best[1]
		v.Merges = append(v.Merges, best[0]+" "+best[1])
		if !known[merged] {
			known[merged] = true
			v.Tokens = append(v.Tokens, merged)
			v.Types = append(v.Types, tokenNormal)
		}
		for i := range words {
			s := words[i].syms
			out := s[:0]
			for j := 0; j < len(s); j++ {
				if j+1 < len(s) && s[j] == best[0] && s[j+1] == best[1] {
					out = append(out, merged)
					j++
					continue
				}
				out = append(out, s[j])
			}
			words[i].syms = out
		}
	}
	for _, s := range specials {
		v.Tokens = append(v.Tokens, s)
		v.Types = append(v.Types, tokenControl)
	}
	v.BOS = uint32(len(v.Tokens) - 3)
	v.EOS = uint32(len(v.Tokens) - 1)
	return v
}

// Decode turns token texts back into the bytes they stand for (special
// tokens as their text); tests use it to check the alphabet.
func Decode(tokens ...string) string {
	runes := byteRunes()
	back := make(map[rune]byte, 256)
	for b, r := range runes {
		back[r] = byte(b)
	}
	var sb strings.Builder
	for _, t := range tokens {
		if strings.HasPrefix(t, "<|") {
			sb.WriteString(t)
			continue
		}
		for _, r := range t {
			sb.WriteByte(back[r])
		}
	}
	return sb.String()
}
