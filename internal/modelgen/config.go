package modelgen

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Config is a llama model's shape.
type Config struct {
	// Name is general.name.
	Name string
	// Layers is the number of transformer blocks.
	Layers int
	// Embedding is the hidden size; a multiple of Heads and of 32.
	Embedding int
	// Heads is the number of attention heads (as many key/value heads).
	Heads int
	// FeedForward is the feed-forward width; a multiple of 32.
	FeedForward int
	// Context is the trained context length in tokens.
	Context int
	// Seed makes the weights: the same Config gives the same file.
	Seed uint64
}

// Tiny is the model of the tests and the demo: 2 layers, embedding 64,
// 4 heads, feed-forward 128, context 256, vocabulary 512, about 300 KB.
func Tiny() Config {
	return Config{Name: "orchestra-tiny", Layers: 2, Embedding: 64, Heads: 4, FeedForward: 128, Context: 256, Seed: 1}
}

// Validate reports a shape engines would refuse.
func (c Config) Validate() error {
	switch {
	case c.Layers < 1:
		return fmt.Errorf("layers %d: want at least 1", c.Layers)
	case c.Heads < 1:
		return fmt.Errorf("heads %d: want at least 1", c.Heads)
	case c.Embedding < 32 || c.Embedding%32 != 0:
		return fmt.Errorf("embedding %d: want a positive multiple of 32", c.Embedding)
	case c.Embedding%c.Heads != 0 || (c.Embedding/c.Heads)%2 != 0:
		return fmt.Errorf("embedding %d over %d heads: want an even head size", c.Embedding, c.Heads)
	case c.FeedForward < 32 || c.FeedForward%32 != 0:
		return fmt.Errorf("feed-forward %d: want a positive multiple of 32", c.FeedForward)
	case c.Context < 16:
		return fmt.Errorf("context %d: want at least 16 tokens", c.Context)
	}
	return nil
}

// HeadSize is the size of one attention head.
func (c Config) HeadSize() int { return c.Embedding / c.Heads }

// Parameters is the number of weights in the model.
func (c Config) Parameters() uint64 {
	e, f, v := uint64(c.Embedding), uint64(c.FeedForward), uint64(VocabSize)
	perLayer := 4*e*e + 3*e*f + 2*e
	return 2*v*e + e + uint64(c.Layers)*perLayer
}

// FileSize is the size of the GGUF file Write produces for c, within a
// few KiB (metadata and alignment are not counted).
func (c Config) FileSize() uint64 {
	e, f, v := uint64(c.Embedding), uint64(c.FeedForward), uint64(VocabSize)
	perLayer := 2*(4*e*e+3*e*f) + 4*2*e
	return 2*2*v*e + 4*e + uint64(c.Layers)*perLayer
}

// ForSize is a model of about size bytes (at least Tiny): heads of 64,
// the feed-forward width 8/3 of the embedding (as llama's), a layer per
// 128 of the embedding, then as many layers as fit. It keeps Tiny's
// context unless the model is larger than Tiny, which gets 2048.
func ForSize(size uint64) (Config, error) {
	tiny := Tiny()
	if size < tiny.FileSize() {
		return Config{}, fmt.Errorf("size %d bytes: the smallest model (tiny) takes %d", size, tiny.FileSize())
	}
	best := tiny
	for e := 128; e <= 16384; e += 64 {
		c := Config{Embedding: e, Heads: e / 64, FeedForward: roundUp(e*8/3, 64), Context: 2048, Seed: 1}
		c.Layers = max(2, e/128)
		if c.FileSize() > size {
			break
		}
		best = c
	}
	if best.Embedding == tiny.Embedding {
		return tiny, nil
	}
	one := best
	one.Layers = 0
	perLayer := (Config{Embedding: best.Embedding, FeedForward: best.FeedForward, Layers: 1}).FileSize() - one.FileSize()
	best.Layers = max(2, int((size-one.FileSize())/perLayer))
	best.Name = fmt.Sprintf("orchestra-%s", FormatSize(best.FileSize()))
	return best, nil
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// ParseSize parses a byte size: 300MiB, 2GiB, 1.5GiB, 512KiB or a plain
// number of bytes.
func ParseSize(s string) (uint64, error) {
	units := []struct {
		suffix string
		n      float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSuffix(num, u.suffix), u.n
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || f <= 0 {
		return 0, errors.New("size " + strconv.Quote(s) + ": want a positive number of bytes, or one with KiB, MiB or GiB (300MiB, 2GiB)")
	}
	return uint64(f * mult), nil
}

// FormatSize prints a byte size with a binary unit, as ParseSize reads it.
func FormatSize(n uint64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + "GiB"
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 0, 64) + "MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 0, 64) + "KiB"
	}
	return strconv.FormatUint(n, 10) + "B"
}
