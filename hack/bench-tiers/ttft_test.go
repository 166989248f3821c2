package main

import (
	"io"
	"os"
	"slices"
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

// lineReader hands out one line of a recorded stream per Read, as an
// engine flushes one chunk at a time, and counts the lines handed out.
type lineReader struct {
	lines []string
	read  int
}

func (l *lineReader) Read(p []byte) (int, error) {
	if l.read == len(l.lines) {
		return 0, io.EOF
	}
	n := copy(p, l.lines[l.read]+"\n")
	l.read++
	return n, nil
}

// TestFirstContentOfARecordedSimulatorStream: over a stream recorded from
// the simulator (testdata/sim-chat-stream.txt: the role chunk with empty
// content, flushed before the TTFT wait, then the tokens), the first token
// is read when the first non-empty delta ("Tune") has arrived, not the
// role chunk.
func TestFirstContentOfARecordedSimulatorStream(t *testing.T) {
	b, err := os.ReadFile("testdata/sim-chat-stream.txt")
	if err != nil {
		t.Fatal(err)
	}
	r := &lineReader{lines: strings.Split(strings.TrimRight(string(b), "\n"), "\n")}
	if !strings.Contains(r.lines[0], `"role":"assistant","content":""`) {
		t.Fatalf("the recording does not start with the role chunk: %s", r.lines[0])
	}
	var linesAtFirst int
	clock := func() time.Time { linesAtFirst = r.read; return time.Unix(int64(r.read), 0) }
	if _, err := firstContent(r, clock); err != nil {
		t.Fatal(err)
	}
	want := slices.IndexFunc(r.lines, func(l string) bool { return strings.Contains(l, `"content":"Tune"`) }) + 1
	if linesAtFirst != want {
		t.Errorf("first token taken after %d lines of the stream, want %d (the first non-empty delta)", linesAtFirst, want)
	}
}
