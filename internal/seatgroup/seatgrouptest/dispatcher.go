package seatgrouptest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/ssetest"
)

// Result is the outcome of one request.
type Result struct {
	App string
	// Tokens asked for and received.
	Want, Got int
	// Err is set when the request was lost or cut: an error answer, a
	// stream without [DONE], or fewer tokens than asked for.
	Err                         error
	Enqueued, Started, Finished time.Time
}

// Dispatcher queues requests per application and sends them to an
// application's engine only while its gate is open, as the dispatcher does
// for the lifecycle decision-maker: requests for an application that is not
// awake wait in the queue, never in the engine. It implements
// seatgroup.Dispatcher.
type Dispatcher struct {
	client *http.Client
	ctx    context.Context
	kick   func()

	mu   sync.Mutex
	apps map[string]*queue
	wg   sync.WaitGroup
}

type queue struct {
	url     string
	pending []*request
	open    bool
	// inFlight counts requests taken from the queue, including those on
	// their way to the engine: the gate check and the count are one step.
	inFlight int
	lastUse  time.Time
	service  time.Duration // moving average of request durations
	maxConc  int
}

type request struct {
	tokens   int
	enqueued time.Time
	done     chan Result
}

func newDispatcher(ctx context.Context, client *http.Client) *Dispatcher {
	return &Dispatcher{client: client, ctx: ctx, apps: map[string]*queue{}, kick: func() {}}
}

func (d *Dispatcher) add(app, url string, maxConc int) {
	d.apps[app] = &queue{url: url, maxConc: maxConc}
}

// Submit queues a streamed chat request for tokens tokens.
func (d *Dispatcher) Submit(app string, tokens int) <-chan Result {
	r := &request{tokens: tokens, enqueued: time.Now(), done: make(chan Result, 1)}
	d.mu.Lock()
	q := d.apps[app]
	q.pending = append(q.pending, r)
	d.pumpLocked(app, q)
	d.mu.Unlock()
	d.kick()
	return r.done
}

// pumpLocked sends queued requests while the gate is open.
func (d *Dispatcher) pumpLocked(app string, q *queue) {
	for q.open && len(q.pending) > 0 && q.inFlight < q.maxConc {
		r := q.pending[0]
		q.pending = q.pending[1:]
		q.inFlight++
		q.lastUse = time.Now()
		d.wg.Add(1)
		go d.send(app, q, r)
	}
}

func (d *Dispatcher) send(app string, q *queue, r *request) {
	defer d.wg.Done()
	res := Result{App: app, Want: r.tokens, Enqueued: r.enqueued, Started: time.Now()}
	res.Got, res.Err = d.stream(q.url, r.tokens)
	res.Finished = time.Now()
	d.mu.Lock()
	q.inFlight--
	q.lastUse = res.Finished
	dur := res.Finished.Sub(res.Started)
	if q.service == 0 {
		q.service = dur
	} else {
		q.service = (7*q.service + 3*dur) / 10
	}
	d.pumpLocked(app, q)
	d.mu.Unlock()
	r.done <- res
	d.kick()
}

// stream sends one streamed chat completion and counts its tokens.
func (d *Dispatcher) stream(url string, tokens int) (int, error) {
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":%d,"ignore_eos":true}`, tokens)
	req, err := http.NewRequestWithContext(d.ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return 0, fmt.Errorf("engine answered %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	// A token is a chunk with non-empty delta content (ssetest's rule: the
	// role chunk is not one).
	res, err := ssetest.Read(resp.Body, nil)
	if err != nil {
		return res.Chunks, fmt.Errorf("stream cut after %d tokens: %w", res.Chunks, err)
	}
	if res.Chunks != tokens {
		return res.Chunks, fmt.Errorf("stream had %d tokens, want %d", res.Chunks, tokens)
	}
	return res.Chunks, nil
}

// Demand implements seatgroup.Dispatcher.
func (d *Dispatcher) Demand(app string) seatgroup.Demand {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.apps[app]
	dm := seatgroup.Demand{InFlight: q.inFlight, Queued: len(q.pending), LastUse: q.lastUse, ServiceTime: q.service}
	if len(q.pending) > 0 {
		dm.OldestWait = time.Since(q.pending[0].enqueued)
	}
	return dm
}

// Hold implements seatgroup.Dispatcher.
func (d *Dispatcher) Hold(app string) {
	d.mu.Lock()
	d.apps[app].open = false
	d.mu.Unlock()
}

// Release implements seatgroup.Dispatcher.
func (d *Dispatcher) Release(app string) {
	d.mu.Lock()
	q := d.apps[app]
	q.open = true
	d.pumpLocked(app, q)
	d.mu.Unlock()
}

// Open reports whether app's gate is open.
func (d *Dispatcher) Open(app string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.apps[app].open
}

// wait waits for every request sent so far to finish.
func (d *Dispatcher) wait() { d.wg.Wait() }
