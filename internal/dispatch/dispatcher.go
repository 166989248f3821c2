package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// errShutdown and errCancelled are the causes that end an in-flight request
// without it being the engine's fault.
var (
	errShutdown  = errors.New("dispatcher shutting down")
	errCancelled = errors.New("cancelled by the client")
	// errNoListener: no gateway listens for the answer (yet).
	errNoListener = errors.New("no gateway listens for the answer")
)

// Dispatcher serves the applications of one orchestra.
type Dispatcher struct {
	cfg   Config
	names natsqueue.Names
	nc    *nats.Conn
	js    jetstream.JetStream
	kube  kubernetes.Interface
	log   *slog.Logger
	m     *metrics
	reg   *prometheus.Registry
	// engines carries engine requests. It is used as a RoundTripper, not
	// through an http.Client: engine answers are relayed as they are
	// (redirects included), and http.Client's per-request header copies
	// for following redirects cost more than the relay itself.
	engines *http.Transport

	apps  []*app
	pools map[string]*pool

	mu        sync.Mutex
	inflight  map[uint64]context.CancelCauseFunc // by stream sequence
	cancelled map[uint64]time.Time               // cancels that arrived before their job

	ready atomic.Bool
	wg    sync.WaitGroup

	lifecycle *lifecycle.Controller // nil without a lifecycle section (activator.go)
}

type app struct {
	App
	pool *pool
	m    appMetrics

	mu       sync.Mutex
	consumer jetstream.Consumer
}

func (a *app) getConsumer() jetstream.Consumer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.consumer
}

func (a *app) setConsumer(c jetstream.Consumer) {
	a.mu.Lock()
	a.consumer = c
	a.mu.Unlock()
}

// Option customises a Dispatcher.
type Option func(*Dispatcher)

// WithKubernetes sets the client used to watch EndpointSlices; required
// when an application names a Service.
func WithKubernetes(cs kubernetes.Interface) Option { return func(d *Dispatcher) { d.kube = cs } }

// WithRegistry registers the dispatcher's metrics on reg instead of a
// private registry.
func WithRegistry(reg *prometheus.Registry) Option { return func(d *Dispatcher) { d.reg = reg } }

// New builds a dispatcher on an established NATS connection, which the
// caller owns. cfg must be valid.
func New(cfg Config, nc *nats.Conn, log *slog.Logger, opts ...Option) (*Dispatcher, error) {
	for i := range cfg.Apps {
		cfg.Apps[i] = defaultApp(cfg.Apps[i])
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid dispatcher config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("creating JetStream context: %w", err)
	}
	d := &Dispatcher{
		cfg:       cfg,
		names:     natsqueue.Names{Orchestra: cfg.Orchestra},
		nc:        nc,
		js:        js,
		log:       log,
		pools:     map[string]*pool{},
		inflight:  map[uint64]context.CancelCauseFunc{},
		cancelled: map[uint64]time.Time{},
	}
	for _, o := range opts {
		o(d)
	}
	if d.reg == nil {
		d.reg = prometheus.NewRegistry()
	}
	d.m = newMetrics(d.reg)
	d.engines = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
	}
	for _, a := range cfg.Apps {
		name := a.Name
		p := newPool(a.MaxConcurrency, cfg.Health, func(root string, healthy bool) {
			v := 0.0
			if healthy {
				v = 1
			}
			d.m.rootHealthy.WithLabelValues(name, root).Set(v)
		})
		if len(a.Endpoints) > 0 {
			p.set(a.Endpoints)
		} else if d.kube == nil {
			return nil, fmt.Errorf("application %s names service %s but no Kubernetes client was given", a.Name, a.Service)
		}
		d.pools[a.Name] = p
		d.apps = append(d.apps, &app{App: a, pool: p, m: d.m.forApp(a.Name)})
	}
	return d, nil
}

// Registry returns the registry holding the dispatcher's metrics.
func (d *Dispatcher) Registry() *prometheus.Registry { return d.reg }

// Ready reports whether the dispatcher is provisioned, watching its roots
// and connected to NATS.
func (d *Dispatcher) Ready() bool { return d.ready.Load() && d.nc.IsConnected() }

// Roots returns the current engine roots of an application.
func (d *Dispatcher) Roots(app string) []string {
	if p := d.pools[app]; p != nil {
		return p.urls()
	}
	return nil
}

// Run provisions the streams and consumers, then dispatches until ctx ends.
// On shutdown it stops pulling, lets in-flight requests finish for up to
// ShutdownTimeout and hands the rest back to JetStream for redelivery.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.provision(ctx); err != nil {
		return err
	}
	if d.kube != nil {
		if err := watchEndpoints(ctx, d.kube, d.cfg.Namespace, d.cfg.Apps, d.pools, d.log); err != nil {
			return err
		}
	}
	if err := d.runLifecycle(ctx); err != nil {
		return err
	}
	sub, err := d.nc.Subscribe(d.names.Cancel("*"), d.onCancel)
	if err != nil {
		return fmt.Errorf("subscribing to cancels: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	// Handlers outlive ctx by up to ShutdownTimeout.
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(errShutdown)

	var feeders sync.WaitGroup
	for _, a := range d.apps {
		feeders.Go(func() { d.feed(ctx, work, a) })
	}
	go d.heartbeats(ctx)
	// The first reading is taken before the dispatcher reports ready, so
	// that a scrape after readiness shows every application's backlog.
	d.observeBacklogOnce(ctx)
	go d.observeBacklog(ctx)
	d.ready.Store(true)
	d.log.Info("dispatcher running", "orchestra", d.cfg.Orchestra, "apps", len(d.apps))

	<-ctx.Done()
	d.ready.Store(false)
	feeders.Wait()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d.cfg.ShutdownTimeout.Duration):
		d.log.Warn("shutdown timeout: handing unfinished requests back to JetStream")
		stopWork(errShutdown)
		<-done
	}
	// Push out the last acks and answers; without a connection there is
	// nothing to push (JetStream redelivers what was not acknowledged).
	if d.nc.IsConnected() {
		if err := d.nc.FlushTimeout(5 * time.Second); err != nil {
			d.log.Warn("flushing on shutdown", "err", err)
		}
	}
	return nil
}

