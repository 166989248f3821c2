package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/queue"
)

// passedHeaders are the engine response headers passed on to the client.
var passedHeaders = []string{"Content-Type"}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// proxyUnary sends a non-streaming answer. The whole answer is read before
// anything is written, so that a failure half-way still gets a proper
// status and JSON error instead of a truncated body.
func (g *Gateway) proxyUnary(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, next firstFunc) error {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)

	var head queue.Chunk
	first := true
	for {
		var c queue.Chunk
		var err error
		if first {
			c, err = next(ctx, w, x) // may wait for a wake (waking.go)
		} else {
			c, err = reply.Next(ctx)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading answer: %w", err)
		}
		if first {
			head, first = c, false
		}
		buf.Write(c.Data)
	}
	if first {
		return errEmptyReply
	}
	status := head.Status
	if status == 0 {
		status = http.StatusOK
	}
	if status == http.StatusOK {
		x.usage = usageOf(buf.Bytes())
	}
	copyHeaders(w, head.Header, "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	x.status, x.started = status, true
	w.WriteHeader(status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		return errClientGone
	}
	return nil
}

// copyHeaders copies the engine headers worth passing on, with a default
// Content-Type.
func copyHeaders(w http.ResponseWriter, from http.Header, contentType string) {
	h := w.Header()
	for _, k := range passedHeaders {
		if v := from.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", contentType)
	}
}

// usageOf extracts the usage of a non-streaming answer: the top-level
// "usage" member (matched without regard to case, as json.Unmarshal
// matches struct fields). Only that member is decoded.
func usageOf(body []byte) usage {
	if kind(body) != '{' || !json.Valid(body) {
		return usage{}
	}
	var raw json.RawMessage
	found := 0
	eachMember(body, func(key string, val json.RawMessage) {
		if strings.EqualFold(key, usageName) {
			raw = val
			found++
		}
	})
	if found > 1 {
		// Several spellings: json.Unmarshal's rules for them apply.
		return usageOfDecoded(body)
	}
	var u *usage
	if raw == nil || json.Unmarshal(raw, &u) != nil || u == nil {
		return usage{}
	}
	return *u
}

const usageName = "usage"

// usageOfDecoded extracts the usage by decoding the whole body.
func usageOfDecoded(body []byte) usage {
	var v struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil || v.Usage == nil {
		return usage{}
	}
	return *v.Usage
}

// openStream waits for the first chunk of a streamed answer (keep-alives
// may go out meanwhile while a model wakes, waking.go) and starts the
// client's event stream. done is true when the request needs nothing more:
// no first chunk came (err says why), or the engine refused the request
// with a JSON error, not a stream, and the refusal was relayed.
func (g *Gateway) openStream(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, next firstFunc) (first queue.Chunk, done bool, err error) {
	first, err = next(ctx, w, x)
	if errors.Is(err, io.EOF) {
		return first, true, errEmptyReply
	}
	if err != nil {
		return first, true, fmt.Errorf("waiting for the first chunk: %w", err)
	}
	if first.Status != 0 && first.Status != http.StatusOK {
		if x.started {
			return first, true, refusalInStream(ctx, w, reply, x, first)
		}
		return first, true, g.relayRefusal(ctx, w, reply, x, first)
	}
	startStream(w, x)
	return first, false, nil
}

// proxyStream relays a streaming answer event by event. The engine is
// always asked for the usage chunk; it is counted, and dropped unless the
// client asked for it. An error after the first event is sent as an SSE
// error event by fail.
func (g *Gateway) proxyStream(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, includeUsage bool, next firstFunc) error {
	first, done, err := g.openStream(ctx, w, reply, x, next)
	if done {
		return err
	}
	rc := http.NewResponseController(w)

	s := sseRelay{w: w, includeUsage: includeUsage, x: x}
	poller, _ := reply.(queue.Poller)
	data := first.Data
	for {
		if err := s.feed(data); err != nil {
			return err
		}
		// What already arrived is written before the flush: one write and
		// one wake-up of the client for chunks that piled up, none delayed.
		c, flushErr, err := nextChunk(ctx, reply, poller, func() error {
			if s.wrote {
				if err := rc.Flush(); err != nil {
					return errClientGone
				}
				s.wrote = false
			}
			return nil
		})
		if flushErr != nil {
			return flushErr
		}
		if errors.Is(err, io.EOF) {
			return s.finish()
		}
		if err != nil {
			return fmt.Errorf("streaming answer: %w", err)
		}
		data = c.Data
	}
}

