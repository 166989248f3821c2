package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/model-orchestra/operator/internal/queue"
)

// responsesCall is one POST /v1/responses on its way through the queue.
type responsesCall struct {
	req     *responsesRequest
	owner   string     // the token name the response is stored under
	history []respItem // the previous response's conversation, output included
	resp    responseObject
	msgID   string
}

// prepareResponses parses a Responses API body, loads the conversation of
// its previous_response_id (404 when the caller's token has none by that
// id), and returns the chat request for the engine.
func (g *Gateway) prepareResponses(ctx context.Context, p *Principal, x *exchange, body []byte) (*responsesCall, parsedRequest, error) {
	rr, err := parseResponsesRequest(body)
	if err != nil {
		return nil, parsedRequest{}, err
	}
	if g.responses == nil {
		rr.Store = false // nothing is kept: the response says so
	}
	rc := &responsesCall{req: rr, owner: p.Name, msgID: "msg_" + newRequestID()}
	if rr.PreviousID != "" {
		prev, err := g.loadResponse(ctx, p.Name, rr.PreviousID)
		if err != nil {
			return nil, parsedRequest{}, storeUnavailable(err)
		}
		if prev == nil {
			return nil, parsedRequest{}, responseNotFound("previous_response_id", rr.PreviousID)
		}
		rc.history = slices.Concat(prev.Input, prev.Response.Output)
	}
	rc.resp = rr.newResponse("resp_"+x.id, x.start)
	req := parsedRequest{Model: rr.Model, Stream: rr.Stream, Body: rr.chatBody(rc.history)}
	if rr.MaxOutputTokens != nil {
		req.MaxTokens = *rr.MaxOutputTokens
	}
	return rc, req, nil
}

// storeUnavailable is the 503 when the response store cannot be reached.
func storeUnavailable(err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, err: err, typ: typeServer, code: "service_unavailable",
		retryAfter: time.Second, message: "The response store is unavailable; retry the request."}
}

// store keeps the finished response with its conversation, when asked.
func (g *Gateway) store(ctx context.Context, rc *responsesCall) error {
	if !rc.req.Store || g.responses == nil {
		return nil
	}
	input := slices.Clone(rc.history)
	for _, it := range rc.req.Input {
		it.ID, it.Status = "msg_"+newRequestID(), "completed"
		input = append(input, it)
	}
	b, err := json.Marshal(storedResponse{Response: rc.resp, Input: input})
	if err != nil {
		return err
	}
	if err := g.responses.Put(ctx, responseKey(rc.owner, rc.resp.ID), b); err != nil {
		return storeUnavailable(fmt.Errorf("storing response %s: %w", rc.resp.ID, err))
	}
	return nil
}

// proxyResponses answers a Responses API request from the engine's chat
// completion: one response object, or the Responses event stream.
func (g *Gateway) proxyResponses(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, rc *responsesCall, next firstFunc) error {
	if rc.req.Stream {
		return g.streamResponses(ctx, w, reply, x, rc, next)
	}
	var body bytes.Buffer
	var head queue.Chunk
	for first := true; ; first = false {
		var c queue.Chunk
		var err error
		if first {
			c, err = next(ctx, w, x)
		} else {
			c, err = reply.Next(ctx)
		}
		if errors.Is(err, io.EOF) {
			if first {
				return errEmptyReply
			}
			break
		}
		if err != nil {
			return fmt.Errorf("reading answer: %w", err)
		}
		if first {
			head = c
		}
		body.Write(c.Data)
	}
	if head.Status != 0 && head.Status != http.StatusOK {
		// The engine's own refusal (a 400 about a field, say) as it is.
		copyHeaders(w, head.Header, "application/json")
		x.status, x.started = head.Status, true
		w.WriteHeader(head.Status)
		_, _ = w.Write(body.Bytes())
		return nil
	}
	x.usage = usageOf(body.Bytes())
	text, finish, err := chatAnswer(body.Bytes())
	if err != nil {
		return badAnswer(err)
	}
	rc.resp.finish(rc.msgID, text, finish, x.usage)
	if err := g.store(ctx, rc); err != nil {
		return err
	}
	b, _ := json.Marshal(rc.resp)
	x.status, x.started = http.StatusOK, true
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(append(b, '\n')); err != nil {
		return errClientGone
	}
	return nil
}

