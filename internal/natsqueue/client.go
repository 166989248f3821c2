package natsqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/model-orchestra/operator/internal/queue"
)

// ClientConfig configures the gateway side of the queue.
type ClientConfig struct {
	// Orchestra is the ModelOrchestra name; it selects the stream.
	Orchestra string
	// Instance names this gateway instance (for example the pod name); its
	// replies arrive under Names.ReplyPrefix(Instance). Empty: a random ID.
	Instance string
	// SubmitTimeout bounds the wait for JetStream's acknowledgement. While
	// the request stream has no responder (a NATS server restarting, or a
	// cluster electing the stream's new leader after losing a server), the
	// publish is retried every submitRetryWait within it.
	SubmitTimeout time.Duration
	// StallTimeout is how long a reply may see no sign of life (no message
	// for it, and while not started, no heartbeat of a dispatcher serving the
	// application) before it fails.
	StallTimeout time.Duration
	// MaxQueueWait bounds the time a job may wait before a dispatcher picks
	// it up (0: no bound beyond StallTimeout and the caller's context).
	MaxQueueWait time.Duration
	// RedeliveryWait is how long, after a started attempt went silent for
	// StallTimeout, the reply waits for JetStream to redeliver the job to
	// another dispatcher. Make it longer than the dispatchers' AckWait.
	RedeliveryWait time.Duration
}

// DefaultClientConfig returns production defaults.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		SubmitTimeout:  15 * time.Second,
		StallTimeout:   30 * time.Second,
		MaxQueueWait:   10 * time.Minute,
		RedeliveryWait: time.Minute,
	}
}

// Validate reports every invalid field.
func (c ClientConfig) Validate() error {
	var errs []error
	if err := ValidToken(c.Orchestra); err != nil {
		errs = append(errs, fmt.Errorf("orchestra: %w", err))
	}
	if c.Instance != "" {
		if err := ValidToken(c.Instance); err != nil {
			errs = append(errs, fmt.Errorf("instance: %w", err))
		}
	}
	if c.SubmitTimeout <= 0 || c.StallTimeout <= 0 {
		errs = append(errs, errors.New("submit and stall timeouts must be positive"))
	}
	if c.MaxQueueWait < 0 || c.RedeliveryWait < 0 {
		errs = append(errs, errors.New("max queue wait and redelivery wait must not be negative"))
	}
	return errors.Join(errs...)
}

// HeaderReserve is the part of NATS's max_payload kept for a request's
// headers (about 300 bytes) and for the gateway's rewrite of a streamed body
// (stream_options.include_usage): a body may take max_payload minus this.
const HeaderReserve = 4 << 10

// ErrResponseLost means part of an answer never arrived (the connection to
// NATS broke while it was in flight). It wraps queue.ErrUnavailable.
var ErrResponseLost = fmt.Errorf("%w: part of the response was lost", queue.ErrUnavailable)

// Client is the gateway's queue.Queue on JetStream. It is safe for
// concurrent use.
type Client struct {
	cfg    ClientConfig
	names  Names
	nc     *nats.Conn
	js     jetstream.JetStream
	log    *slog.Logger
	prefix string

	mu      sync.Mutex
	replies map[string]*reply

	hbMu      sync.Mutex
	appAlive  map[string]time.Time
	reconnect atomic.Int64 // unix nanos of the last reconnect

	subs  []*nats.Subscription
	owned bool // Close closes nc
}

var _ queue.Queue = (*Client)(nil)

