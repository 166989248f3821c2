package dispatch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
	"github.com/model-orchestra/operator/internal/sim"
)

const app = "chat"

type env struct {
	t      *testing.T
	srv    *server.Server
	engine *dataplanetest.Engine
	cfg    dispatch.Config
}

func newEnv(t *testing.T, simCfg sim.Config) *env {
	t.Helper()
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	engine, err := dataplanetest.StartEngine(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(engine.Close)
	cfg := dispatch.Default()
	cfg.Orchestra = "test"
	cfg.NATS.URL = srv.ClientURL()
	cfg.Apps = []dispatch.App{{Name: app, Endpoints: []string{engine.URL}, MaxConcurrency: 8}}
	cfg.AckWait = metav1.Duration{Duration: 2 * time.Second}
	cfg.HeartbeatInterval = metav1.Duration{Duration: 100 * time.Millisecond}
	cfg.RetryDelay = metav1.Duration{Duration: 10 * time.Millisecond}
	cfg.ShutdownTimeout = metav1.Duration{Duration: 5 * time.Second}
	return &env{t: t, srv: srv, engine: engine, cfg: cfg}
}

func (e *env) connect() *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

// dispatcher runs a dispatcher on its own connection; kill stops it
// abruptly (connection first, as if the process died).
func (e *env) dispatcher() (kill func()) {
	e.t.Helper()
	nc := e.connect()
	d, err := dispatch.New(e.cfg, nc, testLogger(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	eventually(e.t, 10*time.Second, holds("dispatcher ready", d.Ready))
	stopped := false
	stop := func(abrupt bool) {
		if stopped {
			return
		}
		stopped = true
		if abrupt {
			nc.Close()
		}
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("dispatcher: %v", err)
		}
	}
	e.t.Cleanup(func() { stop(false) })
	return func() { stop(true) }
}

func (e *env) client(mut func(*natsqueue.ClientConfig)) *natsqueue.Client {
	e.t.Helper()
	cfg := natsqueue.DefaultClientConfig()
	cfg.Orchestra = "test"
	cfg.StallTimeout = 2 * time.Second
	if mut != nil {
		mut(&cfg)
	}
	c, err := natsqueue.NewClient(e.connect(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c
}

func (e *env) stream() jetstream.Stream {
	e.t.Helper()
	js, err := jetstream.New(e.connect())
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), natsqueue.Names{Orchestra: "test"}.Stream())
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func chatJob(id, prompt string, stream bool) queue.Job {
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}],"stream":%v}`, prompt, stream)
	return queue.Job{ID: id, App: app, Path: "/v1/chat/completions", Body: []byte(body), Stream: stream}
}

// collect reads a reply to the end.
func collect(ctx context.Context, r queue.Reply) (status int, body []byte, chunks int, err error) {
	for {
		c, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return status, body, chunks, nil
		}
		if err != nil {
			return status, body, chunks, err
		}
		if chunks == 0 {
			status = c.Status
		} else if c.Status != 0 {
			return status, body, chunks, fmt.Errorf("status on chunk %d", chunks)
		}
		chunks++
		body = append(body, c.Data...)
	}
}

// direct asks the engine itself, for the expected answer.
func direct(t *testing.T, e *env, job queue.Job) []byte {
	t.Helper()
	res, err := http.Post(e.engine.URL+job.Path, "application/json", bytes.NewReader(job.Body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }() // read-only body
	b, _ := io.ReadAll(res.Body)
	return b
}

// withoutIDs blanks the parts of an answer that differ per request.
func withoutIDs(b []byte) string {
	s := string(b)
	var out strings.Builder
	for {
		i := strings.Index(s, `"id":"`)
		if i < 0 {
			out.WriteString(s)
			break
		}
		out.WriteString(s[:i+6])
		s = s[i+6:]
		s = s[strings.IndexByte(s, '"'):]
	}
	r := out.String()
	for {
		i := strings.Index(r, `"created":`)
		if i < 0 {
			return r
		}
		j := i + len(`"created":`)
		k := j
		for k < len(r) && r[k] >= '0' && r[k] <= '9' {
			k++
		}
		r = r[:i] + `"created_":0` + r[k:]
	}
}

