package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/internal/batch"
	"github.com/model-orchestra/operator/internal/enginecall"
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
	views map[string]*rootView // where each pool's roots come from (endpoints.go)

	mu        sync.Mutex
	inflight  map[uint64]inflightJob // by stream sequence
	cancelled map[uint64]time.Time   // cancels that arrived before their job

	ready atomic.Bool
	wg    sync.WaitGroup

	lifecycle *lifecycle.Controller // nil without a lifecycle section (activator.go)

	// id names this dispatcher in shared routing decisions (router.go).
	id string

	// bm and results serve batch lines (batch.go).
	bm      *batchMetrics
	results *batch.Results
	// progress is the last wake progress said per application (wakeprogress.go).
	progress wakeProgress
	// leases are the engine slots lent to gateways (lease.go).
	leases leases
}

type app struct {
	App
	pool *pool
	held *held
	m    appMetrics
	// router picks each request's root; nil for leastLoaded (the pool's
	// own choice).
	router *router
	// inflight counts requests being served; backlog is the consumer's
	// NumPending at the last poll. Both feed Load.
	inflight atomic.Int64
	backlog  atomic.Int64

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
		views:     map[string]*rootView{},
		inflight:  map[uint64]inflightJob{},
		cancelled: map[uint64]time.Time{},
	}
	for _, o := range opts {
		o(d)
	}
	if d.reg == nil {
		d.reg = prometheus.NewRegistry()
	}
	d.m = newMetrics(d.reg)
	d.bm = newBatchMetrics(d.reg)
	d.results = batch.NewResults(js, cfg.Orchestra)
	routeVecs := newRouteMetrics(d.reg)
	d.id = strconv.FormatUint(rand.Uint64(), 36)
	d.engines = enginecall.NewTransport()
	seats := seatMembers(cfg.Lifecycle)
	for _, a := range cfg.Apps {
		name := a.Name
		var rt *router
		if a.Routing.Policy != RouteLeastLoaded {
			rt = newRouter(a.Routing, routeVecs.forApp(name))
		}
		p := newPool(a.MaxConcurrency, cfg.Health, func(root string, healthy bool) {
			v := 0.0
			if healthy {
				v = 1
			}
			d.m.rootHealthy.WithLabelValues(name, root).Set(v)
			if !healthy && rt != nil {
				rt.forget(root)
			}
		})
		if cfg.Health.Path != "" {
			p.probe = d.probe
		}
		if len(a.Endpoints) > 0 {
			p.set(a.Endpoints)
		} else if d.kube == nil {
			return nil, fmt.Errorf("application %s names service %s but no Kubernetes client was given", a.Name, a.Service)
		}
		d.pools[a.Name] = p
		d.views[a.Name] = &rootView{app: a, pool: p, log: log, seat: seats[a.Name] && len(a.Endpoints) == 0}
		if cfg.Health.Path != "" {
			d.views[a.Name].warm = func(url string) { d.probe(url) }
		}
		d.apps = append(d.apps, &app{App: a, pool: p, held: newHeld(), m: d.m.forApp(a.Name), router: rt})
	}
	return d, nil
}

// probe reports whether the engine at root answers its health check.
func (d *Dispatcher) probe(root string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, root+d.cfg.Health.Path, nil)
	if err != nil {
		return false
	}
	res, err := d.engines.RoundTrip(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
	_ = res.Body.Close()
	return res.StatusCode >= 200 && res.StatusCode < 300
}

// AppLoad is an application's work as one dispatcher sees it.
type AppLoad struct {
	// Backlog is the requests queued in JetStream and not delivered to any
	// dispatcher yet, at the last poll (every 5 s).
	Backlog int
	// Held is the requests delivered to this dispatcher that wait for an
	// engine slot; InFlight those it is serving.
	Held, InFlight int
	// Roots is the number of engine roots (ready endpoints).
	Roots int
}