// provision creates or updates the streams and consumers and looks the
// consumers up, retrying until it works: NATS may start after us, or lose
// its state.
func (d *Dispatcher) provision(ctx context.Context) error {
	specs := make([]natsqueue.ConsumerSpec, 0, len(d.apps))
	for _, a := range d.apps {
		specs = append(specs, natsqueue.ConsumerSpec{App: a.Name, AckWait: d.cfg.AckWait.Duration, MaxAckPending: d.cfg.MaxAckPending})
	}
	attempt := func() error {
		if !d.nc.IsConnected() {
			// Requests would wait in the reconnect buffer until they time out.
			return errors.New("not connected to NATS")
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := natsqueue.Provision(pctx, d.js, d.cfg.streamSpec(), specs); err != nil {
			return err
		}
		for _, a := range d.apps {
			c, err := d.js.Consumer(pctx, d.names.Stream(), d.names.Consumer(a.Name))
			if err != nil {
				return fmt.Errorf("looking up consumer of %s: %w", a.Name, err)
			}
			a.setConsumer(c)
		}
		return nil
	}
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		err := attempt()
		if err == nil {
			return nil
		}
		d.log.Warn("provisioning JetStream", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("provisioning JetStream: %w", err)
		case <-time.After(delay):
		}
	}
}

// feed pulls an application's requests while engine slots are free, until
// ctx ends. When pulling stops for another reason (the consumer was deleted,
// NATS lost its state) it provisions again and resumes.
func (d *Dispatcher) feed(ctx, work context.Context, a *app) {
	for ctx.Err() == nil {
		iter, err := a.getConsumer().Messages(jetstream.PullMaxMessages(d.cfg.Prefetch))
		if err == nil {
			d.pull(ctx, work, a, iter)
			if ctx.Err() != nil {
				return
			}
			err = errors.New("pulling stopped")
		}
		d.log.Warn("pulling requests; provisioning again", "app", a.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		if err := d.provision(ctx); err != nil {
			return
		}
	}
}

// pull runs one pull subscription until it closes or ctx ends.
func (d *Dispatcher) pull(ctx, work context.Context, a *app, iter jetstream.MessagesContext) {
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			if d.nc.IsConnected() {
				iter.Drain() // hand back what is buffered, below
			} else {
				iter.Stop() // draining would wait for a flush that cannot happen
			}
		case <-stopped:
			iter.Stop()
		}
	}()
	defer close(stopped)
	for {
		rt, err := a.pool.acquire(ctx)
		if err != nil {
			break
		}
		msg, err := iter.Next()
		if err != nil {
			a.pool.release(rt, true, false)
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			d.log.Warn("pulling requests", "app", a.Name, "err", err)
			select { // do not spin on a persistent error
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		if ctx.Err() != nil {
			a.pool.release(rt, true, false)
			_ = msg.Nak()
			break
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.handle(work, a, msg, rt)
		}()
	}
	// Hand back what was buffered but not started.
	for {
		msg, err := iter.Next()
		if err != nil {
			return
		}
		_ = msg.Nak()
	}
}

// heartbeats tells gateways which applications are being served.
func (d *Dispatcher) heartbeats(ctx context.Context) {
	t := time.NewTicker(d.cfg.HeartbeatInterval.Duration)
	defer t.Stop()
	for {
		for _, a := range d.apps {
			_ = d.nc.Publish(d.names.Heartbeat(a.Name), nil)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.pruneCancelled()
	}
}

// observeBacklog updates the backlog gauges every 5 s until ctx ends.
func (d *Dispatcher) observeBacklog(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.observeBacklogOnce(ctx)
	}
}

// observeBacklogOnce sets each application's backlog and ack-pending gauges
// from its consumer; an application whose consumer does not answer keeps
// its last values.
func (d *Dispatcher) observeBacklogOnce(ctx context.Context) {
	for _, a := range d.apps {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := a.getConsumer().Info(ictx)
		cancel()
		if err != nil {
			continue
		}
		d.m.backlog.WithLabelValues(a.Name).Set(float64(info.NumPending))
		d.m.ackPending.WithLabelValues(a.Name).Set(float64(info.NumAckPending))
	}
}

// onCancel stops the job whose stream sequence the gateway sent.
func (d *Dispatcher) onCancel(m *nats.Msg) {
	seq, err := strconv.ParseUint(string(m.Data), 10, 64)
	if err != nil {
		return
	}
	d.mu.Lock()
	cancel := d.inflight[seq]
	if cancel == nil {
		d.cancelled[seq] = time.Now()
	}
	d.mu.Unlock()
	if cancel != nil {
		cancel(errCancelled)
	}
}

// track registers an in-flight job; it reports false when the job was
// cancelled before it started.
func (d *Dispatcher) track(seq uint64, cancel context.CancelCauseFunc) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.cancelled[seq]; ok {
		delete(d.cancelled, seq)
		return false
	}
	d.inflight[seq] = cancel
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
