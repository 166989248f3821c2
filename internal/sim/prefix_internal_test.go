package sim

import (
	"strconv"
	"testing"
	"time"
)

func words(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func TestPrefixCacheAdmit(t *testing.T) {
	sys := words("sys", 64) // 4 blocks of 16
	c := newPrefixCache(PrefixCache{Tokens: 160, BlockTokens: 16})
	steps := []struct {
		name   string
		tokens []string
		want   int
	}{
		{"cold", append(append([]string{}, sys...), words("a", 20)...), 0},
		{"same system prompt, other user", append(append([]string{}, sys...), words("b", 20)...), 64},
		{"same prompt again: whole blocks, the partial block recomputed", append(append([]string{}, sys...), words("a", 20)...), 80},
		// A prompt of whole blocks, all cached: its last block is computed
		// again (vLLM always computes the last prompt token).
		{"system prompt alone", sys, 48},
		{"different first block shares nothing", append(words("x", 1), sys...), 0},
	}
	for _, s := range steps {
		if got := c.admit(s.tokens); got != s.want {
			t.Errorf("%s: cached %d tokens, want %d", s.name, got, s.want)
		}
	}
	if got := c.cachedTokens(); got > 160 {
		t.Errorf("cache holds %d tokens, beyond its 160", got)
	}
}

func TestPrefixCacheEvictsPrefixesFromTheirEnd(t *testing.T) {
	c := newPrefixCache(PrefixCache{Tokens: 64, BlockTokens: 16}) // 4 blocks
	a := words("a", 48)                                           // 3 blocks
	b := words("b", 32)                                           // 2 blocks
	c.admit(a)
	c.admit(b) // evicts one block of a: its last
	if got := c.admit(append(append([]string{}, a...), "tail")); got != 32 {
		t.Errorf("after eviction a keeps %d cached tokens, want its first 32", got)
	}
	c.reset()
	if got := c.admit(append(append([]string{}, b...), "tail")); got != 0 || c.cachedTokens() != 32 {
		t.Errorf("after reset: %d cached, %d held; want 0 and the 2 whole blocks just admitted", got, c.cachedTokens())
	}
}

func TestPrefillQueuesPrompts(t *testing.T) {
	p := prefill{rate: 1000}
	now := time.Unix(0, 0)
	if got := p.reserve(now, 500); got != now.Add(500*time.Millisecond) {
		t.Errorf("first prefill ends at %v, want +500ms", got.Sub(now))
	}
	if got := p.reserve(now.Add(100*time.Millisecond), 100); got != now.Add(600*time.Millisecond) {
		t.Errorf("queued prefill ends at %v, want +600ms (after the first)", got.Sub(now))
	}
	if got := p.reserve(now.Add(time.Second), 0); got != now.Add(time.Second) {
		t.Errorf("a fully cached prompt waits %v, want nothing", got.Sub(now.Add(time.Second)))
	}
	if got := (&prefill{}).reserve(now, 1e6); got != now {
		t.Errorf("without a prefill rate the prefill takes %v", got.Sub(now))
	}
}

func TestChatTokensMatchTheCount(t *testing.T) {
	msgs := []chatMessage{{Role: "system", Content: []byte(`"you are kind"`)}, {Role: "user", Content: []byte(`"hi there"`)}}
	want := countTokens("you are kind") + 4 + countTokens("hi there") + 4
	if got := len(chatTokens(msgs)); got != want {
		t.Errorf("chat renders %d tokens, the prompt counts %d", got, want)
	}
}
