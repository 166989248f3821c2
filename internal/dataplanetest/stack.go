package dataplanetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/batch"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/sim"
)

// App is the application the stack serves; Model is its served model name.
const (
	App       = "chat"
	Orchestra = "e2e"
	// APIKey is the gateway's API token.
	APIKey = "sk-e2e-token"
	// OtherAPIKey is a second token (its own files, batches and responses).
	OtherAPIKey = "sk-e2e-other"
)

// StackConfig shapes a data plane under test.
type StackConfig struct {
	Sim        sim.Config
	Dispatcher func(*dispatch.Config)
	Queue      func(*natsqueue.ClientConfig)
	Gateway    func(*gateway.Config)
	// NATSURLs, when set, are the servers of an external NATS (for example
	// a cluster the test runs); otherwise the stack starts its own.
	// Clients connect to them in random order, as in production.
	NATSURLs string
	// GatewayNATS and DispatcherNATS, when set, are the servers the
	// gateways' queue clients and the dispatchers connect to, tried in the
	// order given: a client stays on the first one while it is up, and
	// fails over to the next (or to a server the cluster told it about).
	// They place clients on chosen servers of a cluster.
	GatewayNATS, DispatcherNATS string

	// BatchNow, when set, is the clock of the gateways' batch drivers
	// (tests move it past a batch's completion window).
	BatchNow func() time.Time
	// NoBatchDriver: the stack's first gateway drives no batches (tests
	// start and kill gateways of their own with StartGatewayProcess).
	NoBatchDriver bool

	Log *slog.Logger
}

// Stack is a whole data plane in one process: NATS with JetStream, an
// engine simulator, dispatchers, the queue client and the gateway.
type Stack struct {
	NATS    *server.Server
	Engine  *Engine
	Queue   *natsqueue.Client
	Gateway *httptest.Server
	// GatewayOps serves the first gateway's /metrics.
	GatewayOps http.Handler

	dir      string
	port     int
	urls     string // the NATS servers, comma-separated
	cfg      StackConfig
	qcfg     natsqueue.ClientConfig
	gateways int
	dispCfg  dispatch.Config
	log      *slog.Logger
	closers  []func()
}

// StartStack starts a data plane; Close stops it.
func StartStack(cfg StackConfig) (_ *Stack, err error) {
	s := &Stack{log: cfg.Log}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.dir, err = os.MkdirTemp("", "orchestra-nats-"); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { _ = os.RemoveAll(s.dir) })
	s.urls = cfg.NATSURLs
	if s.urls == "" {
		if s.NATS, err = StartNATS(s.dir, -1); err != nil {
			return nil, err
		}
		s.port = Port(s.NATS)
		s.closers = append(s.closers, func() { s.NATS.Shutdown() })
		s.urls = s.NATS.ClientURL()
	}
	if s.Engine, err = StartEngine(cfg.Sim); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, s.Engine.Close)

	s.dispCfg = dispatch.Default()
	s.dispCfg.Orchestra = Orchestra
	s.dispCfg.NATS.URL = s.urls
	s.dispCfg.Apps = []dispatch.App{{Name: App, Endpoints: []string{s.Engine.URL}, MaxConcurrency: 256}}
	s.dispCfg.AckWait = metav1.Duration{Duration: 3 * time.Second}
	s.dispCfg.HeartbeatInterval = metav1.Duration{Duration: 200 * time.Millisecond}
	s.dispCfg.RetryDelay = metav1.Duration{Duration: 20 * time.Millisecond}
	s.dispCfg.Prefetch = 64
	s.dispCfg.MaxAckPending = 10000
	if cfg.Dispatcher != nil {
		cfg.Dispatcher(&s.dispCfg)
	}

	qcfg := natsqueue.DefaultClientConfig()
	qcfg.Orchestra = Orchestra
	qcfg.Instance = "gw0"
	qcfg.StallTimeout = 3 * time.Second
	qcfg.RedeliveryWait = 6 * time.Second
	if cfg.Queue != nil {
		cfg.Queue(&qcfg)
	}
	gwURLs, gwOpts := s.natsFor(cfg.GatewayNATS)
	if s.Queue, err = natsqueue.Connect(gwURLs, qcfg, s.log, gwOpts...); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, s.Queue.Close)

	gp, err := s.startGateway(cfg, s.Queue, !cfg.NoBatchDriver)
	if err != nil {
		return nil, err
	}
	s.Gateway, s.GatewayOps = gp.Server, gp.Ops
	s.cfg, s.qcfg = cfg, qcfg
	return s, nil
}

