package main

import (
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/ssetest"
)

// TestOllamaChatStream: over a streamed /api/chat answer (the shape of
// Ollama's docs/api.md "Chat request (streaming)"), the first token is the
// first chunk with non-empty content, and the final chunk's durations are
// read.
func TestOllamaChatStream(t *testing.T) {
	stream := strings.Join([]string{
		`{"model":"bench","created_at":"2026-11-28T19:00:00Z","message":{"role":"assistant","content":""},"done":false}`,
		`{"model":"bench","created_at":"2026-11-28T19:00:00Z","message":{"role":"assistant","content":"Tiers"},"done":false}`,
		`{"model":"bench","created_at":"2026-11-28T19:00:00Z","message":{"role":"assistant","content":" hold"},"done":false}`,
		`{"model":"bench","created_at":"2026-11-28T19:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","total_duration":1500000000,"load_duration":1200000000,"prompt_eval_count":12,"prompt_eval_duration":200000000,"eval_count":8,"eval_duration":100000000}`,
	}, "\n") + "\n"
	r := &ssetest.LineReader{Lines: strings.Split(strings.TrimRight(stream, "\n"), "\n")}
	var at int
	first, done, err := ollamaChatStream(r, func() time.Time { at = r.Handed; return time.Unix(int64(r.Handed), 0) })
	if err != nil {
		t.Fatal(err)
	}
	if at != 2 || first.Unix() != 2 {
		t.Errorf("first token after %d lines, want 2 (the first non-empty content)", at)
	}
	if done.LoadDuration != 1200000000 || done.EvalCount != 8 {
		t.Errorf("final chunk %+v", done)
	}
	for name, s := range map[string]string{
		"no final chunk": `{"message":{"content":"a"},"done":false}`,
		"no content":     `{"message":{"content":""},"done":true}`,
		"an error":       `{"error":"model not found"}`,
	} {
		if _, _, err := ollamaChatStream(strings.NewReader(s+"\n"), time.Now); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
