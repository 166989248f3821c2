// Package ssetest reads OpenAI-compatible chat completion event streams
// (text/event-stream of chat.completion.chunk objects ending with
// "data: [DONE]") for the tests and benchmarks, and owns their one rule
// for the time to first token: the moment the first chunk with non-empty
// delta content is read. An engine first sends a chunk with only the
// assistant role, or empty content, before its first token; that chunk is
// not a token.
package ssetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Result is what a streamed chat completion produced.
type Result struct {
	Content      string
	FinishReason string
	// Chunks is the number of SSE events with a content delta.
	Chunks int
	// Events is the number of SSE events of the answer (the role, content,
	// finish and usage events; not an error event, not [DONE]).
	Events int
	// Done is true when the stream ended with "data: [DONE]".
	Done bool
	// Usage is the stream's usage chunk (stream_options.include_usage);
	// nil without one.
	Usage *Usage
	// Models are the distinct model names the events carried, in order.
	Models []string
	// FirstContent is when the first chunk with non-empty delta content
	// was read: the time to first token is FirstContent minus the moment
	// the request was sent. LastContent is when the last one was read.
	// Both are zero when the stream carried no content.
	FirstContent, LastContent time.Time
	// Header is the answer's HTTP header.
	Header http.Header
}

// Answered is true when the stream ended with [DONE] after a finish reason:
// the engine generated an answer. Its text may be empty with the generated
// test models: their random weights sometimes draw only tokens that decode
// to no text within max_tokens (bytes of an unfinished UTF-8 sequence,
// which Ollama holds back, or the end token first).
func (r *Result) Answered() bool {
	return r != nil && r.Done && r.FinishReason != ""
}

// Usage is the token count of a usage chunk.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// PromptTokensDetails is set by engines that report prompt tokens
	// served from their prefix cache.
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
}

// TokensPerSecond is the decode rate after the first token: the usage's
// completion tokens but the first over the time from the first to the last
// content. It is 0 without a usage chunk or with fewer than 2 tokens.
func (r *Result) TokensPerSecond() float64 {
	if r.Usage == nil || r.Usage.CompletionTokens < 2 || !r.LastContent.After(r.FirstContent) {
		return 0
	}
	return float64(r.Usage.CompletionTokens-1) / r.LastContent.Sub(r.FirstContent).Seconds()
}

// APIError is an OpenAI-style error answer: a refusal with its HTTP
// status, or an error event inside a stream (Status 200: the answer had
// already started).
type APIError struct {
	Status  int
	Message string
	Type    string
	Code    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("HTTP %d %s (%s): %s", e.Status, e.Code, e.Type, e.Message)
}

// Post sends body, a chat completion request with "stream": true, to url
// (the whole endpoint URL) with token as its bearer token (none when
// empty) and the extra header, and reads the answer with Read. sent is when
// the request was sent: the time to first token is res.FirstContent minus
// sent. A refusal is an *APIError with its HTTP status; so is an answer
// that is not an event stream.
func Post(ctx context.Context, url, token string, header http.Header, body any, onDelta func(string)) (sent time.Time, res *Result, err error) {
	b, err := json.Marshal(body)
	if err != nil {
		return sent, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return sent, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	sent = time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sent, nil, fmt.Errorf("POST %s: %w", req.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return sent, nil, readAPIError(resp)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return sent, nil, fmt.Errorf("expected an event stream, got Content-Type %q", ct)
	}
	res, err = Read(resp.Body, onDelta)
	if res != nil {
		res.Header = resp.Header
	}
	return sent, res, err
}

func readAPIError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error.Message == "" {
		return &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(data))}
	}
	return &APIError{Status: resp.StatusCode, Message: e.Error.Message, Type: e.Error.Type, Code: fmt.Sprint(e.Error.Code)}
}

// Read reads a chat completion event stream to its end, calling onDelta
// (if set) with each non-empty piece of the answer as it arrives. An error
// event is an *APIError with Status 200; an event that is not JSON, or a stream that
// ends without [DONE], is an error too. The Result holds what was read
// before any error.
func Read(body io.Reader, onDelta func(string)) (*Result, error) {
	res := &Result{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			res.Done = true
			break
		}
		var ev struct {
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *Usage `json:"usage"`
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return res, fmt.Errorf("decoding stream event %q: %w", data, err)
		}
		if ev.Error != nil {
			return res, &APIError{Status: http.StatusOK, Message: ev.Error.Message, Type: ev.Error.Type, Code: fmt.Sprint(ev.Error.Code)}
		}
		res.Events++
		if ev.Model != "" && !slices.Contains(res.Models, ev.Model) {
			res.Models = append(res.Models, ev.Model)
		}
		if ev.Usage != nil {
			res.Usage = ev.Usage
		}
		for _, c := range ev.Choices {
			if c.Delta.Content != "" {
				now := time.Now()
				if res.FirstContent.IsZero() {
					res.FirstContent = now
				}
				res.LastContent = now
				res.Content += c.Delta.Content
				res.Chunks++
				if onDelta != nil {
					onDelta(c.Delta.Content)
				}
			}
			if c.FinishReason != nil {
				res.FinishReason = *c.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("reading the stream: %w", err)
	}
	if !res.Done {
		return res, fmt.Errorf("the stream ended without [DONE] after %d chunks", res.Chunks)
	}
	return res, nil
}

// LineReader hands out one line of a recorded stream per Read, as an
// engine flushes one chunk at a time, and counts the lines handed out in
// Handed: a test reads it at the moment a reader took the first token.
type LineReader struct {
	Lines  []string
	Handed int
}

func (l *LineReader) Read(p []byte) (int, error) {
	if l.Handed == len(l.Lines) {
		return 0, io.EOF
	}
	n := copy(p, l.Lines[l.Handed]+"\n")
	l.Handed++
	return n, nil
}