// natsFor returns the servers a client connects to and how: pinned, when
// set, in its order; else the stack's servers in random order.
func (s *Stack) natsFor(pinned string) (string, []nats.Option) {
	opts := []nats.Option{nats.ReconnectWait(50 * time.Millisecond)}
	if pinned == "" {
		return s.urls, opts
	}
	return pinned, append(opts, nats.DontRandomize())
}

// StartGateway starts another gateway, with its own queue client (a
// gateway instance of its own), in front of the same queue.
func (s *Stack) StartGateway() (*httptest.Server, error) {
	qcfg := s.qcfg
	s.gateways++
	qcfg.Instance = fmt.Sprintf("gw%d", s.gateways)
	urls, opts := s.natsFor(s.cfg.GatewayNATS)
	q, err := natsqueue.Connect(urls, qcfg, s.log, opts...)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, q.Close)
	gp, err := s.startGateway(s.cfg, q, true)
	if err != nil {
		return nil, err
	}
	return gp.Server, nil
}

// GatewayProcess is a gateway with its own queue client and batch driver,
// as one gateway pod.
type GatewayProcess struct {
	Server *httptest.Server
	// Ops serves its /metrics.
	Ops  http.Handler
	kill func()
}

// Kill stops the gateway abruptly: its NATS connection and its clients'
// connections drop, its batch driver stops wherever it was.
func (g *GatewayProcess) Kill() { g.kill() }

// StartGatewayProcess starts another gateway (instance gw<n>) that Kill
// stops as a process dies.
func (s *Stack) StartGatewayProcess() (*GatewayProcess, error) {
	qcfg := s.qcfg
	s.gateways++
	qcfg.Instance = fmt.Sprintf("gw%d", s.gateways)
	urls, opts := s.natsFor(s.cfg.GatewayNATS)
	q, err := natsqueue.Connect(urls, qcfg, s.log, opts...)
	if err != nil {
		return nil, err
	}
	gp, err := s.startGateway(s.cfg, q, true)
	if err != nil {
		q.Close()
		return nil, err
	}
	var once sync.Once
	stop := gp.kill
	gp.kill = func() {
		once.Do(func() {
			q.Close()
			gp.Server.CloseClientConnections()
			stop()
		})
	}
	s.closers = append(s.closers, gp.kill)
	return gp, nil
}

func (s *Stack) startGateway(cfg StackConfig, q *natsqueue.Client, driveBatches bool) (*GatewayProcess, error) {
	gcfg := gateway.Default()
	gcfg.Models = []gateway.ModelConfig{{Name: cfg.Sim.Model, App: App}}
	gcfg.Limits.Default = gateway.Limits{}
	gcfg.Log.AccessLog = false
	if cfg.Gateway != nil {
		cfg.Gateway(&gcfg)
	}
	tokens := gateway.NewStaticTokens(gateway.NewTokenHasher(nil), map[string]*gateway.Principal{
		APIKey:      {Name: "e2e"},
		OtherAPIKey: {Name: "other"},
	})
	responses := q.ResponseStore(gcfg.Responses.Retention.Duration, gcfg.Responses.Replicas)
	batches := batch.NewService(q.JetStream(), batch.Config{Orchestra: Orchestra, Replicas: gcfg.Responses.Replicas,
		Interval: 100 * time.Millisecond, Now: cfg.BatchNow, Log: s.log})
	g, err := gateway.New(gcfg, q, gateway.Options{Logger: s.log, Tokens: tokens, Responses: responses, Batches: batches})
	if err != nil {
		return nil, fmt.Errorf("building gateway: %w", err)
	}
	bctx, stopBatches := context.WithCancel(context.Background())
	batchesDone := make(chan struct{})
	if driveBatches {
		go func() { batches.Run(bctx); close(batchesDone) }()
	} else {
		close(batchesDone)
	}
	srv := httptest.NewServer(g.Handler())
	var once sync.Once
	stop := func() { once.Do(func() { stopBatches(); <-batchesDone; srv.Close() }) }
	s.closers = append(s.closers, stop)
	return &GatewayProcess{Server: srv, Ops: g.OpsHandler(), kill: stop}, nil
}

