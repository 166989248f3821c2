package sim

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"strings"
)

// vocabulary is what the simulated model says. Words are picked by a
// pseudo-random generator seeded from the request, so the same request always
// gets the same answer.
var vocabulary = [...]string{
	"the", "model", "orchestra", "plays", "a", "quiet", "tune", "while", "tokens",
	"flow", "through", "the", "queue", "and", "every", "request", "finds", "its",
	"engine", "in", "time", "latency", "stays", "low", "because", "nothing", "is",
	"lost", "or", "repeated", "workers", "sing", "together", "under", "one", "root",
	"cache", "warm", "weights", "gradient", "attention", "layer", "prompt", "answer",
	"stream", "batch", "kernel", "memory", "shard", "replica", "signal", "harmony",
}

// seedOf hashes the parts of a request that define its answer.
func seedOf(parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		_, _ = h.Write([]byte(p))
		_, _ = h.Write([]byte{0})
	}
	return h.Sum64()
}

// textGen yields the tokens of one deterministic answer.
type textGen struct {
	state uint64
	n     int
}

func newTextGen(seed uint64) *textGen { return &textGen{state: seed} }

// next returns the next token. Tokens after the first start with a space, and
// roughly one in eight ends a sentence, like a real tokenizer's output.
func (g *textGen) next() string {
	var b [32]byte
	return string(g.appendNext(b[:0]))
}

// appendNext appends the next token to dst.
func (g *textGen) appendNext(dst []byte) []byte {
	r := g.rand()
	w := vocabulary[r%uint64(len(vocabulary))]
	first := g.n == 0
	g.n++
	if first {
		c := w[0] // the vocabulary is lower-case ASCII
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		return append(append(dst, c), w[1:]...)
	}
	dst = append(append(dst, ' '), w...)
	if (r>>32)%8 == 0 {
		dst = append(dst, '.')
	}
	return dst
}

// rand is splitmix64: tiny, fast and good enough for picking words.
func (g *textGen) rand() uint64 {
	g.state += 0x9e3779b97f4a7c15
	z := g.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// countTokens estimates the token count of text the way the simulator
// tokenizes its own output: one token per word, at least one for non-empty
// text.
func countTokens(text string) int {
	n := len(strings.Fields(text))
	if n == 0 && text != "" {
		return 1
	}
	return n
}

// embedding returns a deterministic unit vector of dim floats for text.
func embedding(text string, dim int) []float32 {
	g := newTextGen(seedOf("embedding", text))
	v := make([]float32, dim)
	var norm float64
	for i := range v {
		x := float64(g.rand()>>11)/float64(1<<53)*2 - 1
		v[i] = float32(x)
		norm += x * x
	}
	norm = math.Sqrt(norm)
	if norm == 0 {
		return v
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}

// float32sLE encodes v as little-endian float32s, the layout OpenAI's
// encoding_format "base64" uses.
func float32sLE(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}
