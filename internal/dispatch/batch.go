package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/batch"
	"github.com/model-orchestra/operator/internal/enginecall"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Batch lines (internal/batch) ride idle capacity. Each dispatcher runs a
// pump per application: it takes one line at a time from the
// application's batch consumer and moves it into the application's request
// subject, only when the application has no interactive request waiting
// (none held here, none pending in its consumer) and a free engine slot
// here, or, for an application without roots, when nothing else waits: that
// one line wakes it by the same path as a request. It moves the next line
// once the last one left the request consumer's backlog, so interactive
// requests arriving meanwhile are never queued behind more than one line.
// A moved line is served like a non-streamed request, but its answer is
// written as the line's result (written once, whichever attempt finishes
// first) instead of being sent to a gateway.

// batchMetrics count batch lines by what happened to them.
type batchMetrics struct {
	moved *prometheus.CounterVec // app
	lines *prometheus.CounterVec // app, result
}

func newBatchMetrics(reg prometheus.Registerer) *batchMetrics {
	m := &batchMetrics{
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "orchestra_dispatcher", Name: "batch_lines_moved_total",
			Help: "Batch lines moved from the batch stream into the request stream (spare capacity)."}, []string{"app"}),
		lines: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "orchestra_dispatcher", Name: "batch_lines_total",
			Help: "Batch lines served, by result: completed (2xx), failed, duplicate (already had a result), retried."}, []string{"app", "result"}),
	}
	reg.MustRegister(m.moved, m.lines)
	return m
}

// isBatchLine reports whether a request message is a moved batch line.
func isBatchLine(msg jetstream.Msg) bool { return msg.Headers().Get(natsqueue.HeaderBatch) != "" }