// nextChunk is the reply's next chunk: one that already arrived
// (queue.Poller) without a flush, else, once flush has sent what the
// stream wrote, the next one to arrive. Both streaming relays (chat and
// completions here, the Responses API in responses_http.go) pace their
// writes with it. A flush's error comes back as flushErr, the reply's as
// err (io.EOF at its end).
func nextChunk(ctx context.Context, reply queue.Reply, poller queue.Poller, flush func() error) (c queue.Chunk, flushErr, err error) {
	if poller != nil {
		var ready bool
		if c, ready, err = poller.Poll(); ready || err != nil {
			return c, nil, err
		}
	}
	if err := flush(); err != nil {
		return queue.Chunk{}, err, nil
	}
	c, err = reply.Next(ctx)
	return c, nil, err
}

// relayRefusal passes on an engine error answered to a streaming request.
func (g *Gateway) relayRefusal(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, head queue.Chunk) error {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if err := readRefusal(ctx, reply, head, buf); err != nil {
		return err
	}
	copyHeaders(w, head.Header, "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	x.status, x.started = head.Status, true
	w.WriteHeader(head.Status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		return errClientGone
	}
	return nil
}

// readRefusal reads an engine's refusal of a request, head and the rest of
// the reply, into buf.
func readRefusal(ctx context.Context, reply queue.Reply, head queue.Chunk, buf *bytes.Buffer) error {
	buf.Write(head.Data)
	for {
		c, err := reply.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading error answer: %w", err)
		}
		buf.Write(c.Data)
	}
}

// sseRelay splits the engine's bytes into server-sent events, which chunks
// may cut anywhere, and writes them on.
type sseRelay struct {
	w            io.Writer
	x            *exchange
	includeUsage bool
	pending      []byte // the start of an event cut by a chunk boundary
	wrote        bool   // something was written since the last flush
}

// feed relays every complete event in pending+data and keeps the rest.
func (s *sseRelay) feed(data []byte) error {
	buf := data
	if len(s.pending) > 0 {
		s.pending = append(s.pending, data...)
		buf = s.pending
	}
	for {
		end, next := eventEnd(buf)
		if end < 0 {
			break
		}
		if err := s.event(buf[:end], buf[:next]); err != nil {
			return err
		}
		buf = buf[next:]
	}
	if len(buf) == 0 {
		s.pending = s.pending[:0]
		return nil
	}
	// Keep the incomplete event; copy it, since data belongs to the queue.
	s.pending = append(s.pending[:0], buf...)
	return nil
}

// finish relays an event left without its terminating blank line.
func (s *sseRelay) finish() error {
	if len(bytes.TrimSpace(s.pending)) == 0 {
		return nil
	}
	ev := append(s.pending, "\n\n"...)
	return s.event(ev[:len(ev)-2], ev)
}

// eventEnd finds the first blank line ending an event: it returns the end
// of the event's text and the start of what follows.
func eventEnd(b []byte) (end, next int) {
	for i := 0; i < len(b); i++ {
		i2 := bytes.IndexByte(b[i:], '\n')
		if i2 < 0 {
			return -1, -1
		}
		i += i2
		// b[i] is '\n'; a blank line follows when the next line is empty.
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i, i + 2
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i, i + 3
		}
	}
	return -1, -1
}

var usageKey = []byte(`"usage"`)

// event relays one event. text is the event without its terminator; raw
// includes it and is what is written.
func (s *sseRelay) event(text, raw []byte) error {
	if bytes.Contains(text, usageKey) {
		if u, usageOnly, ok := parseUsageEvent(text); ok {
			s.x.usage = u
			if usageOnly && !s.includeUsage {
				return nil
			}
		}
	}
	if s.x.ttft == 0 && carriesText(text) {
		s.x.ttft = time.Since(s.x.start)
	}
	if _, err := s.w.Write(raw); err != nil {
		return errClientGone
	}
	s.wrote = true
	return nil
}

// textKeys name a chunk's text: a chat delta's "content", a legacy
// completion's "text".
var textKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`)}

// carriesText reports whether an event has a non-empty content or text
// string. The role chunk (content "") and finish and usage chunks do not:
// time to first token is the first text a client sees. It scans bytes, not
// JSON: a key inside a string is escaped (\"content\") and never matches.
func carriesText(text []byte) bool {
	for _, key := range textKeys {
		rest := text
		for {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			j := skipSpace(rest, 0)
			if j < len(rest) && rest[j] == ':' {
				j = skipSpace(rest, j+1)
				if j+1 < len(rest) && rest[j] == '"' && rest[j+1] != '"' {
					return true
				}
			}
		}
	}
	return false
}

// parseUsageEvent reads the usage of a chunk event. usageOnly is true for
// the final usage chunk, which has no choices.
func parseUsageEvent(text []byte) (u usage, usageOnly, ok bool) {
	data := sseData(text)
	var chunk struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *usage            `json:"usage"`
	}
	if json.Unmarshal(data, &chunk) != nil || chunk.Usage == nil {
		return usage{}, false, false
	}
	return *chunk.Usage, len(chunk.Choices) == 0, true
}
