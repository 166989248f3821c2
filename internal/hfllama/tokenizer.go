package hfllama

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
)

// Llama3Pattern is the pre-tokenizer split pattern of Llama 3 (and of
// llama.cpp's "llama-bpe"), the one this tokenizer implements.
const Llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// AddedToken is an entry of tokenizer.json's added_tokens.
type AddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

// Tokenizer is a byte-level BPE tokenizer as tokenizer.json defines it,
// with the Llama 3 pre-tokenizer.
type Tokenizer struct {
	// Tokens by id; Vocab maps them back.
	Tokens []string
	Vocab  map[string]int
	// Merges in rank order, "left right".
	Merges []string
	rank   map[string]int
	// IgnoreMerges: a pre-token that is itself in the vocabulary becomes
	// that token without applying merges.
	IgnoreMerges bool
	Added        []AddedToken
	special      []AddedToken // longest first, for splitting
	// BOS is the id prepended when AddBOS is set; EOS ends generation.
	BOS, EOS int
	AddBOS   bool
	// EOG are the ids that end generation (EOS and, when present, <|eot_id|>).
	EOG []int
	// ChatTemplate from tokenizer_config.json.
	ChatTemplate string
	// Pre names the pre-tokenizer in GGUF's tokenizer.ggml.pre terms.
	Pre string
}

// The JSON shapes of tokenizer.json this reader understands.
type tokenizerJSON struct {
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type         string          `json:"type"`
		Vocab        map[string]int  `json:"vocab"`
		Merges       json.RawMessage `json:"merges"`
		IgnoreMerges bool            `json:"ignore_merges"`
		ByteFallback bool            `json:"byte_fallback"`
	} `json:"model"`
}

