package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/model-orchestra/operator/internal/queue"
)

// WakeStates tells the gateway which applications are waking: scaled to
// zero by their lifecycle, with pods starting because requests arrived
// (internal/lifecyclestate.States implements it from the lifecycle bucket).
type WakeStates interface {
	// Waking reports whether requests for app wait for its pods to start,
	// and why the wake does not progress when the lifecycle knows.
	Waking(app string) (waking bool, problem string)
}

// wakeCheck paces the checks of a waiting request against its
// application's state and maxWait.
const wakeCheck = 250 * time.Millisecond

// firstFunc returns the first chunk of an answer.
type firstFunc func(ctx context.Context, w http.ResponseWriter, x *exchange) (queue.Chunk, error)

// waitFirst returns how the first chunk of model's answer is awaited. A
// request for an application with a lifecycle may wait for it to wake:
// while it does, a streamed request gets its response headers and an SSE
// comment every WakeKeepAlive, so that clients with short read timeouts
// keep waiting, and past maxWait the request fails with 503
// model_waking_timeout and is removed from the queue (by the reply's
// Close). A request whose application is awake waits as any other: the
// queue's own bounds apply.
func (g *Gateway) waitFirst(model *ModelConfig, reply queue.Reply) firstFunc {
	if g.wake == nil || model.MaxWait.Duration <= 0 {
		return func(ctx context.Context, _ http.ResponseWriter, _ *exchange) (queue.Chunk, error) {
			return reply.Next(ctx)
		}
	}
	return func(ctx context.Context, w http.ResponseWriter, x *exchange) (queue.Chunk, error) {
		return g.awaitWake(ctx, w, x, model, reply)
	}
}

type nextResult struct {
	chunk queue.Chunk
	err   error
}

func (g *Gateway) awaitWake(ctx context.Context, w http.ResponseWriter, x *exchange, model *ModelConfig, reply queue.Reply) (queue.Chunk, error) {
	nctx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan nextResult, 1)
	go func() {
		c, err := reply.Next(nctx)
		got <- nextResult{c, err}
	}()
	deadline := x.start.Add(model.MaxWait.Duration)
	check := time.NewTicker(wakeCheck)
	defer check.Stop()
	every := g.cfg.Timeouts.WakeKeepAlive.Duration
	if every <= 0 {
		every = 5 * time.Second
	}
	var lastBeat time.Time
	for {
		waking, problem := g.wake.Waking(model.App)
		now := time.Now()
		if waking && x.stream && now.Sub(lastBeat) >= every {
			if err := g.keepAlive(w, x, model); err != nil {
				return queue.Chunk{}, err
			}
			lastBeat = now
		}
		if waking && now.After(deadline) {
			stop()
			r := <-got
			if r.err == nil {
				return r.chunk, nil // the answer won the race: never drop it
			}
			g.logger.Warn("request waited longer than maxWait for its model to wake", "request_id", x.id, "model", model.Name, "app", model.App, "maxWait", model.MaxWait.Duration, "problem", problem)
			return queue.Chunk{}, modelWakingTimeout(model.Name, model.MaxWait.Duration, problem)
		}
		select {
		case r := <-got:
			return r.chunk, r.err
		case <-check.C:
		}
	}
}

// keepAlive starts a streamed response, if not yet started, and sends one
// SSE comment, which clients ignore.
func (g *Gateway) keepAlive(w http.ResponseWriter, x *exchange, model *ModelConfig) error {
	if !x.started {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		x.status, x.started = http.StatusOK, true
		w.WriteHeader(http.StatusOK)
	}
	if _, err := fmt.Fprintf(w, ": waiting for model %s to wake\n\n", model.Name); err != nil {
		return errClientGone
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		return errClientGone
	}
	return nil
}

// refusalInStream sends an engine's refusal of a streamed request whose
// headers were already sent as keep-alives: its JSON error as one SSE
// event, without [DONE].
func refusalInStream(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, head queue.Chunk) error {
	body := append([]byte(nil), head.Data...)
	for {
		c, err := reply.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading error answer: %w", err)
		}
		body = append(body, c.Data...)
	}
	var ev []byte
	for line := range bytes.Lines(bytes.TrimSpace(body)) {
		ev = append(append(ev, "data: "...), bytes.TrimRight(line, "\r\n")...)
		ev = append(ev, '\n')
	}
	ev = append(ev, '\n')
	x.status = head.Status
	if _, err := w.Write(ev); err != nil {
		return errClientGone
	}
	_ = http.NewResponseController(w).Flush()
	return nil
}