func TestAnswersArriveCompleteAndInOrder(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 40
	simCfg.InterTokenLatency = time.Millisecond
	e := newEnv(t, simCfg)
	e.dispatcher()
	c := e.client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			job := chatJob(fmt.Sprintf("job-order-%v", stream), "tell me a story", stream)
			r, err := c.Submit(ctx, job)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.Close() }()
			status, body, chunks, err := collect(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if status != http.StatusOK {
				t.Errorf("status = %d", status)
			}
			if want := direct(t, e, job); withoutIDs(body) != withoutIDs(want) {
				t.Errorf("answer through the queue differs from the engine's:\n got %s\nwant %s", body, want)
			}
			if !stream && chunks != 1 {
				t.Errorf("a non-streamed answer came in %d chunks, want 1", chunks)
			}
		})
	}
}

func TestEngineErrorsPassThrough(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	e.dispatcher()
	c := e.client(nil)
	ctx := context.Background()
	job := chatJob("job-bad-model", "x", false)
	job.Body = []byte(`{"model":"other","messages":[{"role":"user","content":"x"}]}`)
	r, err := c.Submit(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	status, body, _, err := collect(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusNotFound || !strings.Contains(string(body), "does not exist") {
		t.Errorf("got %d %s, want the engine's 404", status, body)
	}
	if n := e.engine.Requests.Load(); n != 1 {
		t.Errorf("engine saw %d requests, want 1 (a 404 is an answer, not a failure)", n)
	}
}

func TestDuplicateJobIDsRunOnce(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	// Provision without serving, so both submissions wait in the queue.
	kill := e.dispatcher()
	kill()
	a, b := e.client(nil), e.client(nil)
	ctx := context.Background()
	job := chatJob("job-dup", "once", false)
	ra, err := a.Submit(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ra.Close() }()
	rb, err := b.Submit(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rb.Close() }()
	info, err := e.stream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages after a duplicate submit, want 1", info.State.Msgs)
	}
	e.dispatcher()
	if _, _, _, err := collect(ctx, ra); err != nil {
		t.Fatal(err)
	}
	if n := e.engine.Requests.Load(); n != 1 {
		t.Errorf("engine ran the job %d times, want 1", n)
	}
}

func TestSlowGenerationOutlivesAckWait(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 30
	simCfg.InterTokenLatency = 200 * time.Millisecond // 6s, three times AckWait
	e := newEnv(t, simCfg)
	e.dispatcher()
	c := e.client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Submit(ctx, chatJob("job-slow", "take your time", false))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	if _, body, _, err := collect(ctx, r); err != nil || !bytes.Contains(body, []byte(`"completion_tokens":30`)) {
		t.Fatalf("slow answer: %v %s", err, body)
	}
	if n := e.engine.Requests.Load(); n != 1 {
		t.Errorf("engine saw %d requests, want 1: a slow generation must not be redelivered", n)
	}
}

func TestRepeatedFailuresDeadLetter(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.Faults.ErrorRate = 1
	simCfg.Faults.ErrorStatus = http.StatusServiceUnavailable
	e := newEnv(t, simCfg)
	e.cfg.MaxDeliver = 3
	e.cfg.Health.FailureThreshold = 100
	e.dispatcher()
	c := e.client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.Submit(ctx, chatJob("job-doomed", "x", true))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	if _, _, _, err := collect(ctx, r); !errors.Is(err, queue.ErrDeadLettered) {
		t.Fatalf("err = %v, want ErrDeadLettered", err)
	}
	if n := e.engine.Requests.Load(); n != 3 {
		t.Errorf("engine saw %d attempts, want maxDeliver = 3", n)
	}
	js, _ := jetstream.New(e.connect())
	dlq, err := js.Stream(ctx, natsqueue.Names{Orchestra: "test"}.DeadLetterStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := dlq.GetLastMsgForSubject(ctx, natsqueue.Names{Orchestra: "test"}.DeadLetter(app))
	if err != nil {
		t.Fatalf("no dead letter: %v", err)
	}
	if m.Header.Get(natsqueue.HeaderJobID) != "job-doomed" {
		t.Errorf("dead letter is for job %q", m.Header.Get(natsqueue.HeaderJobID))
	}
	eventually(t, 5*time.Second, holds("request stream to empty", func() bool {
		info, err := e.stream().Info(ctx)
		return err == nil && info.State.Msgs == 0
	}))
}

func TestCloseCancelsTheEngineRequest(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 1000
	simCfg.InterTokenLatency = 20 * time.Millisecond
	e := newEnv(t, simCfg)
	e.dispatcher()
	c := e.client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.Submit(ctx, chatJob("job-cancel", "long", true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if e.engine.Active.Load() != 1 {
		t.Fatalf("engine runs %d requests, want 1", e.engine.Active.Load())
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, holds("the engine request to be cancelled", func() bool { return e.engine.Active.Load() == 0 }))
	eventually(t, 5*time.Second, holds("the job to leave the stream", func() bool {
		info, err := e.stream().Info(ctx)
		return err == nil && info.State.Msgs == 0
	}))
	if n := e.engine.Requests.Load(); n != 1 {
		t.Errorf("engine saw %d requests, want 1: a cancelled job must not be retried", n)
	}
}

func TestCloseRemovesAQueuedJob(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	kill := e.dispatcher()
	kill()
	c := e.client(nil)
	ctx := context.Background()
	r, err := c.Submit(ctx, chatJob("job-never", "x", false))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	eventually(t, 5*time.Second, holds("the queued job to be removed", func() bool {
		info, err := e.stream().Info(ctx)
		return err == nil && info.State.Msgs == 0
	}))
	e.dispatcher()
	// A wrongly kept job would reach the engine within a pull or two.
	consistently(t, 500*time.Millisecond, func() error {
		if n := e.engine.Requests.Load(); n != 0 {
			return fmt.Errorf("engine ran %d cancelled jobs", n)
		}
		return nil
	})
}

func TestDispatcherDeathMidAnswer(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 50
	simCfg.InterTokenLatency = 20 * time.Millisecond
	e := newEnv(t, simCfg)

	t.Run("non-streamed completes on redelivery", func(t *testing.T) {
		kill := e.dispatcher()
		c := e.client(func(cfg *natsqueue.ClientConfig) { cfg.StallTimeout = 5 * time.Second })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		job := chatJob("job-survivor", "survive", false)
		r, err := c.Submit(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.Close() }()
		eventually(t, 5*time.Second, holds("the engine to start", func() bool { return e.engine.Active.Load() == 1 }))
		kill()
		defer e.dispatcher()()
		status, body, _, err := collect(ctx, r)
		if err != nil || status != http.StatusOK {
			t.Fatalf("after redelivery: %d %v", status, err)
		}
		if want := direct(t, e, job); withoutIDs(body) != withoutIDs(want) {
			t.Errorf("answer after redelivery differs:\n got %s\nwant %s", body, want)
		}
	})

	t.Run("streamed fails cleanly after partial output", func(t *testing.T) {
		kill := e.dispatcher()
		c := e.client(func(cfg *natsqueue.ClientConfig) { cfg.StallTimeout = 5 * time.Second })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := c.Submit(ctx, chatJob("job-partial", "partial", true))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.Close() }()
		if _, err := r.Next(ctx); err != nil {
			t.Fatal(err)
		}
		kill()
		defer e.dispatcher()()
		_, _, _, err = collect(ctx, r)
		if !errors.Is(err, queue.ErrRetriedAfterPartial) {
			t.Fatalf("err = %v, want ErrRetriedAfterPartial", err)
		}
	})
}

func TestNoDispatcherFailsInsteadOfHanging(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	kill := e.dispatcher()
	kill()
	c := e.client(func(cfg *natsqueue.ClientConfig) { cfg.StallTimeout = 500 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Submit(ctx, chatJob("job-orphan", "x", false))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	// The application's last dispatcher is gone: the waiting request fails
	// with the specific, non-retryable ErrNotServed (the gateway's 503
	// model_not_served), not a retryable ErrUnavailable.
	if _, _, _, err := collect(ctx, r); !errors.Is(err, queue.ErrNotServed) {
		t.Fatalf("err = %v, want ErrNotServed", err)
	}
}

func TestSubmitWithoutStreamIsUnavailable(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	c := e.client(func(cfg *natsqueue.ClientConfig) { cfg.SubmitTimeout = time.Second })
	if _, err := c.Submit(context.Background(), chatJob("job-nowhere", "x", false)); !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}

func TestRootsFollowEndpointSlices(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	ready := true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "chat-root-abc", Namespace: "ns",
			Labels: map[string]string{discoveryv1.LabelServiceName: "chat-root"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	other := slice.DeepCopy()
	other.Name, other.Labels[discoveryv1.LabelServiceName] = "unrelated", "unrelated"
	other.Endpoints[0].Addresses = []string{"10.9.9.9"}
	cs := fake.NewClientset(slice, other)
	cfg := e.cfg
	cfg.Namespace = "ns"
	cfg.Apps = []dispatch.App{{Name: app, Service: "chat-root", Port: 8000, MaxConcurrency: 1}}
	d, err := dispatch.New(cfg, e.connect(), testLogger(t), dispatch.WithKubernetes(cs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = d.Run(ctx) }()
	roots := func(want ...string) func() bool {
		return func() bool { return slices.Equal(d.Roots(app), want) }
	}
	eventually(t, 10*time.Second, holds("the slice's endpoint to become a root", roots("http://10.0.0.1:8000")))

	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}})
	if _, err := cs.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holds("a scaled-up root", roots("http://10.0.0.1:8000", "http://10.0.0.2:8000")))

	if err := cs.DiscoveryV1().EndpointSlices("ns").Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holds("roots to go with their slice", roots()))
}

func TestGracefulShutdown(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 20
	simCfg.InterTokenLatency = 50 * time.Millisecond // one second per answer

	t.Run("in-flight requests finish", func(t *testing.T) {
		e := newEnv(t, simCfg)
		stop := e.graceful()
		c := e.client(nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r, err := c.Submit(ctx, chatJob("job-finish", "finish me", false))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.Close() }()
		eventually(t, 5*time.Second, holds("the engine to start", func() bool { return e.engine.Active.Load() == 1 }))
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
			t.Fatalf("request during shutdown: %d %v", status, err)
		}
		<-stopped
		if n := e.engine.Requests.Load(); n != 1 {
			t.Errorf("engine saw %d requests, want 1", n)
		}
	})

	t.Run("unfinished requests are handed back at once", func(t *testing.T) {
		e := newEnv(t, simCfg)
		e.cfg.ShutdownTimeout = metav1.Duration{Duration: 100 * time.Millisecond}
		e.cfg.AckWait = metav1.Duration{Duration: time.Minute} // redelivery must not wait for it
		stop := e.graceful()
		c := e.client(func(cfg *natsqueue.ClientConfig) { cfg.StallTimeout = 10 * time.Second })
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r, err := c.Submit(ctx, chatJob("job-handback", "hand me back", false))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.Close() }()
		eventually(t, 5*time.Second, holds("the engine to start", func() bool { return e.engine.Active.Load() == 1 }))
		stop()
		e.dispatcher()
		began := time.Now()
		if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
			t.Fatalf("handed-back request: %d %v", status, err)
		}
		if took := time.Since(began); took > 10*time.Second {
			t.Errorf("redelivery took %v; a NAK should make it prompt", took)
		}
		if n := e.engine.Requests.Load(); n != 2 {
			t.Errorf("engine saw %d requests, want the interrupted one and its retry", n)
		}
	})
}

