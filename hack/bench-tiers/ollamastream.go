package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// ollamaDone is the final chunk of a streamed /api/chat answer: Ollama's
// own durations of the request, in nanoseconds.
type ollamaDone struct {
	Done               bool  `json:"done"`
	TotalDuration      int64 `json:"total_duration"`
	LoadDuration       int64 `json:"load_duration"`
	PromptEvalCount    int   `json:"prompt_eval_count"`
	PromptEvalDuration int64 `json:"prompt_eval_duration"`
	EvalCount          int   `json:"eval_count"`
}

// ollamaChatStream reads a streamed /api/chat answer (one JSON object a
// line) to its end and returns now() at the first chunk with non-empty
// message content, and the final chunk.
func ollamaChatStream(r io.Reader, now func() time.Time) (time.Time, ollamaDone, error) {
	var first time.Time
	var done ollamaDone
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var chunk struct {
			ollamaDone
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &chunk); err != nil {
			return first, done, fmt.Errorf("a chunk of the answer: %w", err)
		}
		if chunk.Error != "" {
			return first, done, fmt.Errorf("ollama: %s", chunk.Error)
		}
		if first.IsZero() && chunk.Message.Content != "" {
			first = now()
		}
		if chunk.Done {
			done = chunk.ollamaDone
		}
	}
	if err := sc.Err(); err != nil {
		return first, done, err
	}
	if !done.Done {
		return first, done, errors.New("the answer ended without its final chunk")
	}
	if first.IsZero() {
		return first, done, errors.New("no token in the answer")
	}
	return first, done, nil
}