// Load reports an application's work and roots; false for an application
// this dispatcher does not serve. A Backlog or Held above zero with no
// Roots is an application waiting for its engines.
func (d *Dispatcher) Load(name string) (AppLoad, bool) {
	for _, a := range d.apps {
		if a.Name == name {
			return AppLoad{
				Backlog:  int(a.backlog.Load()),
				Held:     a.held.len(),
				InFlight: int(a.inflight.Load()),
				Roots:    len(a.pool.urls()),
			}, true
		}
	}
	return AppLoad{}, false
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
		if err := watchEndpoints(ctx, d.kube, d.cfg.Namespace, d.cfg.Apps, d.views); err != nil {
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
	resends, err := d.nc.Subscribe(d.names.Resend("*"), d.onResend)
	if err != nil {
		return fmt.Errorf("subscribing to resend requests: %w", err)
	}
	defer func() { _ = resends.Unsubscribe() }()
	returns, err := d.nc.Subscribe(d.names.LeaseReturn("*"), d.onLeaseReturn)
	if err != nil {
		return fmt.Errorf("subscribing to lease returns: %w", err)
	}
	defer func() { _ = returns.Unsubscribe() }()
	uses, err := d.nc.Subscribe(d.names.LeaseUseWildcard(), d.onLeaseUse)
	if err != nil {
		return fmt.Errorf("subscribing to lease use reports: %w", err)
	}
	defer func() { _ = uses.Unsubscribe() }()
	unshare, err := d.shareRoutes()
	if err != nil {
		return fmt.Errorf("subscribing to routing decisions: %w", err)
	}
	defer unshare()

	// Handlers outlive ctx by up to ShutdownTimeout.
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(errShutdown)

	var feeders sync.WaitGroup
	for _, a := range d.apps {
		feeders.Go(func() { d.feed(ctx, work, a) })
		feeders.Go(func() { d.pumpBatches(ctx, a) })
		feeders.Go(func() { d.lend(ctx, a) })
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

// fetchWait bounds one pull request: an idle dispatcher asks again this
// often, and stopping waits at most this long for the last answer.
const fetchWait = 2 * time.Second

// feed serves an application's requests until ctx ends. When pulling fails
// (the consumer was deleted, NATS lost its state) it provisions again and
// resumes.
func (d *Dispatcher) feed(ctx, work context.Context, a *app) {
	for ctx.Err() == nil {
		err := d.pull(ctx, work, a)
		if ctx.Err() != nil {
			return
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

// pull runs an application until ctx ends or fetching fails: a fetcher
// keeps up to Prefetch requests held (kept alive, see held), and each held
// request starts as soon as an engine slot is free. A request is fetched
// only into room in the held queue, so none waits anywhere it is not kept
// alive. On return the held requests are handed back to JetStream.
func (d *Dispatcher) pull(ctx, work context.Context, a *app) error {
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	fetched := make(chan error, 1)
	go func() {
		err := d.fetch(pctx, a)
		stop() // a failed fetcher ends this pull
		fetched <- err
	}()
	go a.held.keepAlive(pctx, d.cfg.AckWait.Duration/3)
	for {
		rt, msg, err := d.next(pctx, a)
		if err != nil {
			break
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if isBatchLine(msg) {
				d.handleBatchLine(work, a, msg, rt)
				return
			}
			d.handle(work, a, msg, rt)
		}()
	}
	stop()
	err := <-fetched
	// Hand back what was held but not started; without a connection the
	// NAKs cannot go out and JetStream redelivers after AckWait.
	for _, m := range a.held.drain() {
		_ = m.Nak()
	}
	return err
}

// next waits for a held request and a slot to serve it on. The request
// stays in the held queue (where it is kept alive) until a slot is taken,
// so that it leaves the queue only when it can start at once. The slot is
// taken only once a request is there: an idle dispatcher holds no slot, so
// a slot lent to a gateway's direct lane (lease.go) is not kept from it,
// and a root that left or was ejected meanwhile (an application scaled to
// zero and woken again has a new root) is never used for a stale slot.
func (d *Dispatcher) next(ctx context.Context, a *app) (lease, jetstream.Msg, error) {
	if a.router != nil {
		return d.nextRouted(ctx, a)
	}
	for {
		if err := a.held.wait(ctx); err != nil {
			return lease{}, nil, err
		}
		rt, err := a.pool.acquire(ctx)
		if err != nil {
			return lease{}, nil, err
		}
		if !a.pool.usable(rt) {
			a.pool.release(rt, true, false)
			continue
		}
		// This loop is the only consumer of the held queue: the request
		// it saw is still there.
		msg, err := a.held.pop(ctx)
		if err != nil {
			a.pool.release(rt, true, false)
			return lease{}, nil, err
		}
		return rt, msg, nil
	}
}

// fetch fills the application's held queue from its consumer until ctx
// ends; it returns the error that made a pull request fail.
func (d *Dispatcher) fetch(ctx context.Context, a *app) error {
	for {
		room, err := a.held.space(ctx, d.cfg.Prefetch)
		if err != nil || ctx.Err() != nil {
			return nil //nolint:nilerr // ctx ended: a normal stop
		}
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := a.getConsumer().Fetch(room, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return fmt.Errorf("fetching requests: %w", err)
		}
		for m := range batch.Messages() {
			a.held.push(m)
		}
		cancel()
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("fetching requests: %w", err)
		}
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
		a.backlog.Store(int64(info.NumPending))
		d.m.backlog.WithLabelValues(a.Name).Set(float64(info.NumPending))
		d.m.ackPending.WithLabelValues(a.Name).Set(float64(info.NumAckPending))
	}
}