// graceful runs a dispatcher and returns a function that shuts it down the
// way SIGTERM does.
func (e *env) graceful() (stop func()) {
	e.t.Helper()
	d, err := dispatch.New(e.cfg, e.connect(), testLogger(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	eventually(e.t, 10*time.Second, holds("dispatcher ready", d.Ready))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("dispatcher: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func TestServingResumesWhenTheConsumerIsDeleted(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	e.dispatcher()
	c := e.client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(e.connect())
	if err != nil {
		t.Fatal(err)
	}
	names := natsqueue.Names{Orchestra: "test"}
	if err := js.DeleteConsumer(ctx, names.Stream(), names.Consumer(app)); err != nil {
		t.Fatal(err)
	}
	r, err := c.Submit(ctx, chatJob("job-after-delete", "still there?", false))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
		t.Fatalf("after the consumer was deleted: %d %v", status, err)
	}
}

func TestMetricsTellWhatHappened(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	reg := prometheus.NewRegistry()
	d, err := dispatch.New(e.cfg, e.connect(), testLogger(t), dispatch.WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = d.Run(ctx) }()
	eventually(t, 10*time.Second, holds("dispatcher ready", d.Ready))
	c := e.client(nil)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	r, err := c.Submit(rctx, chatJob("job-metrics", "count me", false))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := collect(rctx, r); err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	root := e.engine.URL
	want := fmt.Sprintf(`
# HELP orchestra_dispatcher_completed_total Requests answered and acknowledged, by engine status code.
# TYPE orchestra_dispatcher_completed_total counter
orchestra_dispatcher_completed_total{app="chat",code="200"} 1
# HELP orchestra_dispatcher_dispatched_total Deliveries sent to an engine.
# TYPE orchestra_dispatcher_dispatched_total counter
orchestra_dispatcher_dispatched_total{app="chat"} 1
# HELP orchestra_dispatcher_root_healthy 1 when an engine root receives traffic, 0 while ejected or gone.
# TYPE orchestra_dispatcher_root_healthy gauge
orchestra_dispatcher_root_healthy{app="chat",root=%q} 1
# HELP orchestra_dispatcher_inflight Requests this dispatcher is running on engines.
# TYPE orchestra_dispatcher_inflight gauge
orchestra_dispatcher_inflight{app="chat"} 0
`, root)
	eventually(t, 5*time.Second, holds("the metrics", func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(want),
			"orchestra_dispatcher_completed_total", "orchestra_dispatcher_dispatched_total",
			"orchestra_dispatcher_root_healthy", "orchestra_dispatcher_inflight") == nil
	}))
	if n, err := testutil.GatherAndCount(reg, "orchestra_dispatcher_queue_wait_seconds"); err != nil || n != 1 {
		t.Errorf("queue wait histogram series: %d %v", n, err)
	}
}

