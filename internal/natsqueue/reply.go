package natsqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/model-orchestra/operator/internal/queue"
)

// reply assembles the answer to one job from response messages. Messages
// are pushed by the client's subscription goroutine and consumed by Next.
type reply struct {
	c     *Client
	job   queue.Job
	token string
	seq   atomic.Uint64 // stream sequence of the job, for cancelling

	mu      sync.Mutex
	inbox   []*nats.Msg
	wake    chan struct{}
	failure error // set by the client (closed), read by Next
	// What push has seen of the newest attempt's data messages, to answer
	// a final data message: the next Orch-Seq missing, and those after it.
	rxAttempt int
	rxNext    int
	rxAhead   map[int]bool

	// Owned by Next.
	submitted    time.Time
	lastProgress time.Time
	attempt      int
	nextSeq      int
	delivered    bool // a chunk went to the caller
	finished     bool // the final chunk went to the caller
	err          error
	start        *queue.Chunk      // stream: status and headers held until data
	buf          []byte            // non-stream: body of the current attempt
	ahead        map[int]*nats.Msg // data messages past a gap, by Orch-Seq
	lastResend   time.Time
	timer        *time.Timer // paces stall checks while waiting
	closed       atomic.Bool
	settled      atomic.Bool // finished, or dead-lettered: nothing to cancel
	cancelled    atomic.Bool
}

func newReply(c *Client, job queue.Job, token string) *reply {
	now := time.Now()
	return &reply{c: c, job: job, token: token, wake: make(chan struct{}, 1), submitted: now, lastProgress: now}
}

