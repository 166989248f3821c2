package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/enginecall"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// chunkSize bounds one response message.
const chunkSize = 256 << 10

// acceptTimeout bounds the wait for a gateway to confirm it listens.
const acceptTimeout = 5 * time.Second

// responder publishes one attempt's response messages, in order.
type responder struct {
	nc      *nats.Conn
	subject string
	attempt string

	// attemptVal is attempt as a header value, shared by every message
	// of the attempt (nats.go only reads header values).
	attemptVal []string

	// first, when set, runs when the first data message goes out.
	first func()

	mu  sync.Mutex
	seq int
	// retained are the data messages from Orch-Seq base on, kept until
	// the answer is confirmed (see finish), at most retainBytes.
	retained      []*nats.Msg
	retainedBytes int
	base          int
}

func newResponder(nc *nats.Conn, subject string, attempt int) *responder {
	a := strconv.Itoa(attempt)
	return &responder{nc: nc, subject: subject, attempt: a, attemptVal: []string{a}}
}

// Header values shared by all messages (nats.go only reads them).
var (
	kindDataVal  = []string{natsqueue.KindData}
	kindAccVal   = []string{natsqueue.KindAccepted}
	endVal       = []string{"1"}
	seqZeroVal   = []string{"0"}
	statusOKVal  = []string{"200"}
	jsonTypeVal  = []string{"application/json"}
	sseTypeVal   = []string{"text/event-stream; charset=utf-8"}
	kindHBVal    = []string{natsqueue.KindHeartbeat}
	kindDeadVal  = []string{natsqueue.KindDeadLettered}
	sharedValues = map[string][]string{
		natsqueue.KindData: kindDataVal, natsqueue.KindAccepted: kindAccVal,
		natsqueue.KindHeartbeat: kindHBVal, natsqueue.KindDeadLettered: kindDeadVal,
	}
)

func (r *responder) send(kind string, build func(h nats.Header)) error {
	if r.subject == "" {
		return nil
	}
	kv, ok := sharedValues[kind]
	if !ok {
		kv = []string{kind}
	}
	m := &nats.Msg{Subject: r.subject, Header: nats.Header{
		natsqueue.HeaderKind:    kv,
		natsqueue.HeaderAttempt: r.attemptVal,
	}}
	if build != nil {
		build(m.Header)
	}
	return r.nc.PublishMsg(m)
}

// accept announces the attempt to the gateway and reports whether it still
// waits: nil when it does (or cannot tell in time), errNoListener when no
// gateway listens on the reply subject, errCancelled when it gave up.
func (r *responder) accept(timeout time.Duration) error {
	if r.subject == "" {
		return errNoListener
	}
	m := &nats.Msg{Subject: r.subject, Header: nats.Header{
		natsqueue.HeaderKind:    kindAccVal,
		natsqueue.HeaderAttempt: r.attemptVal,
	}}
	res, err := r.nc.RequestMsg(m, timeout)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return errNoListener
	case err != nil:
		// Slow or disconnected: not a reason to stop; the answer will tell.
		return nil //nolint:nilerr // see above
	case string(res.Data) == natsqueue.AcceptGone:
		return errCancelled
	}
	return nil
}

// data publishes the next data message; status and contentType go on the
// first one only.
func (r *responder) data(p []byte, status int, contentType string, end bool) error {
	if r.subject == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nc.PublishMsg(r.dataMsg(p, status, contentType, end))
}

