package main

import (
	"context"
	"errors"
	"time"

	"github.com/model-orchestra/operator/internal/ssetest"
)

// firstToken streams a chat completion from base and returns the moment
// of its first token (ssetest: the first chunk with non-empty delta
// content, not the role chunk the simulator flushes before its time to
// first token has passed).
func firstToken(base string) (time.Time, error) {
	_, res, err := ssetest.Post(context.Background(), base+"/v1/chat/completions", "", nil, map[string]any{
		"messages": []map[string]string{{"role": "user", "content": "hi"}}, "stream": true,
	}, nil)
	if err != nil {
		return time.Time{}, err
	}
	if res.FirstContent.IsZero() {
		return time.Time{}, errors.New("no token in the stream")
	}
	return res.FirstContent, nil
}