// TestTheFirstRequestAfterTheRootsChangedGoesToANewRoot replays a wake:
// the application's root served a request and went away (scaled to zero),
// a new root came up at another address, and the next request must go to
// the new root at its first delivery. An idle dispatcher waits for its next
// request holding a slot on a root; a slot on the root that left sent the
// first request of every wake to a dead address (a dial timeout on real
// pods, then a redelivery).
func TestTheFirstRequestAfterTheRootsChangedGoesToANewRoot(t *testing.T) {
	e := newEnv(t, dataplanetest.FastSim())
	old := e.engine
	fresh, err := dataplanetest.StartEngine(dataplanetest.FastSim())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fresh.Close)
	endpoint := func(engineURL string) ([]discoveryv1.Endpoint, []discoveryv1.EndpointPort) {
		u, err := url.Parse(engineURL)
		if err != nil {
			t.Fatal(err)
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			t.Fatal(err)
		}
		ready, name, p := true, "http", int32(port)
		return []discoveryv1.Endpoint{{Addresses: []string{u.Hostname()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			[]discoveryv1.EndpointPort{{Name: &name, Port: &p}}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "chat-abc", Namespace: "ns",
			Labels: map[string]string{discoveryv1.LabelServiceName: "chat"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	slice.Endpoints, slice.Ports = endpoint(old.URL)
	cs := fake.NewClientset(slice)
	cfg := e.cfg
	cfg.Namespace = "ns"
	cfg.Apps = []dispatch.App{{Name: app, Service: "chat", PortName: "http", Port: 1, MaxConcurrency: 4}}
	reg := prometheus.NewRegistry()
	d, err := dispatch.New(cfg, e.connect(), testLogger(t), dispatch.WithKubernetes(cs), dispatch.WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _ = d.Run(ctx) }()
	eventually(t, 10*time.Second, holds("dispatcher ready", d.Ready))
	c := e.client(nil)
	ask := func(id string) {
		t.Helper()
		r, err := c.Submit(ctx, chatJob(id, "hello", false))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.Close() }()
		if status, _, _, err := collect(ctx, r); err != nil || status != http.StatusOK {
			t.Fatalf("%s: status %d, %v", id, status, err)
		}
	}
	ask("job-before")

	// The old root goes away, a new one comes up elsewhere.
	old.Close()
	slice.Endpoints, slice.Ports = endpoint(fresh.URL)
	if _, err := cs.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, holds("the new root", func() bool { return slices.Equal(d.Roots(app), []string{fresh.URL}) }))
	ask("job-after")

	if n := fresh.Requests.Load(); n != 1 {
		t.Errorf("the new root received %d requests, want 1", n)
	}
	if n, err := testutil.GatherAndCount(reg, "orchestra_dispatcher_failed_total", "orchestra_dispatcher_redelivered_total"); err != nil || n != 0 {
		var b strings.Builder
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if n := mf.GetName(); n == "orchestra_dispatcher_failed_total" || n == "orchestra_dispatcher_redelivered_total" {
				for _, m := range mf.GetMetric() {
					fmt.Fprintf(&b, "  %s%v %v\n", n, m.GetLabel(), m.GetCounter().GetValue())
				}
			}
		}
		t.Errorf("the request after the roots changed was not delivered once (%v):\n%s", err, b.String())
	}
}