// finish publishes the last data message as a request, which also does
// the work of accept: nil when the gateway answered that it has the whole
// answer (or could not answer within finishWindow: published, as far as
// anyone can tell), errNoListener when no gateway listens for finishWindow,
// errCancelled when it gave up. When the gateway misses messages (lost while
// NATS restarted) it names the first one: they are published again from
// the retained copies, and the gateway asked again.
func (r *responder) finish(p []byte, status int, contentType string, timeout time.Duration) error {
	if r.subject == "" {
		return errNoListener
	}
	r.mu.Lock()
	m := r.dataMsg(p, status, contentType, true)
	r.mu.Unlock()
	deadline := time.Now().Add(finishWindow)
	asked := false // an earlier ask may have reached the gateway
	for {
		res, err := r.nc.RequestMsg(m, timeout)
		switch {
		case err == nil && string(res.Data) == natsqueue.AcceptGone && asked:
			// The answer to an earlier ask was lost: the gateway most
			// likely took the whole answer and closed the reply since.
			return nil
		case err == nil && string(res.Data) == natsqueue.AcceptGone:
			return errCancelled
		case err == nil && strings.HasPrefix(string(res.Data), natsqueue.AcceptResend):
			from, perr := strconv.Atoi(strings.TrimPrefix(string(res.Data), natsqueue.AcceptResend))
			if perr != nil || !r.resend(from) {
				return &attemptError{reason: "response_lost", err: fmt.Errorf("the gateway misses messages from %q on, which are no longer kept", res.Data)}
			}
			continue
		case err == nil:
			return nil
		case time.Now().After(deadline):
			if errors.Is(err, nats.ErrNoResponders) {
				return errNoListener
			}
			return nil // published, but the answer is slow: as accept does
		case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrConnectionReconnecting):
			// The gateway has not resubscribed after a NATS restart yet, or
			// the request or its answer was lost: ask again.
			asked = asked || errors.Is(err, nats.ErrTimeout)
			time.Sleep(100 * time.Millisecond)
		default:
			return &attemptError{reason: "publish_failed", err: err}
		}
	}
}

// finishWindow bounds how long a dispatcher keeps asking a gateway whether
// it has the whole answer: long enough for both to reconnect after a NATS
// restart.
const finishWindow = 10 * time.Second

// retainBytes bounds the data messages an attempt keeps for resending; the
// oldest go first beyond it.
const retainBytes = 8 << 20

// resend publishes the retained data messages from Orch-Seq from on again;
// false when some of them are no longer kept.
func (r *responder) resend(from int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from < r.base || from > r.base+len(r.retained) {
		return false
	}
	for _, m := range r.retained[from-r.base:] {
		if err := r.nc.PublishMsg(m); err != nil {
			return false
		}
	}
	return true
}

// dataMsg builds the next data message; r.mu must be held.
func (r *responder) dataMsg(p []byte, status int, contentType string, end bool) *nats.Msg {
	h := make(nats.Header, 6)
	h[natsqueue.HeaderKind] = kindDataVal
	h[natsqueue.HeaderAttempt] = r.attemptVal
	if r.seq == 0 {
		h[natsqueue.HeaderSeq] = seqZeroVal
		if status == http.StatusOK {
			h[natsqueue.HeaderStatus] = statusOKVal
		} else {
			h[natsqueue.HeaderStatus] = []string{strconv.Itoa(status)}
		}
		switch contentType {
		case "":
		case jsonTypeVal[0]:
			h[natsqueue.HeaderContentType] = jsonTypeVal
		case sseTypeVal[0]:
			h[natsqueue.HeaderContentType] = sseTypeVal
		default:
			h[natsqueue.HeaderContentType] = []string{contentType}
		}
		if r.first != nil {
			r.first()
		}
	} else {
		h[natsqueue.HeaderSeq] = []string{strconv.Itoa(r.seq)}
	}
	if end {
		h[natsqueue.HeaderEnd] = endVal
	}
	r.seq++
	m := &nats.Msg{Subject: r.subject, Header: h, Data: p}
	r.retain(m)
	return m
}

// retain keeps m for resending, dropping the oldest beyond retainBytes;
// r.mu must be held. The data is copied: callers reuse their buffers.
func (r *responder) retain(m *nats.Msg) {
	m.Data = bytes.Clone(m.Data)
	r.retained = append(r.retained, m)
	r.retainedBytes += len(m.Data)
	for r.retainedBytes > retainBytes && len(r.retained) > 1 {
		r.retainedBytes -= len(r.retained[0].Data)
		r.retained[0] = nil
		r.retained = r.retained[1:]
		r.base++
	}
}

