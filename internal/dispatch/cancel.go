package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// Cancellation of requests in flight: a client's cancel, or a gateway's
// resend, reaches the dispatcher that holds the request.

// onCancel stops the job whose stream sequence the gateway sent.
func (d *Dispatcher) onCancel(m *nats.Msg) {
	seq, err := strconv.ParseUint(string(m.Data), 10, 64)
	if err != nil {
		return
	}
	d.mu.Lock()
	job, ok := d.inflight[seq]
	if !ok {
		d.cancelled[seq] = time.Now()
	}
	d.mu.Unlock()
	if ok {
		job.cancel(errCancelled)
	}
}

// onResend publishes again the data messages a gateway missed, when this
// dispatcher serves the attempt it names.
func (d *Dispatcher) onResend(m *nats.Msg) {
	var seq uint64
	var attempt, from int
	if _, err := fmt.Sscanf(string(m.Data), "%d %d %d", &seq, &attempt, &from); err != nil {
		return
	}
	d.mu.Lock()
	job, ok := d.inflight[seq]
	d.mu.Unlock()
	if ok && job.resp.attempt == strconv.Itoa(attempt) {
		job.resp.resend(from)
	}
}

// inflightJob is a request being served: how to cancel it, and its
// responder (for resends).
type inflightJob struct {
	cancel context.CancelCauseFunc
	resp   *responder
}

// track registers an in-flight job; it reports false when the job was
// cancelled before it started.
func (d *Dispatcher) track(seq uint64, cancel context.CancelCauseFunc, resp *responder) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.cancelled[seq]; ok {
		delete(d.cancelled, seq)
		return false
	}
	d.inflight[seq] = inflightJob{cancel: cancel, resp: resp}
	return true
}

func (d *Dispatcher) untrack(seq uint64) {
	d.mu.Lock()
	delete(d.inflight, seq)
	d.mu.Unlock()
}

func (d *Dispatcher) pruneCancelled() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for seq, at := range d.cancelled {
		if time.Since(at) > 2*d.cfg.AckWait.Duration {
			delete(d.cancelled, seq)
		}
	}
}