type preTokenizerJSON struct {
	Type          string             `json:"type"`
	Pretokenizers []preTokenizerJSON `json:"pretokenizers"`
	Pattern       struct {
		Regex  string `json:"Regex"`
		String string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       bool   `json:"use_regex"`
}

type tokenizerConfigJSON struct {
	AddBOSToken  *bool           `json:"add_bos_token"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// tokenString reads a token given as a string or as {"content": ...}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Content
}

// ReadTokenizer reads dir/tokenizer.json and dir/tokenizer_config.json. A
// tokenizer other than byte-level BPE with the Llama 3 pre-tokenizer is
// ErrUnsupported, naming what differs.
func ReadTokenizer(dir string) (*Tokenizer, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: tokenizer.json is missing (SentencePiece tokenizer.model checkpoints are not supported)", ErrUnsupported)
		}
		return nil, err
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %w", ErrUnsupported, err)
	}
	if tj.Model.Type != "BPE" {
		return nil, fmt.Errorf("%w: tokenizer model %q (only byte-level BPE)", ErrUnsupported, tj.Model.Type)
	}
	if tj.Model.ByteFallback {
		return nil, fmt.Errorf("%w: tokenizer with byte_fallback (a SentencePiece-style BPE; only byte-level BPE)", ErrUnsupported)
	}
	if len(tj.Normalizer) > 0 && string(tj.Normalizer) != "null" {
		return nil, fmt.Errorf("%w: tokenizer normalizer %s", ErrUnsupported, tj.Normalizer)
	}
	pre, err := preTokenizerName(tj.PreTokenizer)
	if err != nil {
		return nil, err
	}
	tk := &Tokenizer{Vocab: tj.Model.Vocab, IgnoreMerges: tj.Model.IgnoreMerges, Added: tj.AddedTokens, Pre: pre, BOS: -1, EOS: -1}
	for _, a := range tj.AddedTokens {
		tk.Vocab[a.Content] = a.ID
	}
	n := 0
	for _, id := range tk.Vocab {
		n = max(n, id+1)
	}
	tk.Tokens = make([]string, n)
	for s, id := range tk.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("%w: negative token id", ErrUnsupported)
		}
		tk.Tokens[id] = s
	}
	// merges are ["a b", ...] (older files) or [["a", "b"], ...].
	var strMerges []string
	if err := json.Unmarshal(tj.Model.Merges, &strMerges); err != nil {
		var pairs [][2]string
		if err := json.Unmarshal(tj.Model.Merges, &pairs); err != nil {
			return nil, fmt.Errorf("%w: tokenizer merges: %w", ErrUnsupported, err)
		}
		for _, p := range pairs {
			strMerges = append(strMerges, p[0]+" "+p[1])
		}
	}
	tk.Merges = strMerges
	tk.rank = make(map[string]int, len(strMerges))
	for i, m := range strMerges {
		if _, dup := tk.rank[m]; !dup {
			tk.rank[m] = i
		}
	}
	for _, a := range tj.AddedTokens {
		if a.Special {
			tk.special = append(tk.special, a)
		}
	}
	sort.SliceStable(tk.special, func(i, j int) bool { return len(tk.special[i].Content) > len(tk.special[j].Content) })

	var tc tokenizerConfigJSON
	if b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		if err := json.Unmarshal(b, &tc); err != nil {
			return nil, fmt.Errorf("%w: tokenizer_config.json: %w", ErrUnsupported, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if id, ok := tk.Vocab[tokenString(tc.BOSToken)]; ok && len(tc.BOSToken) > 0 {
		tk.BOS = id
	}
	if id, ok := tk.Vocab[tokenString(tc.EOSToken)]; ok && len(tc.EOSToken) > 0 {
		tk.EOS = id
	}
	// The BOS is added when tokenizer_config says so or, as Llama 3 files
	// do, when the post-processor's template starts with it.
	if tc.AddBOSToken != nil {
		tk.AddBOS = *tc.AddBOSToken
	} else if tk.BOS >= 0 {
		tk.AddBOS = strings.Contains(string(tj.PostProcessor), tk.Tokens[tk.BOS])
	}
	var tmpl string
	if json.Unmarshal(tc.ChatTemplate, &tmpl) == nil {
		tk.ChatTemplate = tmpl
	}
	if tk.EOS >= 0 {
		tk.EOG = append(tk.EOG, tk.EOS)
	}
	// as llama.cpp does, these end generation whatever the EOS is
	for _, s := range []string{"<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"} {
		if id, ok := tk.Vocab[s]; ok && id != tk.EOS {
			tk.EOG = append(tk.EOG, id)
		}
	}
	return tk, nil
}

// preTokenizerName accepts the Llama 3 pre-tokenizer: Sequence[Split(Llama3
// pattern, Isolated), ByteLevel(use_regex false)].
func preTokenizerName(raw json.RawMessage) (string, error) {
	var p preTokenizerJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", fmt.Errorf("%w: pre_tokenizer: %w", ErrUnsupported, err)
	}
	if p.Type == "Sequence" && len(p.Pretokenizers) == 2 {
		s, bl := p.Pretokenizers[0], p.Pretokenizers[1]
		if s.Type == "Split" && s.Pattern.Regex == Llama3Pattern && s.Behavior == "Isolated" && !s.Invert &&
			bl.Type == "ByteLevel" && !bl.UseRegex && !bl.AddPrefixSpace {
			return "llama-bpe", nil
		}
	}
	return "", fmt.Errorf("%w: pre_tokenizer %s (only the Llama 3 byte-level pre-tokenizer, llama-bpe)", ErrUnsupported, compact(raw))
}

func compact(raw json.RawMessage) string {
	s := strings.Join(strings.Fields(string(raw)), " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// byteToRune is GPT-2's byte-level alphabet: printable bytes stand for
// themselves, the others are shifted past 255.
func byteToRune(b byte) rune {
	r := rune(b)
	switch {
	case r == 0xad:
		return 0x143
	case r <= 0x20:
		return r + 0x100
	case r >= 0x7f && r <= 0xa0:
		return r + 0xa2
	}
	return r
}

var runeToByte = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for i := 0; i < 256; i++ {
		m[byteToRune(byte(i))] = byte(i)
	}
	return m
}()

// ByteLevel maps bytes to the byte-level alphabet.
func ByteLevel(s string) string {
	var sb strings.Builder
	for _, b := range []byte(s) {
		sb.WriteRune(byteToRune(b))
	}
	return sb.String()
}

// Encode tokenizes text, adding the BOS when the tokenizer does. Special
// tokens written in the text become their ids.
func (tk *Tokenizer) Encode(text string) []int {
	var ids []int
	if tk.AddBOS && tk.BOS >= 0 {
		ids = append(ids, tk.BOS)
	}
	for text != "" {
		// the earliest special token, the longest at a position
		at, which := -1, -1
		for i, s := range tk.special {
			if j := strings.Index(text, s.Content); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		plain := text
		if at >= 0 {
			plain = text[:at]
		}
		for _, piece := range PreTokenize(plain) {
			ids = append(ids, tk.bpe(ByteLevel(piece))...)
		}
		if at < 0 {
			break
		}
		ids = append(ids, tk.special[which].ID)
		text = text[at+len(tk.special[which].Content):]
	}
	return ids
}

func (tk *Tokenizer) bpe(word string) []int {
	if id, ok := tk.Vocab[word]; ok && tk.IgnoreMerges {
		return []int{id}
	}
	parts := make([]string, 0, len(word))
	for _, r := range word {
		parts = append(parts, string(r))
	}
	for len(parts) > 1 {
		best, at := -1, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := tk.rank[parts[i]+" "+parts[i+1]]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		// merge every occurrence of the best pair, left to right
		merged := parts[at] + parts[at+1]
		left, right := parts[at], parts[at+1]
		out := parts[:0:0]
		for i := 0; i < len(parts); i++ {
			if i+1 < len(parts) && parts[i] == left && parts[i+1] == right {
				out = append(out, merged)
				i++
				continue
			}
			out = append(out, parts[i])
		}
		parts = out
	}
	ids := make([]int, 0, len(parts))
	for _, p := range parts {
		if id, ok := tk.Vocab[p]; ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// TokenBytes is the text a token stands for: its bytes for a byte-level
// token, its content for an added token.
func (tk *Tokenizer) TokenBytes(id int) []byte {
	if id < 0 || id >= len(tk.Tokens) {
		return nil
	}
	for _, a := range tk.Added {
		if a.ID == id {
			return []byte(a.Content)
		}
	}
	var out []byte
	for _, r := range tk.Tokens[id] {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
		}
	}
	return out
}

// Decode joins the bytes of ids.
func (tk *Tokenizer) Decode(ids []int) string {
	var out []byte
	for _, id := range ids {
		out = append(out, tk.TokenBytes(id)...)
	}
	return string(out)
}

// IsEOG reports whether id ends generation.
func (tk *Tokenizer) IsEOG(id int) bool {
	for _, e := range tk.EOG {
		if e == id {
			return true
		}
	}
	return false
}

// PreTokenize splits text as Llama3Pattern does (Split with behaviour
// Isolated: every match is a piece, and so is any text between matches).
// Go's regexp has no lookahead, so the alternatives are matched by hand,
// each at the current position in the pattern's order.
func PreTokenize(text string) []string {
	r := []rune(text)
	var out []string
	for i := 0; i < len(r); {
		n := matchLlama3(r, i)
		out = append(out, string(r[i:i+n]))
		i += n
	}
	return out
}

func isL(r rune) bool  { return unicode.IsLetter(r) }
func isN(r rune) bool  { return unicode.IsNumber(r) }
func isS(r rune) bool  { return unicode.IsSpace(r) }
func isNL(r rune) bool { return r == '\r' || r == '\n' }

// matchLlama3 returns the length of the match at i (always ≥ 1: every rune
// is matched by some alternative).
func matchLlama3(r []rune, i int) int {
	at := func(j int) rune {
		if j < len(r) {
			return r[j]
		}
		return -1
	}
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r[i] == '\'' {
		c1, c2 := unicode.ToLower(at(i+1)), unicode.ToLower(at(i+2))
		switch {
		case c1 == 's' || c1 == 't':
			return 2
		case (c1 == 'r' || c1 == 'v') && c2 == 'e':
			return 3
		case c1 == 'm':
			return 2
		case c1 == 'l' && c2 == 'l':
			return 3
		case c1 == 'd':
			return 2
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	letters := func(j int) int {
		k := j
		for k < len(r) && isL(r[k]) {
			k++
		}
		return k - j
	}
	if c := r[i]; !isNL(c) && !isL(c) && !isN(c) {
		if n := letters(i + 1); n > 0 {
			return 1 + n
		}
	}
	if n := letters(i); n > 0 {
		return n
	}
	// \p{N}{1,3}
	if isN(r[i]) {
		n := 1
		for n < 3 && isN(at(i+n)) {
			n++
		}
		return n
	}
	// ' '?[^\s\p{L}\p{N}]+[\r\n]*
	other := func(c rune) bool { return c >= 0 && !isS(c) && !isL(c) && !isN(c) }
	start := i
	if r[i] == ' ' && other(at(i+1)) {
		start = i + 1
	}
	if other(at(start)) {
		k := start
		for other(at(k)) {
			k++
		}
		for isNL(at(k)) {
			k++
		}
		return k - i
	}
	// the whitespace run at i
	end := i
	for end < len(r) && isS(r[end]) {
		end++
	}
	// \s*[\r\n]+: up to the last line break of the run
	for k := end - 1; k >= i; k-- {
		if isNL(r[k]) {
			return k + 1 - i
		}
	}
	// \s+(?!\S): the run, less its last space when text follows
	if end == len(r) {
		return end - i
	}
	if end-i > 1 {
		return end - 1 - i
	}
	// \s+
	return end - i
}
