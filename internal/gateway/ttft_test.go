package gateway

import "testing"

// The time-to-first-token metric starts at the first text a client sees:
// the role chunk every chat stream opens with, and finish and usage chunks,
// carry none.
func TestCarriesText(t *testing.T) {
	for _, c := range []struct {
		event string
		want  bool
	}{
		{`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false},
		{`data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}`, false},
		{`data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}`, true},
		{`data: {"choices": [{"delta": {"content": "Hi"}}]}`, true}, // Python's json.dumps spacing
		{`data: {"choices":[{"index":0,"delta":{"content":"\"quoted\""}}]}`, true},
		{`data: {"choices":[{"index":0,"delta":{"content":null},"finish_reason":"stop"}]}`, false},
		{`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}`, false},
		{`data: {"choices":[{"index":0,"text":"once","finish_reason":null}]}`, true}, // legacy completions
		{`data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}`, false},
		{`data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":""}}]}`, false},
	} {
		if got := carriesText([]byte(c.event)); got != c.want {
			t.Errorf("carriesText(%s) = %v, want %v", c.event, got, c.want)
		}
	}
}
