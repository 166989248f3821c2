package gateway

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSSERelay(t *testing.T) {
	const (
		content = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\n"
		usageEv = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n"
		done    = "data: [DONE]\n\n"
	)
	tests := []struct {
		name         string
		chunks       []string
		includeUsage bool
		want         string
		wantUsage    usage
	}{{
		name:   "usage chunk dropped when not asked for",
		chunks: []string{content + usageEv + done},
		want:   content + done, wantUsage: usage{3, 2, 5},
	}, {
		name:         "usage chunk kept when asked for",
		chunks:       []string{content, usageEv, done},
		includeUsage: true,
		want:         content + usageEv + done, wantUsage: usage{3, 2, 5},
	}, {
		name:   "events cut at every byte",
		chunks: splitEvery(content+usageEv+done, 1),
		want:   content + done, wantUsage: usage{3, 2, 5},
	}, {
		name:   "CRLF line endings",
		chunks: []string{"data: {\"choices\":[]}\r\n\r\n", "data: [DONE]\r\n\r\n"},
		want:   "data: {\"choices\":[]}\r\n\r\ndata: [DONE]\r\n\r\n",
	}, {
		name:   "comments and a final event without its blank line",
		chunks: []string{": keep-alive\n\n", "data: [DONE]"},
		want:   ": keep-alive\n\ndata: [DONE]\n\n",
	}, {
		name:      "usage with choices (continuous usage stats) is relayed",
		chunks:    []string{"data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n"},
		want:      "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n",
		wantUsage: usage{1, 1, 2},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			x := &exchange{start: time.Now()}
			s := sseRelay{w: &out, x: x, includeUsage: tt.includeUsage}
			for _, c := range tt.chunks {
				if err := s.feed([]byte(c)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.finish(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, out.String()); diff != "" {
				t.Errorf("relayed (-want +got):\n%s", diff)
			}
			if x.usage != tt.wantUsage {
				t.Errorf("usage = %+v, want %+v", x.usage, tt.wantUsage)
			}
		})
	}
}

func splitEvery(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		k := min(n, len(s))
		out = append(out, s[:k])
		s = s[k:]
	}
	return out
}