// respEvents writes Responses API server-sent events. Events are written
// as they come and flushed by flush: the stream flushes when no more of
// the answer has arrived (as proxyStream does), so that events that are
// ready together reach the client in one write.
type respEvents struct {
	w     http.ResponseWriter
	seq   int
	wrote bool // something was written since the last flush
}

func (e *respEvents) emit(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = e.seq
	e.seq++
	b, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+len(typ)+20)
	buf = append(append(append(buf, "event: "...), typ...), "\ndata: "...)
	buf = append(append(buf, b...), "\n\n"...)
	if _, err := e.w.Write(buf); err != nil {
		return errClientGone
	}
	e.wrote = true
	return nil
}

// flush sends what was written since the last flush.
func (e *respEvents) flush() error {
	if !e.wrote {
		return nil
	}
	e.wrote = false
	if err := http.NewResponseController(e.w).Flush(); err != nil {
		return errClientGone
	}
	return nil
}

// streamResponses translates the engine's chat completion stream into the
// Responses API events: response.created, response.in_progress,
// response.output_item.added, response.content_part.added, one
// response.output_text.delta per engine delta, then
// response.output_text.done, response.content_part.done,
// response.output_item.done and response.completed (stored first, when
// asked, so that a continuation can follow at once).
func (g *Gateway) streamResponses(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, rc *responsesCall, next firstFunc) error {
	first, done, err := g.openStream(ctx, w, reply, x, next)
	if done {
		return err
	}
	ev := &respEvents{w: w}
	item := respItem{ID: rc.msgID, Type: "message", Status: "in_progress", Role: "assistant", Content: []respPart{}}
	ids := func(m map[string]any) map[string]any {
		m["item_id"], m["output_index"], m["content_index"] = rc.msgID, 0, 0
		return m
	}
	for _, step := range []struct {
		typ    string
		fields map[string]any
	}{
		{"response.created", map[string]any{"response": rc.resp}},
		{"response.in_progress", map[string]any{"response": rc.resp}},
		{"response.output_item.added", map[string]any{"output_index": 0, "item": item}},
		{"response.content_part.added", ids(map[string]any{"part": outputPart("")})},
	} {
		if err := ev.emit(step.typ, step.fields); err != nil {
			return err
		}
	}

	var text bytes.Buffer
	var finish string
	var pending []byte
	handle := func(event []byte) error {
		data := sseData(event)
		if data == nil || string(data) == "[DONE]" {
			return nil
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage    `json:"usage"`
			Error *struct{} `json:"error"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			return badAnswer(fmt.Errorf("decoding a chat stream event: %w", err))
		}
		if c.Error != nil {
			return badAnswer(fmt.Errorf("the model server's stream ended with an error: %s", data))
		}
		if c.Usage != nil {
			x.usage = *c.Usage
		}
		if len(c.Choices) == 0 {
			return nil
		}
		if fr := c.Choices[0].FinishReason; fr != nil {
			finish = *fr
		}
		if d := c.Choices[0].Delta.Content; d != "" {
			if x.ttft == 0 {
				x.ttft = time.Since(x.start)
			}
			text.WriteString(d)
			return ev.emit("response.output_text.delta", ids(map[string]any{"delta": d, "logprobs": []any{}}))
		}
		return nil
	}
	poller, _ := reply.(queue.Poller)
	data := first.Data
	for {
		pending = append(pending, data...)
		for {
			end, nxt := eventEnd(pending)
			if end < 0 {
				break
			}
			if err := handle(pending[:end]); err != nil {
				return err
			}
			pending = pending[nxt:]
		}
		// What already arrived is written before the flush: one write and
		// one wake-up of the client for the opening events and the first
		// delta, and for chunks that piled up, none delayed.
		c, flushErr, err := nextChunk(ctx, reply, poller, ev.flush)
		if flushErr != nil {
			return flushErr
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("streaming answer: %w", err)
		}
		data = c.Data
	}
	if len(bytes.TrimSpace(pending)) > 0 {
		if err := handle(pending); err != nil {
			return err
		}
	}
	// The last deltas go out before the answer is stored.
	if err := ev.flush(); err != nil {
		return err
	}
	rc.resp.finish(rc.msgID, text.String(), finish, x.usage)
	if err := g.store(ctx, rc); err != nil {
		return err
	}
	part := outputPart(text.String())
	for _, step := range []struct {
		typ    string
		fields map[string]any
	}{
		{"response.output_text.done", ids(map[string]any{"text": text.String(), "logprobs": []any{}})},
		{"response.content_part.done", ids(map[string]any{"part": part})},
		{"response.output_item.done", map[string]any{"output_index": 0, "item": rc.resp.Output[0]}},
		{terminalEvent(rc.resp.Status), map[string]any{"response": rc.resp}},
	} {
		if err := ev.emit(step.typ, step.fields); err != nil {
			return err
		}
	}
	return ev.flush()
}

// terminalEvent is the last event of a stream whose response has status.
func terminalEvent(status string) string {
	if status == "incomplete" {
		return "response.incomplete"
	}
	return "response.completed"
}

// sseData is the data of one SSE event (its data lines joined), or nil.
func sseData(event []byte) []byte {
	var data []byte
	for line := range bytes.Lines(event) {
		line = bytes.TrimRight(line, "\r\n")
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(rest, []byte(" "))...)
		}
	}
	return data
}

// storedResponse wraps the handlers of stored responses: authentication,
// the id, the metrics and the access log.
func (g *Gateway) storedResponse(h func(w http.ResponseWriter, r *http.Request, owner, id string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		x := &exchange{start: time.Now(), id: newRequestID(), endpoint: endpointStoredResponses, model: modelNone}
		w.Header().Set("X-Request-Id", x.id)
		p, err := g.authenticate(r)
		if err == nil {
			x.consumer = p.Name
			err = h(w, r, p.Name, r.PathValue("id"))
		}
		if err != nil {
			g.fail(w, x, err)
		} else {
			x.status = http.StatusOK
		}
		g.record(r, x)
	}
}

// getStored loads owner's response id, or a 404.
func (g *Gateway) getStored(ctx context.Context, owner, id string) (*storedResponse, error) {
	s, err := g.loadResponse(ctx, owner, id)
	switch {
	case err != nil:
		return nil, storeUnavailable(err)
	case s == nil:
		return nil, responseNotFound("", id)
	}
	return s, nil
}

// getResponse serves GET /v1/responses/{id}.
func (g *Gateway) getResponse(w http.ResponseWriter, r *http.Request, owner, id string) error {
	s, err := g.getStored(r.Context(), owner, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.Response)
	return nil
}

// deleteResponse serves DELETE /v1/responses/{id}.
func (g *Gateway) deleteResponse(w http.ResponseWriter, r *http.Request, owner, id string) error {
	if _, err := g.getStored(r.Context(), owner, id); err != nil {
		return err
	}
	if err := g.responses.Delete(r.Context(), responseKey(owner, id)); err != nil {
		return storeUnavailable(err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
	return nil
}

// responseInputItems serves GET /v1/responses/{id}/input_items: the items
// of the conversation that led to the response, newest first unless
// order=asc, limit (1-100, default 20) at a time after the item id after.
func (g *Gateway) responseInputItems(w http.ResponseWriter, r *http.Request, owner, id string) error {
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return invalidRequest("limit", "Invalid 'limit': expected an integer from 1 to 100.")
		}
		limit = n
	}
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		return invalidRequest("order", "Invalid 'order': expected asc or desc.")
	}
	s, err := g.getStored(r.Context(), owner, id)
	if err != nil {
		return err
	}
	items := slices.Clone(s.Input)
	if order != "asc" {
		slices.Reverse(items)
	}
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(items, func(it respItem) bool { return it.ID == after })
		if i < 0 {
			return invalidRequest("after", "No input item with id '%s' in response '%s'.", after, id)
		}
		items = items[i+1:]
	}
	more := len(items) > limit
	items = items[:min(limit, len(items))]
	list := map[string]any{"object": "list", "data": items, "has_more": more, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		list["first_id"], list["last_id"] = items[0].ID, items[len(items)-1].ID
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}
