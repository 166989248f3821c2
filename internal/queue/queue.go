// Package queue holds the contract between the gateway, which accepts OpenAI
// requests, and the durable queue that carries them to the dispatcher and
// carries the engine's answer back. The gateway depends on the Queue
// interface only; internal/natsqueue implements it on NATS JetStream, and
// tests may use an in-memory implementation.
package queue

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Job is one accepted OpenAI request, ready to be queued for an application.
type Job struct {
	// ID is unique per request; it is used for de-duplication and logs.
	ID string
	// App is the application (the routing key) that serves the model.
	App string
	// Path is the engine path to call, for example "/v1/chat/completions".
	Path string
	// Body is the JSON request body to send to the engine.
	Body []byte
	// Stream is true when the client asked for server-sent events.
	Stream bool
}

// Chunk is one ordered piece of the engine's answer.
type Chunk struct {
	// Status is the engine's HTTP status. It is set on the first chunk only.
	Status int
	// Header holds the engine's response headers worth passing on (at least
	// Content-Type). It is set on the first chunk only.
	Header http.Header
	// Data is the next bytes of the body, exactly as the engine sent them.
	Data []byte
}

// Reply is the ordered answer to one Job.
type Reply interface {
	// Next returns the next chunk. It returns io.EOF after the last one, and
	// one of the errors below (or ctx.Err()) when the answer cannot complete.
	Next(ctx context.Context) (Chunk, error)
	// Close releases the reply; when the answer is not complete it also
	// cancels the request all the way to the engine.
	Close() error
}

// Poller is implemented by replies that can hand out a chunk that has
// already arrived without waiting: a relay writing a stream to a client
// then writes what piled up while the client (or the relay) was slower than
// the engine before it flushes, so one write and one wake-up of the client
// carry several chunks, and no chunk waits for one that has not arrived.
type Poller interface {
	// Poll is Next without waiting: ok is false, with a nil error, when
	// the next chunk has not arrived yet.
	Poll() (c Chunk, ok bool, err error)
}

// Queue accepts jobs durably: once Submit returns without error the job
// survives restarts of the gateway, the dispatcher and the queue itself.
type Queue interface {
	Submit(ctx context.Context, job Job) (Reply, error)
}

// ErrDeadLettered means the job was delivered the maximum number of times
// without completing and was moved to the dead-letter stream.
var ErrDeadLettered = errors.New("request dead-lettered after repeated delivery failures")

// ErrRetriedAfterPartial means the job was redelivered after part of a
// streamed answer had already been returned, so it cannot be completed
// without duplicating or losing output.
var ErrRetriedAfterPartial = errors.New("request interrupted after a partial answer")

// ErrUnavailable means the queue cannot accept the job right now.
var ErrUnavailable = errors.New("queue unavailable")

// ErrNotServed means no dispatcher serves the job's application: none has
// announced it for longer than a request may wait for one. Retrying soon
// cannot help; the deployment needs fixing.
var ErrNotServed = errors.New("no dispatcher serves the application")

// ErrTooLarge means the job is larger than the queue can carry: retrying
// cannot help.
var ErrTooLarge = errors.New("request too large for the queue")

// SizeLimiter is implemented by queues that bound the size of a job's body.
type SizeLimiter interface {
	// MaxBodyBytes is the largest body Submit accepts, or 0 while unknown
	// (for example before the first connection).
	MaxBodyBytes() int64
}

// Lease is a slot on one ready engine root that a dispatcher lent to this
// gateway: while it holds the lease, the gateway may send one request at a
// time straight to the engine (the direct lane), and the slot counts
// against the root's maxConcurrency and as in flight for the lifecycle.
type Lease struct {
	// ID names the lease in its return.
	ID string
	// Root is the engine root's base URL, for example http://10.0.0.7:8000.
	Root string
	// Roots is how many roots the application had when the lease was
	// granted.
	Roots int
	// Expires is when the lease ends at the latest: the gateway sends no
	// request on it from then on.
	Expires time.Time
	// Revoked is closed when the dispatcher takes the lease back: at
	// Expires, when queued requests wait for its slot, when its root
	// leaves, or when the dispatcher stops. The holder sends no request on
	// it from then on and gives it back once the request running on it
	// ends (the dispatcher keeps the slot lent while Report says busy).
	Revoked <-chan struct{}
	// Return gives the lease back. failed reports that the engine failed
	// on it (unreachable, or an overload status before any answer), which
	// the dispatcher counts against the root as it counts its own
	// failures. It is safe to call more than once; only the first counts.
	Return func(failed bool)
	// Report tells the application's lifecycle leader and the lending
	// dispatcher how the lease is used: busy when a request runs on it now. The gateway reports soon
	// after a request starts, every second while it runs, and when it
	// ends; nil
	// when the queue has no lifecycle to tell.
	Report func(busy bool)
}

// Leaser is implemented by queues whose dispatchers lend engine slots.
type Leaser interface {
	// Lease asks the application's dispatchers for a slot; it fails with
	// ErrNoLease when none is free or lending does not apply.
	Lease(ctx context.Context, app string) (Lease, error)
}

// ErrNoLease means no lease was granted: no slot came free in time, or
// the application's routing needs its dispatcher to choose the root.
var ErrNoLease = errors.New("no engine slot lent")

// ErrLeaseRefused is the ErrNoLease of an application whose dispatcher
// chooses each request's root (prefix-aware routing over several roots):
// asking again soon cannot help.
var ErrLeaseRefused = fmt.Errorf("%w: the dispatcher chooses each request's root", ErrNoLease)
