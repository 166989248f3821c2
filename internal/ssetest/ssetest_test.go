package ssetest

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  string
		want    Result
		deltas  []string
		wantErr string
	}{{
		name: "the role chunk is no token; usage and [DONE] end the answer",
		stream: "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
			": keep-alive\n\n" +
			"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
			"data:{\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n" +
			"data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n" +
			"data: [DONE]\n\n",
		want:   Result{Content: "Hello", FinishReason: "stop", Chunks: 2, Events: 4, Done: true, Usage: &Usage{PromptTokens: 3, CompletionTokens: 2}, Models: []string{"m"}},
		deltas: []string{"Hel", "lo"},
	}, {
		name:   "a stream of only the role chunk has no first token",
		stream: "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: [DONE]\n\n",
		want:   Result{Events: 1, Done: true},
	}, {
		name:    "an error event after content",
		stream:  "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"engine gone\",\"type\":\"server_error\",\"code\":\"stream_interrupted\"}}\n\n",
		want:    Result{Content: "a", Chunks: 1, Events: 1},
		deltas:  []string{"a"},
		wantErr: "HTTP 200 stream_interrupted (server_error): engine gone",
	}, {
		name:    "a stream cut before [DONE]",
		stream:  "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
		want:    Result{Content: "a", Chunks: 1, Events: 1},
		deltas:  []string{"a"},
		wantErr: "the stream ended without [DONE] after 1 chunks",
	}, {
		name:    "an event that is not JSON",
		stream:  "data: {oops\n\n",
		wantErr: `decoding stream event "{oops"`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var deltas []string
			res, err := Read(strings.NewReader(tc.stream), func(s string) { deltas = append(deltas, s) })
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if tc.want.Chunks > 0 && (res.FirstContent.IsZero() || res.LastContent.Before(res.FirstContent)) {
				t.Errorf("first content at %v, last at %v; want both set, in order", res.FirstContent, res.LastContent)
			}
			if tc.want.Chunks == 0 && !res.FirstContent.IsZero() {
				t.Errorf("first content at %v with no content", res.FirstContent)
			}
			got := *res
			got.FirstContent, got.LastContent = tc.want.FirstContent, tc.want.LastContent
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("result (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.deltas, deltas); d != "" {
				t.Errorf("deltas (-want +got):\n%s", d)
			}
		})
	}
}

func TestAnErrorEventIsAnAPIErrorOfStatus200(t *testing.T) {
	_, err := Read(strings.NewReader("data: {\"error\":{\"message\":\"m\",\"code\":\"model_waking_timeout\"}}\n\n"), nil)
	var ev *APIError
	if !errors.As(err, &ev) || ev.Status != 200 || ev.Code != "model_waking_timeout" {
		t.Errorf("err = %#v, want an *APIError of status 200 with code model_waking_timeout", err)
	}
}

func TestTokensPerSecondCountsTheTokensAfterTheFirst(t *testing.T) {
	first := time.Unix(100, 0)
	for _, tc := range []struct {
		name string
		res  Result
		want float64
	}{
		{"5 tokens over 2 s after the first", Result{Usage: &Usage{CompletionTokens: 5}, FirstContent: first, LastContent: first.Add(2 * time.Second)}, 2},
		{"no usage chunk", Result{FirstContent: first, LastContent: first.Add(time.Second)}, 0},
		{"one token", Result{Usage: &Usage{CompletionTokens: 1}, FirstContent: first, LastContent: first}, 0},
		{"all content in one read", Result{Usage: &Usage{CompletionTokens: 8}, FirstContent: first, LastContent: first}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.res.TokensPerSecond(); got != tc.want {
				t.Errorf("TokensPerSecond() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTheFirstTokenOfARecordedSimulatorStream: over a stream recorded from
// the simulator (testdata/sim-chat-stream.txt: the role chunk with empty
// content, flushed before the time to first token, then the tokens), the
// first content is taken when the first non-empty delta ("Tune") has
// arrived, not at the role chunk and not later.
func TestTheFirstTokenOfARecordedSimulatorStream(t *testing.T) {
	b, err := os.ReadFile("testdata/sim-chat-stream.txt")
	if err != nil {
		t.Fatal(err)
	}
	r := &LineReader{Lines: strings.Split(strings.TrimRight(string(b), "\n"), "\n")}
	if !strings.Contains(r.Lines[0], `"role":"assistant","content":""`) {
		t.Fatalf("the recording does not start with the role chunk: %s", r.Lines[0])
	}
	linesAtFirst := -1
	res, err := Read(r, func(string) {
		if linesAtFirst < 0 {
			linesAtFirst = r.Handed
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.IndexFunc(r.Lines, func(l string) bool { return strings.Contains(l, `"content":"Tune"`) }) + 1
	if linesAtFirst != want || res.FirstContent.IsZero() {
		t.Errorf("first content taken after %d lines of the stream (at %v), want %d (the first non-empty delta)", linesAtFirst, res.FirstContent, want)
	}
}

func TestAnsweredNeedsAFinishReasonAndDONENotText(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  *Result
		want bool
	}{
		{"finished with [DONE], no text", &Result{Done: true, FinishReason: "length"}, true},
		{"no finish reason", &Result{Done: true, Content: "a"}, false},
		{"cut before [DONE]", &Result{FinishReason: "stop", Content: "a"}, false},
		{"no result", nil, false},
	} {
		if got := tc.res.Answered(); got != tc.want {
			t.Errorf("%s: Answered() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