// attemptError is a failed attempt: retried until maxDeliver, and counted
// against the root when it was the engine's fault.
type attemptError struct {
	reason    string
	rootFault bool
	err       error
}

func (e *attemptError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// handle runs one delivery on root rt and settles the message: Ack when the
// answer was published, Nak for a retry, Term when the client cancelled,
// dead-letter after MaxDeliver attempts.
func (d *Dispatcher) handle(work context.Context, a *app, msg jetstream.Msg, rt lease) {
	md, err := msg.Metadata()
	if err != nil {
		a.pool.release(rt, true, false)
		d.log.Error("request without JetStream metadata", "app", a.Name, "err", err)
		_ = msg.Term()
		return
	}
	seq, attempt := md.Sequence.Stream, int(md.NumDelivered)
	h := msg.Headers()
	resp := newResponder(d.nc, h.Get(natsqueue.HeaderReply), attempt)
	// Built only when something is logged: most requests log nothing.
	log := func() *slog.Logger {
		return d.log.With("app", a.Name, "job", h.Get(natsqueue.HeaderJobID), "seq", seq, "attempt", attempt)
	}

	if attempt == 1 {
		a.m.queueWait.Observe(time.Since(md.Timestamp).Seconds())
		d.observeDelivery(a.Name, md.Timestamp)
		resp.first = d.firstTokenHook(a, md.Timestamp)
	} else {
		d.m.redelivered.WithLabelValues(a.Name).Inc()
	}
	if attempt > d.cfg.MaxDeliver {
		// An earlier attempt died with its dispatcher.
		a.pool.release(rt, true, false)
		d.deadLetter(work, a, msg, resp, "maximum deliveries reached", log())
		return
	}

	ctx, cancel := context.WithCancelCause(work)
	defer cancel(nil)
	if d.cfg.RequestTimeout.Duration > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, d.cfg.RequestTimeout.Duration)
		defer stop()
	}
	if !d.track(seq, cancel, resp) {
		a.pool.release(rt, true, false)
		d.m.cancelled.WithLabelValues(a.Name).Inc()
		_ = msg.TermWithReason("cancelled by client")
		return
	}
	defer d.untrack(seq)

	a.m.inflight.Inc()
	a.inflight.Add(1)
	defer func() {
		a.m.inflight.Dec()
		a.inflight.Add(-1)
	}()
	a.m.dispatched.Inc()
	// Ask whether the gateway listens; the job is acknowledged only once it
	// said yes. A stream asks while the engine already works; a non-streamed
	// answer asks with its final data message (responder.finalData).
	var accepted chan error
	if h.Get(natsqueue.HeaderStream) == "1" {
		accepted = make(chan error, 1)
		go func() {
			err := resp.accept(acceptTimeout)
			if err != nil {
				cancel(err)
			}
			accepted <- err
		}()
	}

	// Keep the gateway and JetStream informed while the engine works.
	stopBeats := d.keepAlive(msg, resp)
	began := time.Now()
	status, err := d.call(ctx, a, rt, h, msg.Data(), resp)
	stopBeats()
	a.m.engineTime.Observe(time.Since(began).Seconds())
	if accepted != nil {
		if aerr := <-accepted; aerr != nil && err == nil {
			err = aerr
		}
	}

	var ae *attemptError
	switch {
	case errors.Is(err, errNoListener) || errors.Is(context.Cause(ctx), errNoListener):
		a.pool.release(rt, true, false)
		d.m.failed.WithLabelValues(a.Name, "no_listener").Inc()
		if attempt >= d.cfg.MaxDeliver {
			d.deadLetter(work, a, msg, resp, "no gateway waiting for the answer", log())
			return
		}
		_ = msg.NakWithDelay(max(time.Second, d.cfg.RetryDelay.Duration*time.Duration(attempt)))
	case errors.Is(err, errCancelled):
		a.pool.release(rt, true, false)
		d.m.cancelled.WithLabelValues(a.Name).Inc()
		_ = msg.TermWithReason("cancelled by client")
	case err == nil:
		a.pool.release(rt, true, true)
		if err := msg.Ack(); err != nil {
			log().Warn("acknowledging a completed request", "err", err)
		}
		a.completed(status).Inc()
	case errors.Is(context.Cause(ctx), errCancelled):
		a.pool.release(rt, true, false)
		d.m.cancelled.WithLabelValues(a.Name).Inc()
		_ = msg.TermWithReason("cancelled by client")
	case errors.Is(context.Cause(ctx), errShutdown):
		a.pool.release(rt, true, false)
		_ = msg.Nak()
	case errors.As(err, &ae):
		a.pool.release(rt, !ae.rootFault, ae.rootFault)
		d.m.failed.WithLabelValues(a.Name, ae.reason).Inc()
		if attempt >= d.cfg.MaxDeliver {
			log().Warn("request failed on its last attempt", "err", err)
			d.deadLetter(work, a, msg, resp, err.Error(), log())
			return
		}
		delay := d.cfg.RetryDelay.Duration * time.Duration(min(attempt, 10))
		log().Info("request failed; retrying", "err", err, "delay", delay)
		_ = msg.NakWithDelay(delay)
	default:
		a.pool.release(rt, true, false)
		d.m.failed.WithLabelValues(a.Name, "internal").Inc()
		log().Error("request failed", "err", err)
		_ = msg.NakWithDelay(d.cfg.RetryDelay.Duration)
	}
}