// NewClient starts a client on an existing connection, which the caller
// keeps owning. Give the connection unlimited reconnects
// (nats.MaxReconnects(-1)) so replies survive a NATS restart.
func NewClient(nc *nats.Conn, cfg ClientConfig, log *slog.Logger) (*Client, error) {
	if cfg.Instance == "" {
		cfg.Instance = strings.ToLower(nuid.Next())
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid queue client config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("creating JetStream context: %w", err)
	}
	names := Names{Orchestra: cfg.Orchestra}
	c := &Client{
		cfg:      cfg,
		names:    names,
		nc:       nc,
		js:       js,
		log:      log,
		prefix:   names.ReplyPrefix(cfg.Instance) + ".",
		replies:  make(map[string]*reply),
		appAlive: make(map[string]time.Time),
	}
	sub, err := nc.Subscribe(c.prefix+"*", c.route)
	if err != nil {
		return nil, fmt.Errorf("subscribing to replies: %w", err)
	}
	c.subs = append(c.subs, sub)
	sub, err = nc.Subscribe(names.Heartbeat("*"), c.heartbeat)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("subscribing to dispatcher heartbeats: %w", err)
	}
	c.subs = append(c.subs, sub)
	// Heartbeats are awaited from now on: an application nobody announced
	// since is not served only once StallTimeout has passed (served).
	c.reconnect.Store(time.Now().UnixNano())
	for _, s := range c.subs {
		_ = s.SetPendingLimits(-1, -1) // replies must not be dropped as slow-consumer overflow
	}
	// A reconnect restarts every stall clock: nothing could progress while
	// the connection was down.
	prev := nc.Opts.ReconnectedCB
	nc.SetReconnectHandler(func(conn *nats.Conn) {
		c.reconnect.Store(time.Now().UnixNano())
		if prev != nil {
			prev(conn)
		}
	})
	if err := nc.Flush(); err != nil {
		c.Close()
		return nil, fmt.Errorf("flushing subscriptions: %w", err)
	}
	return c, nil
}

// Connect dials NATS at url (reconnecting forever) and starts a client that
// owns the connection.
func Connect(url string, cfg ClientConfig, log *slog.Logger, opts ...nats.Option) (*Client, error) {
	opts = append([]nats.Option{
		nats.Name("orchestra-gateway"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("disconnected from NATS", "err", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("reconnected to NATS", "url", nc.ConnectedUrl()) }),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	c, err := NewClient(nc, cfg, log)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.owned = true
	return c, nil
}

// Ping reports whether jobs can be submitted: NATS is connected and the
// request stream exists.
func (c *Client) Ping(ctx context.Context) error {
	if !c.nc.IsConnected() {
		return fmt.Errorf("%w: not connected to NATS", queue.ErrUnavailable)
	}
	if _, err := c.js.Stream(ctx, c.names.Stream()); err != nil {
		return fmt.Errorf("%w: looking up stream %s: %w", queue.ErrUnavailable, c.names.Stream(), err)
	}
	return nil
}

// MaxBodyBytes implements queue.SizeLimiter: the largest job body that fits
// in one NATS message with its headers, from the server's max_payload; 0
// before the first connection.
func (c *Client) MaxBodyBytes() int64 {
	mp := c.nc.MaxPayload()
	if mp <= HeaderReserve {
		return 0
	}
	return mp - HeaderReserve
}

// Close stops receiving replies (and closes the connection if Connect made
// it). Open replies fail with ErrUnavailable.
func (c *Client) Close() {
	for _, s := range c.subs {
		_ = s.Unsubscribe()
	}
	if c.owned {
		defer c.nc.Close()
	}
	c.mu.Lock()
	rs := c.replies
	c.replies = map[string]*reply{}
	c.mu.Unlock()
	for _, r := range rs {
		r.fail(fmt.Errorf("%w: queue client closed", queue.ErrUnavailable))
	}
}

// Submit queues job durably: it returns only once JetStream has stored it.
// A job whose ID was already submitted within the de-duplication window is
// not queued again; if its reply is still open on this instance, Submit
// fails rather than answer twice.
func (c *Client) Submit(ctx context.Context, job queue.Job) (queue.Reply, error) {
	if err := ValidToken(job.App); err != nil {
		return nil, fmt.Errorf("application: %w", err)
	}
	if job.ID == "" {
		return nil, errors.New("job ID must not be empty")
	}
	if err := c.served(job.App); err != nil {
		return nil, err
	}
	token := replyToken(job.ID)
	r := newReply(c, job, token)
	c.mu.Lock()
	if _, dup := c.replies[token]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("job %s is already in flight", job.ID)
	}
	c.replies[token] = r
	c.mu.Unlock()

	// One allocation for the header values; room in the map for the two
	// headers JetStream's publish adds.
	vals := [...]string{job.ID, job.App, job.Path, c.prefix + token, "0"}
	if job.Stream {
		vals[4] = "1"
	}
	h := make(nats.Header, 8)
	h[HeaderJobID] = vals[0:1:1]
	h[HeaderApp] = vals[1:2:2]
	h[HeaderPath] = vals[2:3:3]
	h[HeaderReply] = vals[3:4:4]
	h[HeaderStream] = vals[4:5:5]
	msg := &nats.Msg{Subject: c.names.Request(job.App), Header: h, Data: job.Body}
	if mp := c.nc.MaxPayload(); mp > 0 && int64(len(job.Body)+headerSize(h, job.ID, c.names.Stream())) > mp {
		c.forget(token)
		return nil, fmt.Errorf("%w: job %s has a body of %d bytes; with its headers it exceeds NATS's max_payload of %d bytes",
			queue.ErrTooLarge, job.ID, len(job.Body), mp)
	}

	ack, err := c.publish(ctx, msg, job.ID)
	if err != nil {
		c.forget(token)
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, fmt.Errorf("%w: submitting job %s: %w", queue.ErrTooLarge, job.ID, err)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("submitting job %s: %w", job.ID, ctx.Err())
		}
		return nil, fmt.Errorf("%w: submitting job %s: %w", queue.ErrUnavailable, job.ID, err)
	}
	r.seq.Store(ack.Sequence)
	return r, nil
}