// pumpBatches moves an application's batch lines until ctx ends.
func (d *Dispatcher) pumpBatches(ctx context.Context, a *app) {
	for ctx.Err() == nil {
		err := d.pumpOnce(ctx, a)
		if ctx.Err() != nil {
			return
		}
		d.log.Debug("moving batch lines; trying again", "app", a.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (d *Dispatcher) pumpOnce(ctx context.Context, a *app) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := batch.ProvisionLines(pctx, d.js, d.cfg.Orchestra, d.cfg.Stream.Replicas, d.cfg.AckWait.Duration, []string{a.Name})
	var cons jetstream.Consumer
	if err == nil {
		cons, err = d.js.Consumer(pctx, d.names.BatchStream(), d.names.BatchConsumer(a.Name))
	}
	cancel()
	if err != nil {
		return err
	}
	for {
		if err := d.waitSpare(ctx, a, nil); err != nil {
			return err
		}
		// Bounded by ctx too: a stopping dispatcher must not wait for it.
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		fetched, err := cons.Fetch(1, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return err
		}
		for m := range fetched.Messages() {
			if err := d.moveLine(ctx, a, m); err != nil {
				_ = m.Nak()
				cancel()
				return err
			}
		}
		cancel()
		if err := fetched.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
	}
}

// spare reports whether a batch line may be moved now.
func (d *Dispatcher) spare(ctx context.Context, a *app) bool {
	if a.held.len() > 0 {
		return false
	}
	roots := len(a.pool.urls())
	if roots > 0 && int(a.inflight.Load()) >= roots*a.MaxConcurrency {
		return false
	}
	c := a.getConsumer()
	if c == nil {
		return false
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	info, err := c.Info(ictx)
	cancel()
	if err != nil || info.NumPending > 0 {
		return false
	}
	// Without roots, one line at a time wakes the application; with
	// requests delivered and none served here, another dispatcher may be
	// using the capacity.
	return roots > 0 || info.NumAckPending == 0
}

// waitSpare waits until a batch line may be moved, keeping m (a fetched
// line, if any) alive meanwhile.
func (d *Dispatcher) waitSpare(ctx context.Context, a *app, m jetstream.Msg) error {
	keepAlive := time.Now()
	for !d.spare(ctx, a) {
		if m != nil && time.Since(keepAlive) > d.cfg.AckWait.Duration/3 {
			_ = m.InProgress()
			keepAlive = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// moveLine publishes a batch line into the request stream, acknowledges it
// on the batch stream, and waits until it was delivered.
func (d *Dispatcher) moveLine(ctx context.Context, a *app, m jetstream.Msg) error {
	if err := d.waitSpare(ctx, a, m); err != nil {
		return err
	}
	src := m.Headers()
	id := "batch." + src.Get(natsqueue.HeaderBatch) + "." + src.Get(natsqueue.HeaderLine)
	h := nats.Header{}
	h.Set(natsqueue.HeaderJobID, id)
	h.Set(natsqueue.HeaderApp, a.Name)
	h.Set(natsqueue.HeaderPath, src.Get(natsqueue.HeaderPath))
	h.Set(natsqueue.HeaderStream, "0")
	for _, k := range []string{natsqueue.HeaderBatch, natsqueue.HeaderLine, natsqueue.HeaderCustomID} {
		h.Set(k, src.Get(k))
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err := d.js.PublishMsg(pctx, &nats.Msg{Subject: d.names.Request(a.Name), Header: h, Data: m.Data()},
		jetstream.WithMsgID(id), jetstream.WithExpectStream(d.names.Stream()))
	if err != nil {
		return fmt.Errorf("moving batch line %s: %w", id, err)
	}
	// A lost ack moves the line again: de-duplicated by its id, and its
	// result is written once.
	_ = m.DoubleAck(pctx)
	d.bm.moved.WithLabelValues(a.Name).Inc()
	// Wait until it left the backlog (delivered, or waiting for a wake).
	for ctx.Err() == nil {
		c := a.getConsumer()
		info, err := c.Info(pctx)
		if err == nil && info.NumPending == 0 {
			return nil
		}
		if pctx.Err() != nil {
			return nil //nolint:nilerr // a slow delivery: look again from the top
		}
		time.Sleep(10 * time.Millisecond)
	}
	return ctx.Err()
}

// maxLineAnswer bounds an engine's answer to a batch line.
const maxLineAnswer = 32 << 20

// handleBatchLine serves a moved batch line on root rt and writes its
// result.
func (d *Dispatcher) handleBatchLine(work context.Context, a *app, msg jetstream.Msg, rt lease) {
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	h := msg.Headers()
	batchID, path, custom := h.Get(natsqueue.HeaderBatch), h.Get(natsqueue.HeaderPath), h.Get(natsqueue.HeaderCustomID)
	line, err := strconv.Atoi(h.Get(natsqueue.HeaderLine))
	md, merr := msg.Metadata()
	if err != nil || merr != nil {
		a.pool.release(rt, true, false)
		_ = msg.Term()
		return
	}
	attempt := int(md.NumDelivered)
	retry := func() {
		d.bm.lines.WithLabelValues(a.Name, "retried").Inc()
		_ = msg.NakWithDelay(d.cfg.RetryDelay.Duration * time.Duration(attempt))
	}
	kv, err := d.results.Bucket(work)
	if err != nil {
		a.pool.release(rt, true, false)
		retry()
		return
	}
	if has, err := batch.HasResult(work, kv, batchID, line); err != nil || has {
		a.pool.release(rt, true, false)
		if err != nil {
			retry()
			return
		}
		d.bm.lines.WithLabelValues(a.Name, "duplicate").Inc()
		_ = msg.DoubleAck(work)
		return
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(d.cfg.AckWait.Duration / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	out := batch.OutputLine{ID: batch.LineID(batchID, line), CustomID: custom}
	status, body, err := d.callEngine(work, rt, path, msg.Data(), out.ID)
	failed := err != nil || status >= 500
	a.pool.release(rt, !failed, true)
	if failed && attempt < d.cfg.MaxDeliver && work.Err() == nil {
		retry()
		return
	}
	if work.Err() != nil {
		_ = msg.Nak() // shutting down: another dispatcher serves it
		return
	}
	if err != nil {
		out.Error = &batch.LineErrorShort{Code: batch.CodeFailed, Message: "The model server did not answer: " + err.Error()}
	} else {
		if !json.Valid(body) {
			body, _ = json.Marshal(string(body))
		}
		out.Response = &batch.LineResponse{StatusCode: status, RequestID: out.ID, Body: body}
	}
	if _, err := batch.WriteResult(work, kv, batchID, line, out); err != nil {
		retry()
		return
	}
	result := "completed"
	if !out.Succeeded() {
		result = "failed"
	}
	d.bm.lines.WithLabelValues(a.Name, result).Inc()
	_ = msg.DoubleAck(work)
}

// callEngine posts body to the engine's path on rt and reads the answer.
func (d *Dispatcher) callEngine(ctx context.Context, rt lease, path string, body []byte, requestID string) (int, []byte, error) {
	u, err := rt.target(path)
	if err != nil {
		return 0, nil, err
	}
	timeout := d.cfg.RequestTimeout.Duration
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := enginecall.NewRequest(ctx, u, body)
	req.Header.Set("X-Request-Id", requestID)
	res, err := d.engines.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxLineAnswer))
	if err != nil {
		return 0, nil, err
	}
	return res.StatusCode, b, nil
}