// keepAlive sends heartbeats to the gateway and progress to JetStream
// until the returned stop is called. It runs on timers, not a goroutine of
// its own, so short requests cost nothing.
func (d *Dispatcher) keepAlive(msg jetstream.Msg, resp *responder) (stop func()) {
	beat := d.cfg.HeartbeatInterval.Duration
	progress := d.cfg.AckWait.Duration / 3
	interval := min(beat, progress)
	var (
		mu                     sync.Mutex
		stopped                bool
		t                      *time.Timer
		lastBeat, lastProgress = time.Now(), time.Now()
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(interval, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		now := time.Now()
		if now.Sub(lastBeat) >= beat-beat/10 {
			_ = resp.send(natsqueue.KindHeartbeat, nil)
			lastBeat = now
		}
		if now.Sub(lastProgress) >= progress-progress/10 {
			_ = msg.InProgress()
			lastProgress = now
		}
		t.Reset(interval)
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// bodyPool holds buffers for non-streamed engine answers: an answer is
// published (NATS copies it into the connection's buffer) before its
// buffer is put back.
var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// engineRequest builds the POST of body to path on root rt.
func engineRequest(ctx context.Context, rt *root, path string, body []byte) (*http.Request, error) {
	u, err := rt.target(path)
	if err != nil {
		return nil, err
	}
	return enginecall.NewRequest(ctx, u, body), nil
}

// call sends the request to the engine and relays the answer. It returns the
// engine's status, or an *attemptError for a retryable failure.
func (d *Dispatcher) call(ctx context.Context, a *app, rt lease, h nats.Header, body []byte, resp *responder) (int, error) {
	req, err := engineRequest(ctx, rt.root, h.Get(natsqueue.HeaderPath), body)
	if err != nil {
		return 0, fmt.Errorf("building engine request: %w", err)
	}
	res, err := d.engines.RoundTrip(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		return 0, &attemptError{reason: "engine_unreachable", rootFault: true, err: err}
	}
	defer func() { _ = res.Body.Close() }() // read-only body
	if enginecall.Overloaded(res.StatusCode) {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		return 0, &attemptError{reason: "engine_status_" + strconv.Itoa(res.StatusCode), rootFault: true,
			err: fmt.Errorf("engine %s answered %s", rt.url, res.Status)}
	}
	ct := res.Header.Get("Content-Type")
	if h.Get(natsqueue.HeaderStream) != "1" {
		buf := bodyPool.Get().(*bytes.Buffer)
		buf.Reset()
		defer func() {
			if buf.Cap() <= 1<<20 { // do not keep rare huge answers alive
				bodyPool.Put(buf)
			}
		}()
		if n := res.ContentLength; n > 0 && n <= d.cfg.MaxResponseBytes {
			buf.Grow(int(n) + bytes.MinRead)
		}
		_, err := buf.ReadFrom(io.LimitReader(res.Body, d.cfg.MaxResponseBytes+1))
		if err != nil {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
			return 0, &attemptError{reason: "engine_broke_off", rootFault: true, err: err}
		}
		full := buf.Bytes()
		status := res.StatusCode
		if int64(len(full)) > d.cfg.MaxResponseBytes {
			// Retrying would not shrink it: answer with a clear error.
			status, ct = http.StatusBadGateway, "application/json"
			full = fmt.Appendf(nil, `{"error":{"message":"the engine's answer exceeds %d bytes","type":"BadGateway","param":null,"code":502}}`, d.cfg.MaxResponseBytes)
		}
		for len(full) > chunkSize {
			if err := resp.data(full[:chunkSize], status, ct, false); err != nil {
				return 0, &attemptError{reason: "publish_failed", err: err}
			}
			full = full[chunkSize:]
		}
		if err := resp.finish(full, status, ct, acceptTimeout); err != nil {
			return 0, err
		}
		return status, nil
	}
	// Publishing copies the bytes into the connection's buffer, so one
	// read buffer serves the whole stream.
	buf := make([]byte, 32<<10)
	for {
		n, rerr := res.Body.Read(buf)
		if n > 0 {
			if err := resp.data(buf[:n], res.StatusCode, ct, false); err != nil {
				return 0, &attemptError{reason: "publish_failed", err: err}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
			return 0, &attemptError{reason: "engine_broke_off", rootFault: true, err: rerr}
		}
	}
	if err := resp.finish(nil, res.StatusCode, ct, acceptTimeout); err != nil {
		return 0, err
	}
	return res.StatusCode, nil
}

// deadLetter moves a request to the dead-letter stream and tells the
// gateway. If the move fails the request is retried later, never dropped.
func (d *Dispatcher) deadLetter(ctx context.Context, a *app, msg jetstream.Msg, resp *responder, reason string, log *slog.Logger) {
	dl := nats.NewMsg(d.names.DeadLetter(a.Name))
	for k, v := range msg.Headers() {
		if strings.HasPrefix(k, "Orch-") {
			dl.Header[k] = v
		}
	}
	if id := msg.Headers().Get(natsqueue.HeaderJobID); id != "" {
		dl.Header.Set(jetstream.MsgIDHeader, id)
	}
	dl.Header.Set(natsqueue.HeaderReason, reason)
	dl.Header.Set(natsqueue.HeaderAttempt, resp.attempt)
	dl.Data = msg.Data()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := d.js.PublishMsg(pctx, dl); err != nil {
		log.Warn("moving request to the dead-letter stream; will retry", "err", err)
		_ = msg.NakWithDelay(5 * time.Second)
		return
	}
	d.m.deadLettered.WithLabelValues(a.Name).Inc()
	log.Warn("request dead-lettered", "reason", reason)
	_ = resp.send(natsqueue.KindDeadLettered, func(h nats.Header) { h.Set(natsqueue.HeaderReason, reason) })
	if err := msg.TermWithReason("dead-lettered"); err != nil {
		log.Warn("terminating a dead-lettered request", "err", err)
	}
}