// publish stores msg in the request stream, trying again until
// SubmitTimeout ends while the stream cannot answer. When a NATS server of a
// cluster dies, the streams it led elect a new leader (nats-server's Raft
// waits 4–9 s for a missing leader), and a publish meets one of three
// things: no responder (retried every submitRetryWait), a server that took
// the message and died with it (no answer: each attempt is bounded, from
// submitAttemptTimeout doubling up to what is left), or JetStream answering
// that it is temporarily unavailable. Trying again is safe: the message ID
// makes JetStream store the job once, and a repeat is acknowledged with the
// first one's sequence.
func (c *Client) publish(ctx context.Context, msg *nats.Msg, id string) (*jetstream.PubAck, error) {
	pctx, cancel := context.WithTimeout(ctx, c.cfg.SubmitTimeout)
	defer cancel()
	attempt := submitAttemptTimeout
	for {
		actx, acancel := context.WithTimeout(pctx, attempt)
		ack, err := c.js.PublishMsg(actx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(c.names.Stream()),
			jetstream.WithRetryAttempts(0))
		acancel()
		switch {
		case err == nil, !retryablePublish(err):
			return ack, err
		case pctx.Err() != nil:
			return nil, fmt.Errorf("the stream did not store it within %v: %w", c.cfg.SubmitTimeout, err)
		}
		c.log.Debug("publishing job again", "job", id, "err", err)
		if errors.Is(err, context.DeadlineExceeded) {
			attempt = min(2*attempt, c.cfg.SubmitTimeout)
			continue
		}
		select {
		case <-pctx.Done():
			return nil, fmt.Errorf("the stream did not store it within %v: %w", c.cfg.SubmitTimeout, err)
		case <-time.After(submitRetryWait):
		}
	}
}

// retryablePublish reports whether a failed publish may succeed if tried
// again: it went unanswered, or JetStream said it is briefly unavailable.
func retryablePublish(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == http.StatusServiceUnavailable
	}
	return false
}

const (
	// submitRetryWait paces the publishes of a job while its stream has
	// no responder.
	submitRetryWait = 100 * time.Millisecond
	// submitAttemptTimeout bounds the first wait for a publish's
	// acknowledgement; each further attempt waits twice as long.
	submitAttemptTimeout = time.Second
)

// headerSize is the size of h on the wire, with the two headers
// JetStream's publish adds (Nats-Msg-Id: id, Nats-Expected-Stream: stream).
func headerSize(h nats.Header, id, stream string) int {
	n := len("NATS/1.0\r\n\r\n") + 2*len(": \r\n") +
		len(jetstream.MsgIDHeader) + len(id) + len(jetstream.ExpectedStreamHeader) + len(stream)
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": \r\n") + len(v)
		}
	}
	return n
}