// The names of the NATS connections, as a server lists them (its connz):
// the stack's dispatchers', and the one natsqueue.Connect gives a gateway's.
const (
	DispatcherConnName = "orchestra-dispatcher"
	GatewayConnName    = "orchestra-gateway"
)

// DispatcherConfig returns the configuration dispatchers start with.
func (s *Stack) DispatcherConfig() dispatch.Config { return s.dispCfg }

// Dispatcher is a running dispatcher.
type Dispatcher struct {
	*dispatch.Dispatcher
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

// StartDispatcher starts a dispatcher on its own connection and waits until
// it is ready.
func (s *Stack) StartDispatcher() (*Dispatcher, error) {
	urls, opts := s.natsFor(s.cfg.DispatcherNATS)
	nc, err := nats.Connect(urls, append(opts, nats.Name(DispatcherConnName), nats.MaxReconnects(-1))...)
	if err != nil {
		return nil, err
	}
	d, err := dispatch.New(s.dispCfg, nc, s.log)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rd := &Dispatcher{Dispatcher: d, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { rd.done <- d.Run(ctx) }()
	// Generous: on a loaded machine (CI beside other work) provisioning
	// JetStream's file store has taken several seconds.
	deadline := time.Now().Add(30 * time.Second)
	for !d.Ready() {
		select {
		case err := <-rd.done:
			nc.Close()
			return nil, fmt.Errorf("dispatcher stopped before it was ready: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			if err := rd.Stop(); err != nil {
				return nil, fmt.Errorf("dispatcher did not become ready within 30 s: %w", err)
			}
			return nil, errors.New("dispatcher did not become ready within 30 s (its run had no error)")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.closers = append(s.closers, func() { _ = rd.Stop() }) // teardown: best effort
	return rd, nil
}

// InFlight is the number of requests the dispatcher serves or holds.
func (d *Dispatcher) InFlight() int {
	l, _ := d.Load(App)
	return l.InFlight + l.Held
}

// Stop shuts the dispatcher down gracefully.
func (d *Dispatcher) Stop() error {
	d.cancel()
	err := <-d.done
	d.done <- err
	d.nc.Close()
	return err
}

// Kill stops the dispatcher abruptly: its connection drops first, as when
// the process dies, so nothing it holds is acknowledged or handed back.
func (d *Dispatcher) Kill() {
	d.nc.Close()
	d.cancel()
}

// RestartNATS shuts the server down and starts it again on the same port
// and store directory.
func (s *Stack) RestartNATS() error {
	s.NATS.Shutdown()
	s.NATS.WaitForShutdown()
	srv, err := StartNATS(s.dir, s.port)
	if err != nil {
		return err
	}
	s.NATS = srv
	return nil
}

// Close stops everything, last started first.
func (s *Stack) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// Queued returns the number of requests stored in the request stream.
func (s *Stack) Queued(ctx context.Context) (int, error) {
	nc, err := nats.Connect(s.urls)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	st, err := js.Stream(ctx, natsqueue.Names{Orchestra: Orchestra}.Stream())
	if err != nil {
		return 0, err
	}
	return int(st.CachedInfo().State.Msgs), nil
}
