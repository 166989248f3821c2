package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
	"github.com/model-orchestra/operator/internal/sim"
)

// dataPlane runs a real dispatcher (with its lifecycle) and a simulator
// engine behind the fake cluster's root Service.
func (e *env) dataPlane(cfgLC func(*dispatch.Config)) (*natsqueue.Client, *prometheus.Registry) {
	e.t.Helper()
	return e.dataPlaneWith(dataplanetest.FastSim(), cfgLC)
}

// dataPlaneWith is dataPlane with the simulator configured by simCfg.
func (e *env) dataPlaneWith(simCfg sim.Config, cfgLC func(*dispatch.Config)) (*natsqueue.Client, *prometheus.Registry) {
	e.t.Helper()
	engine, err := dataplanetest.StartEngine(simCfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(engine.Close)
	u, _ := url.Parse(engine.URL)
	e.c.engine = u.Host
	e.c.slice(true)

	lc := appConfig(nil)
	cfg := dispatch.Default()
	cfg.Orchestra, cfg.Namespace, cfg.NATS.URL = orch, ns, e.srv.ClientURL()
	cfg.Apps = []dispatch.App{{Name: app, Service: root, PortName: "http", Port: 1, MaxConcurrency: 8}}
	cfg.Lifecycle = &lc
	cfg.AckWait = metav1.Duration{Duration: 5 * time.Second}
	cfg.HeartbeatInterval = metav1.Duration{Duration: 200 * time.Millisecond}
	if cfgLC != nil {
		cfgLC(&cfg)
	}
	nc, err := nats.Connect(e.srv.ClientURL())
	if err != nil {
		e.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d, err := dispatch.New(cfg, nc, slog.New(slog.NewTextHandler(testWriter{e.t}, nil)), dispatch.WithKubernetes(e.c.cs), dispatch.WithRegistry(reg))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done; nc.Close() })

	qc := natsqueue.DefaultClientConfig()
	qc.Orchestra = orch
	cnc, err := nats.Connect(e.srv.ClientURL())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cnc.Close)
	client, err := natsqueue.NewClient(cnc, qc, slog.New(slog.DiscardHandler))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(client.Close)
	return client, reg
}

// sum adds up every series of a metric family in reg.
func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return counter(t, reg, name, nil)
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// TestRequestsAtZeroAreAnsweredOnce sends concurrent requests, half
// streamed, to an application at zero pods through a real dispatcher: the
// first wakes it, every one is answered once and completely, none is
// delivered more than once, and no delivery fails.
func TestRequestsAtZeroAreAnsweredOnce(t *testing.T) {
	e := newEnv(t, 1)
	client, reg := e.dataPlane(nil)
	eventually(t, 10*time.Second, e.atReplicas(0))
	eventually(t, 10*time.Second, e.inState(v1alpha1.LifecycleZero))

	const n = 64
	if err := sendBatch(client, "job", n); err != nil {
		t.Fatalf("requests sent while the application was at zero were lost or failed:\n%v", err)
	}
	// One wake for all of them (the application may be idle again by now).
	if st := e.state(); st.Wakes != 1 || st.LastWake == nil || st.LastWake.RequestsWaiting == 0 {
		t.Errorf("%d wakes, last %+v; want 1 wake that found the requests waiting", st.Wakes, st.LastWake)
	}
	ci := e.consumer()
	if ci.NumRedelivered != 0 || ci.Delivered.Consumer != n {
		t.Errorf("consumer delivered %d times with %d redelivered, want each of the %d requests delivered once", ci.Delivered.Consumer, ci.NumRedelivered, n)
	}
	if f := sum(t, reg, "orchestra_dispatcher_failed_total"); f != 0 {
		t.Errorf("%v failed deliveries while waking, want 0", f)
	}
	if c := sum(t, reg, "orchestra_lifecycle_queue_wait_seconds"); c != n {
		t.Errorf("%v queue waits observed, want %d", c, n)
	}
	// The first answer may go out before the dispatcher hears of the wake
	// from the lifecycle bucket; it is then recorded once the state
	// arrives.
	eventually(t, 5*time.Second, func() error {
		if stageCount(t, reg, "first_token") == 0 {
			return errors.New("no first_token stage of the wake observed")
		}
		return nil
	})
	if c := stageCount(t, reg, "first_token"); c != 1 {
		t.Errorf("%v first_token stages observed, want 1 (the first answer of the wake)", c)
	}
	// The leader's dispatch stage: its cache showing the root serving ->
	// the gate open, once for the wake.
	if c := stageCount(t, reg, "dispatch"); c != 1 {
		t.Errorf("%v dispatch stages observed, want 1 (the wake's gate opening)", c)
	}
	firstToken(t, e, 0)
}