// replyToken turns a job ID into one subject token. IDs made of letters,
// digits, '-' and '_' are used as they are.
func replyToken(id string) string {
	safe := len(id) <= 128
	for i := 0; safe && i < len(id); i++ {
		b := id[i]
		safe = b == '-' || b == '_' || (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')
	}
	if safe {
		return id
	}
	var sb strings.Builder
	for _, b := range []byte(id) {
		if (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') {
			sb.WriteByte(b)
		} else {
			fmt.Fprintf(&sb, "_%02x", b)
		}
	}
	return sb.String()
}

func (c *Client) forget(token string) {
	c.mu.Lock()
	delete(c.replies, token)
	c.mu.Unlock()
}

// route hands a response message to its reply.
func (c *Client) route(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, c.prefix)
	c.mu.Lock()
	r := c.replies[token]
	c.mu.Unlock()
	if r != nil {
		r.push(m)
	}
	if m.Reply != "" {
		// A dispatcher asks whether anyone still waits for this answer and,
		// with its final data message, whether the answer is whole.
		answer := AcceptWaiting
		if r == nil {
			answer = AcceptGone
		} else if from, missing := r.missing(m); missing {
			answer = AcceptResend + strconv.Itoa(from)
		}
		_ = c.nc.Publish(m.Reply, []byte(answer))
	}
}

func (c *Client) heartbeat(m *nats.Msg) {
	app := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	c.hbMu.Lock()
	c.appAlive[app] = time.Now()
	c.hbMu.Unlock()
}

// lastSignOfLife returns the last time a dispatcher announced app, or the
// last reconnect, whichever is later.
func (c *Client) lastSignOfLife(app string) time.Time {
	c.hbMu.Lock()
	t := c.appAlive[app]
	c.hbMu.Unlock()
	if rc := time.Unix(0, c.reconnect.Load()); rc.After(t) {
		t = rc
	}
	return t
}

// served fails with queue.ErrNotServed when the client is connected and no
// dispatcher announced app for StallTimeout (since the client started or
// last reconnected): a job for it would only wait that long and fail. A
// dispatcher restarting within StallTimeout does not count as missing.
func (c *Client) served(app string) error {
	if !c.nc.IsConnected() {
		return nil // the publish will say whether the queue is there
	}
	if silent := time.Since(c.lastSignOfLife(app)); silent > c.cfg.StallTimeout {
		return fmt.Errorf("%w: no dispatcher announced application %s for %v", queue.ErrNotServed, app, silent.Round(time.Second))
	}
	return nil
}

func (c *Client) lastReconnect() time.Time { return time.Unix(0, c.reconnect.Load()) }

// requestResend asks the dispatcher serving attempt of the job for its data
// messages from Orch-Seq from on.
func (c *Client) requestResend(app string, seq uint64, attempt, from int) {
	if seq == 0 {
		return
	}
	payload := strconv.FormatUint(seq, 10) + " " + strconv.Itoa(attempt) + " " + strconv.Itoa(from)
	if err := c.nc.Publish(c.names.Resend(app), []byte(payload)); err != nil {
		c.log.Debug("asking for missed response messages", "app", app, "seq", seq, "err", err)
	}
}

// cancel tells dispatchers to stop the job, and removes it from the stream
// if no dispatcher took it yet.
func (c *Client) cancel(app string, seq uint64) {
	if seq == 0 {
		return
	}
	if err := c.nc.Publish(c.names.Cancel(app), []byte(strconv.FormatUint(seq, 10))); err != nil {
		c.log.Warn("publishing cancel", "app", app, "seq", seq, "err", err)
	}
	go func() {
		ctx, done := context.WithTimeout(context.Background(), c.cfg.SubmitTimeout)
		defer done()
		s, err := c.js.Stream(ctx, c.names.Stream())
		if err == nil {
			err = s.DeleteMsg(ctx, seq)
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			c.log.Debug("removing cancelled job from the stream", "app", app, "seq", seq, "err", err)
		}
	}()
}
