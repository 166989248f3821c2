package main

import (
	"strings"
	"testing"
	"time"
)

// TestFirstContentSkipsTheRoleChunk: the role chunk with empty content,
// flushed before the engine's time to first token, is not the first token.
func TestFirstContentSkipsTheRoleChunk(t *testing.T) {
	stream := strings.Join([]string{
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		``,
		`: keep-alive`,
		`data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}`,
		``,
		`data: {"choices":[{"index":0,"delta":{"content":" world"}}]}`,
		``,
		`data: [DONE]`,
		``,
	}, "\n")
	var n int
	t0 := time.Unix(100, 0)
	clock := func() time.Time { n++; return t0.Add(time.Duration(n) * time.Second) }
	got, err := firstContent(strings.NewReader(stream), clock)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || !got.Equal(t0.Add(time.Second)) {
		t.Errorf("the clock was read %d times (want 1, at the first non-empty delta), first = %v", n, got)
	}
	if _, err := firstContent(strings.NewReader(`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}`+"\n"), clock); err == nil {
		t.Error("a stream of only a role chunk gave a first token")
	}
}
