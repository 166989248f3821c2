package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// firstToken streams a chat completion from base and returns the moment
// of its first token: the first SSE chunk whose delta carries NON-EMPTY
// content. An OpenAI-compatible server (the simulator among them) first
// flushes a role chunk, {"delta":{"role":"assistant","content":""}},
// before its time to first token has passed; that chunk is not a token.
func firstToken(base string) (time.Time, error) {
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if err != nil {
		return time.Time{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("chat after wake: %d", resp.StatusCode)
	}
	return firstContent(resp.Body, time.Now)
}

// firstContent reads an SSE stream of chat completion chunks to its end
// and returns now() at the first chunk with non-empty delta content.
func firstContent(r io.Reader, now func() time.Time) (time.Time, error) {
	var first time.Time
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !first.IsZero() || !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) != nil {
			continue
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" {
				first = now()
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return first, err
	}
	if first.IsZero() {
		return first, errors.New("no token in the stream")
	}
	return first, nil
}