// firstToken waits for the last wake's firstTokenSeconds, which the
// dispatcher that answered first hands to the leader, and checks that it
// is at least min seconds (and no more than the test ran).
func firstToken(t *testing.T, e *env, min float64) {
	t.Helper()
	var lw *v1alpha1.WakeStatus
	eventually(t, 5*time.Second, func() error {
		if lw = e.state().LastWake; lw == nil || lw.FirstTokenSeconds == "" {
			return fmt.Errorf("lastWake %+v has no firstTokenSeconds", lw)
		}
		return nil
	})
	secs, err := strconv.ParseFloat(lw.FirstTokenSeconds, 64)
	if err != nil || secs < min || secs > 30 {
		t.Errorf("lastWake.firstTokenSeconds %q, want the seconds from the first request to its first token (at least %v)", lw.FirstTokenSeconds, min)
	}
}

// stageCount is the number of observations of one stage of wake_seconds.
func stageCount(t *testing.T, reg *prometheus.Registry, stage string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "orchestra_lifecycle_wake_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == stage {
					return value(m)
				}
			}
		}
	}
	return 0
}

// sendBatch sends n concurrent requests, half streamed, and reads every
// answer to its end; it names each request that failed and how.
func sendBatch(client *natsqueue.Client, prefix string, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			stream := i%2 == 0
			id := fmt.Sprintf("%s-%03d", prefix, i)
			body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"request %d"}],"stream":%v}`, i, stream)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := client.Submit(ctx, queue.Job{ID: id, App: app, Path: "/v1/chat/completions", Body: []byte(body), Stream: stream})
			if err != nil {
				errs[i] = fmt.Errorf("%s: submit: %w", id, err)
				return
			}
			defer func() { _ = r.Close() }()
			status, got, err := readAll(ctx, r)
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("%s (stream %v): %w", id, stream, err)
			case status != 200:
				errs[i] = fmt.Errorf("%s (stream %v): status %d: %s", id, stream, status, got)
			case stream && !strings.Contains(string(got), "data: [DONE]"):
				errs[i] = fmt.Errorf("%s: stream cut: %q", id, got)
			case !stream && !strings.Contains(string(got), `"finish_reason"`):
				errs[i] = fmt.Errorf("%s: incomplete answer: %q", id, got)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestSawToothAcrossScaleDowns sends bursts timed around the moment the
// idle application goes to zero, so that requests arrive while it drains,
// right after it scaled down and while it wakes: none is cut or lost.
func TestSawToothAcrossScaleDowns(t *testing.T) {
	e := newEnv(t, 1)
	client, reg := e.dataPlane(nil)
	zeroAfter := appConfig(nil).Apps[0].ZeroAfter.Duration
	for cycle := range 8 {
		began := time.Now()
		if err := sendBatch(client, fmt.Sprintf("c%d", cycle), 8); err != nil {
			t.Fatalf("cycle %d: requests cut or lost:\n%v", cycle, err)
		}
		t.Logf("cycle %d: 8 requests answered in %v", cycle, time.Since(began).Round(time.Millisecond))
		// Next burst from just before to well after the drain point.
		time.Sleep(zeroAfter - 60*time.Millisecond + time.Duration(cycle)*40*time.Millisecond)
	}
	zero := 0.0
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "orchestra_lifecycle_drains_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && l.GetValue() == "zero" {
						zero += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if zero == 0 || sum(t, reg, "orchestra_lifecycle_wakes_total") == 0 {
		t.Fatalf("no scale to zero (%v) and wake happened during the saw-tooth: the race was not exercised", zero)
	}
	if f := sum(t, reg, "orchestra_dispatcher_failed_total"); f != 0 {
		t.Errorf("%v failed deliveries, want 0", f)
	}
	t.Logf("%v scale-downs to zero, %v drains in all, %v wakes", zero, sum(t, reg, "orchestra_lifecycle_drains_total"), sum(t, reg, "orchestra_lifecycle_wakes_total"))
}

// readAll reads a reply to its end.
func readAll(ctx context.Context, r queue.Reply) (int, []byte, error) {
	status := 0
	var body []byte
	for {
		c, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return status, body, nil
		}
		if err != nil {
			return status, body, err
		}
		if c.Status != 0 {
			status = c.Status
		}
		body = append(body, c.Data...)
	}
}
