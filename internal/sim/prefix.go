package sim

import (
	"container/list"
	"encoding/binary"
	"hash/fnv"
	"strings"
	"sync"
	"time"
)

// PrefixCache models vLLM's automatic prefix caching: the prompt's tokens
// are cut into blocks of BlockTokens, each block named by a hash of its
// tokens and of the block before it (so a block hash names the whole prefix
// up to it), and the blocks of recent prompts are kept in an LRU of Tokens
// tokens. A request reuses its longest run of cached leading blocks; only
// the rest is prefilled.
type PrefixCache struct {
	// Tokens is the cache's size in tokens (whole blocks); 0 turns prefix
	// caching off.
	Tokens int
	// BlockTokens is the block size in tokens (vLLM's --block-size,
	// default 16). Only whole blocks are cached, as in vLLM.
	BlockTokens int
}

// prefixCache is one engine's cache of prompt blocks. It is safe for
// concurrent use.
type prefixCache struct {
	block  int
	blocks int // capacity in blocks

	mu  sync.Mutex
	lru *list.List               // of uint64 block hashes, most recent first
	at  map[uint64]*list.Element // block hash -> its place in lru
}

func newPrefixCache(c PrefixCache) *prefixCache {
	if c.Tokens <= 0 || c.BlockTokens <= 0 {
		return nil
	}
	return &prefixCache{block: c.BlockTokens, blocks: c.Tokens / c.BlockTokens, lru: list.New(), at: map[uint64]*list.Element{}}
}

// blockHashes returns the chained hashes of the whole blocks of tokens.
func blockHashes(tokens []string, block int) []uint64 {
	out := make([]uint64, 0, len(tokens)/block)
	var parent uint64
	var b [8]byte
	for i := 0; i+block <= len(tokens); i += block {
		h := fnv.New64a()
		binary.LittleEndian.PutUint64(b[:], parent)
		_, _ = h.Write(b[:])
		for _, t := range tokens[i : i+block] {
			_, _ = h.Write([]byte(t))
			_, _ = h.Write([]byte{0})
		}
		parent = h.Sum64()
		out = append(out, parent)
	}
	return out
}

// admit looks the prompt up and caches its blocks: it returns how many of
// its leading tokens were cached already. As in vLLM, the last prompt
// token is always computed, so a fully cached prompt reuses all but its
// last block. Blocks are touched last to first, so that the LRU evicts a
// prefix from its end and the blocks left still form prefixes.
func (c *prefixCache) admit(tokens []string) int {
	if c == nil || len(tokens) == 0 {
		return 0
	}
	hashes := blockHashes(tokens, c.block)
	c.mu.Lock()
	defer c.mu.Unlock()
	hit := 0
	for hit < len(hashes) {
		if _, ok := c.at[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	if hit*c.block >= len(tokens) {
		hit--
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if e, ok := c.at[h]; ok {
			c.lru.MoveToFront(e)
			continue
		}
		c.at[h] = c.lru.PushFront(h)
	}
	for c.lru.Len() > c.blocks {
		e := c.lru.Back()
		delete(c.at, e.Value.(uint64))
		c.lru.Remove(e)
	}
	return hit * c.block
}

// cachedTokens is the number of tokens the cache holds.
func (c *prefixCache) cachedTokens() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len() * c.block
}

// reset empties the cache (vLLM's POST /reset_prefix_cache).
func (c *prefixCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.lru.Init()
	c.at = map[uint64]*list.Element{}
	c.mu.Unlock()
}

// chatTokens renders messages the way the simulator counts them: per
// message a start token, the role, a separator, the content's words and an
// end token (the 4 template tokens of countTokens).
func chatTokens(msgs []chatMessage) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, "<|start|>", m.Role, "<|sep|>")
		out = appendWords(out, m.text())
		out = append(out, "<|end|>")
	}
	return out
}

// appendWords appends the tokens of text as countTokens counts them.
func appendWords(dst []string, text string) []string {
	words := strings.Fields(text)
	if len(words) == 0 && text != "" {
		return append(dst, text)
	}
	return append(dst, words...)
}

// prefill is the engine's prefill stage: one prompt at a time, at
// PrefillRate tokens per second. It returns when the prompt's uncached
// tokens will have been prefilled: after the prefills queued before it.
type prefill struct {
	rate float64
	mu   sync.Mutex
	free time.Time // when the prefills queued so far are done
}

// reserve queues a prefill of tokens and returns when it ends.
func (p *prefill) reserve(now time.Time, tokens int) time.Time {
	if p.rate <= 0 || tokens <= 0 {
		return now
	}
	d := time.Duration(float64(tokens) / p.rate * float64(time.Second))
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.free
	if start.Before(now) {
		start = now
	}
	p.free = start.Add(d)
	return p.free
}