func (r *reply) push(m *nats.Msg) {
	r.mu.Lock()
	r.inbox = append(r.inbox, m)
	r.received(m)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// received records a data message of the newest attempt; r.mu must be held.
func (r *reply) received(m *nats.Msg) {
	if m.Header.Get(HeaderKind) != KindData {
		return
	}
	attempt, err1 := strconv.Atoi(m.Header.Get(HeaderAttempt))
	seq, err2 := strconv.Atoi(m.Header.Get(HeaderSeq))
	if err1 != nil || err2 != nil || attempt < r.rxAttempt {
		return
	}
	if attempt > r.rxAttempt {
		r.rxAttempt, r.rxNext, r.rxAhead = attempt, 0, nil
	}
	switch {
	case seq == r.rxNext:
		r.rxNext++
		for r.rxAhead[r.rxNext] {
			delete(r.rxAhead, r.rxNext)
			r.rxNext++
		}
	case seq > r.rxNext:
		if r.rxAhead == nil {
			r.rxAhead = map[int]bool{}
		}
		r.rxAhead[seq] = true
	}
}

// missing reports, for a data message just pushed, the first Orch-Seq of
// its attempt that has not arrived before it.
func (r *reply) missing(m *nats.Msg) (int, bool) {
	if m.Header.Get(HeaderKind) != KindData {
		return 0, false
	}
	attempt, err1 := strconv.Atoi(m.Header.Get(HeaderAttempt))
	seq, err2 := strconv.Atoi(m.Header.Get(HeaderSeq))
	r.mu.Lock()
	defer r.mu.Unlock()
	if err1 != nil || err2 != nil || attempt != r.rxAttempt || r.rxNext > seq {
		return 0, false
	}
	return r.rxNext, true
}

func (r *reply) fail(err error) {
	r.mu.Lock()
	if r.failure == nil {
		r.failure = err
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reply) take() ([]*nats.Msg, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msgs := r.inbox
	r.inbox = nil
	return msgs, r.failure
}

// Next implements queue.Reply.
func (r *reply) Next(ctx context.Context) (queue.Chunk, error) {
	return r.next(ctx, true)
}

// errNotReady ends a Poll that would have to wait.
var errNotReady = errors.New("no chunk ready")

// Poll implements queue.Poller.
func (r *reply) Poll() (queue.Chunk, bool, error) {
	c, err := r.next(context.Background(), false)
	switch {
	case errors.Is(err, errNotReady):
		return queue.Chunk{}, false, nil
	case err != nil:
		return queue.Chunk{}, false, err
	}
	return c, true, nil
}

// next returns the next chunk; without wait it returns errNotReady
// instead of waiting for one.
func (r *reply) next(ctx context.Context, wait bool) (queue.Chunk, error) {
	var pending []*nats.Msg
	for {
		if r.err != nil {
			return queue.Chunk{}, r.err
		}
		if r.finished {
			return queue.Chunk{}, io.EOF
		}
		for {
			if m, ok := r.ahead[r.nextSeq]; ok {
				// The gap before it was filled: its turn now.
				delete(r.ahead, r.nextSeq)
				pending = append([]*nats.Msg{m}, pending...)
			}
			if len(pending) == 0 {
				break
			}
			m := pending[0]
			pending = pending[1:]
			chunk, ok, err := r.handle(m)
			if err != nil {
				r.err = err
				r.requeue(pending)
				return queue.Chunk{}, err
			}
			if ok {
				r.requeue(pending)
				return chunk, nil
			}
		}
		if r.finished {
			// The end marker came without data (a stream's separate end
			// message): done now, not after the next stall check.
			return queue.Chunk{}, io.EOF
		}
		msgs, failure := r.take()
		if len(msgs) > 0 {
			pending = msgs
			continue
		}
		if failure != nil {
			r.err = failure
			continue
		}
		if !wait {
			return queue.Chunk{}, errNotReady
		}
		if err := r.checkStall(); err != nil {
			r.err = err
			r.cancel()
			continue
		}
		wait := r.c.cfg.StallTimeout / 4
		if len(r.ahead) > 0 {
			// Waiting for missed messages: ask again soon.
			r.askResend()
			wait = min(wait, resendInterval)
		}
		if r.timer == nil {
			r.timer = time.NewTimer(wait)
		} else {
			r.timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			r.timer.Stop()
			return queue.Chunk{}, ctx.Err()
		case <-r.wake:
		case <-r.timer.C:
		}
		r.timer.Stop()
	}
}

// requeue puts back messages taken but not yet handled, ahead of newer ones.
func (r *reply) requeue(msgs []*nats.Msg) {
	if len(msgs) == 0 {
		return
	}
	r.mu.Lock()
	r.inbox = append(msgs, r.inbox...)
	r.mu.Unlock()
}

// handle applies one response message; ok reports a chunk for the caller.
func (r *reply) handle(m *nats.Msg) (queue.Chunk, bool, error) {
	attempt, err := strconv.Atoi(m.Header.Get(HeaderAttempt))
	if err != nil || attempt < r.attempt {
		// Malformed, or from a superseded attempt: dropped, not the caller's error.
		return queue.Chunk{}, false, nil //nolint:nilerr // see above
	}
	r.lastProgress = time.Now()
	if attempt > r.attempt {
		if r.delivered {
			// Part of this answer is already with the client; a new
			// attempt would repeat or contradict it.
			r.cancel()
			return queue.Chunk{}, false, queue.ErrRetriedAfterPartial
		}
		r.attempt, r.nextSeq, r.start, r.buf, r.ahead = attempt, 0, nil, r.buf[:0], nil
	}
	switch m.Header.Get(HeaderKind) {
	case KindDeadLettered:
		r.settled.Store(true)
		return queue.Chunk{}, false, queue.ErrDeadLettered
	case KindData:
	default:
		return queue.Chunk{}, false, nil // accepted, heartbeat: progress only
	}
	seq, err := strconv.Atoi(m.Header.Get(HeaderSeq))
	switch {
	case err == nil && seq < r.nextSeq:
		return queue.Chunk{}, false, nil // a resent duplicate
	case err == nil && seq > r.nextSeq:
		// Messages before it were lost (NATS restarted): keep it, and ask
		// the dispatcher for the missing ones.
		if r.ahead == nil {
			r.ahead = map[int]*nats.Msg{}
		}
		r.ahead[seq] = m
		r.askResend()
		return queue.Chunk{}, false, nil
	}
	if err != nil {
		r.cancel()
		if r.delivered {
			return queue.Chunk{}, false, fmt.Errorf("%w (expected chunk %d of attempt %d, got %q)", queue.ErrRetriedAfterPartial, r.nextSeq, attempt, m.Header.Get(HeaderSeq))
		}
		return queue.Chunk{}, false, fmt.Errorf("%w (expected chunk %d of attempt %d, got %q)", ErrResponseLost, r.nextSeq, attempt, m.Header.Get(HeaderSeq))
	}
	r.nextSeq++
	end := m.Header.Get(HeaderEnd) == "1"
	if seq == 0 {
		status, err := strconv.Atoi(m.Header.Get(HeaderStatus))
		if err != nil {
			r.cancel()
			return queue.Chunk{}, false, fmt.Errorf("%w: first chunk without a status", ErrResponseLost)
		}
		h := http.Header{}
		if ct := m.Header.Get(HeaderContentType); ct != "" {
			h.Set("Content-Type", ct)
		}
		r.start = &queue.Chunk{Status: status, Header: h}
	}
	if !r.job.Stream {
		// Hold the whole body: a redelivery can then replace it unseen.
		chunk := *r.start
		switch {
		case seq == 0 && end:
			chunk.Data = m.Data // one message (the usual case): no copy
		case !end:
			r.buf = append(r.buf, m.Data...)
			return queue.Chunk{}, false, nil
		default:
			r.buf = append(r.buf, m.Data...)
			chunk.Data = r.buf
		}
		r.delivered, r.finished = true, true
		r.settled.Store(true)
		return chunk, true, nil
	}
	if end {
		r.finished = true
		r.settled.Store(true)
	}
	var chunk queue.Chunk
	if r.start != nil {
		if len(m.Data) == 0 && !end {
			return queue.Chunk{}, false, nil // nothing to show yet: keep it retryable
		}
		chunk, r.start = *r.start, nil
	}
	chunk.Data = m.Data
	if len(chunk.Data) == 0 && chunk.Status == 0 {
		return queue.Chunk{}, false, nil // an empty final marker
	}
	r.delivered = true
	return chunk, true, nil
}

// resendInterval paces requests for missed messages.
const resendInterval = 250 * time.Millisecond

// askResend asks for the data messages from r.nextSeq on, at most once per
// resendInterval.
func (r *reply) askResend() {
	if time.Since(r.lastResend) < resendInterval {
		return
	}
	r.lastResend = time.Now()
	r.c.requestResend(r.job.App, r.seq.Load(), r.attempt, r.nextSeq)
}

// checkStall fails a reply that stopped making progress.
func (r *reply) checkStall() error {
	now := time.Now()
	last := r.lastProgress
	if rc := r.c.lastReconnect(); rc.After(last) {
		last = rc
	}
	stall := r.c.cfg.StallTimeout
	if r.attempt == 0 && r.c.cfg.MaxQueueWait > 0 && now.Sub(r.submitted) > r.c.cfg.MaxQueueWait {
		return fmt.Errorf("%w: job waited in the queue for more than %v", queue.ErrUnavailable, r.c.cfg.MaxQueueWait)
	}
	silent := now.Sub(last)
	if silent <= stall {
		return nil
	}
	if r.job.Stream && r.delivered {
		return fmt.Errorf("%w: no progress for %v", queue.ErrRetriedAfterPartial, silent.Round(time.Millisecond))
	}
	// Nothing reached the caller yet, so a (re)delivery can still answer
	// transparently, as long as some dispatcher serves the application.
	if now.Sub(r.c.lastSignOfLife(r.job.App)) > stall {
		return fmt.Errorf("%w: no dispatcher announced application %s for %v", queue.ErrNotServed, r.job.App, stall)
	}
	if r.attempt > 0 && silent > stall+r.c.cfg.RedeliveryWait {
		return fmt.Errorf("%w: attempt %d went silent and the job was not redelivered within %v", queue.ErrUnavailable, r.attempt, stall+r.c.cfg.RedeliveryWait)
	}
	return nil
}

// cancel stops the job everywhere, once; a settled job needs no cancel.
func (r *reply) cancel() {
	if r.settled.Load() || r.cancelled.Swap(true) {
		return
	}
	r.c.cancel(r.job.App, r.seq.Load())
}

// Close implements queue.Reply. An unfinished job is cancelled.
func (r *reply) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.c.forget(r.token)
	r.cancel()
	return nil
}
