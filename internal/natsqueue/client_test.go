package natsqueue_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
)

// TestSubmitWaitsForTheStreamToAnswer checks that a job submitted while its
// stream has no responder (a NATS cluster electing the stream's leader after
// losing a server, which takes seconds) is queued once the stream answers
// within SubmitTimeout, rather than refused with a 503 after half a second.
func TestSubmitWaitsForTheStreamToAnswer(t *testing.T) {
	c, cfg, leader := submitEnv(t, natsqueue.DefaultClientConfig())

	// No stream yet: publishes find no responder. A stand-in for the
	// stream's new leader answers from 1.5 s on.
	names := natsqueue.Names{Orchestra: "o"}
	elected := time.AfterFunc(1500*time.Millisecond, func() {
		_, _ = leader.Subscribe(names.Request("chat"), func(m *nats.Msg) {
			_ = m.Respond([]byte(`{"stream":"` + names.Stream() + `","seq":7}`))
		})
		_ = leader.Flush()
	})
	defer elected.Stop()

	start := time.Now()
	r, err := c.Submit(context.Background(), queue.Job{ID: "job-1", App: "chat", Path: "/v1/chat/completions", Body: []byte(`{}`)})
	if err != nil {
		t.Fatalf("Submit while the stream had no leader for 1.5 s: %v (after %v); want it queued once the stream answers", err, time.Since(start).Round(time.Millisecond))
	}
	if r == nil {
		t.Fatal("Submit returned no reply")
	}
	if d := time.Since(start); d < 1500*time.Millisecond || d > cfg.SubmitTimeout {
		t.Errorf("Submit returned after %v, want between 1.5s and %v", d, cfg.SubmitTimeout)
	}
}

// TestSubmitOutlivesAPublishLostWithItsServer checks that a publish which
// reached the stream's leader just before that server died (no answer, ever)
// is tried again within SubmitTimeout instead of waiting all of it for the
// lost answer, and that the job is stored once.
func TestSubmitOutlivesAPublishLostWithItsServer(t *testing.T) {
	c, cfg, leader := submitEnv(t, natsqueue.DefaultClientConfig())

	// A stand-in for the stream: the first publish vanishes with its
	// server, the next ones are answered, a repeat with its first sequence.
	names := natsqueue.Names{Orchestra: "o"}
	var (
		mu  sync.Mutex
		ids []string
	)
	if _, err := leader.Subscribe(names.Request("chat"), func(m *nats.Msg) {
		mu.Lock()
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		n := len(ids)
		mu.Unlock()
		if n > 1 {
			_ = m.Respond([]byte(`{"stream":"` + names.Stream() + `","seq":7,"duplicate":` + strconv.FormatBool(n > 2) + `}`))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := leader.Flush(); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	r, err := c.Submit(context.Background(), queue.Job{ID: "job-1", App: "chat", Path: "/v1/chat/completions", Body: []byte(`{}`)})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Submit after its first publish went unanswered: %v (after %v); want it stored by the next attempt", err, took.Round(time.Millisecond))
	}
	if r == nil {
		t.Fatal("Submit returned no reply")
	}
	if took > 3*time.Second {
		t.Errorf("Submit took %v; want the lost publish given up after about a second, not the whole %v", took.Round(time.Millisecond), cfg.SubmitTimeout)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 2 || ids[0] != "job-1" || ids[1] != "job-1" {
		t.Errorf("the stream saw publishes with message IDs %q; want job-1 twice (the lost one and its repeat)", ids)
	}
}

// TestSubmitGivesUpWithTheStreamsLastError checks that a stream that never
// answers fails the submit after SubmitTimeout with ErrUnavailable and a
// message saying so.
func TestSubmitGivesUpWithTheStreamsLastError(t *testing.T) {
	cfg := natsqueue.DefaultClientConfig()
	cfg.SubmitTimeout = 1500 * time.Millisecond
	c, cfg, _ := submitEnv(t, cfg)
	start := time.Now()
	_, err := c.Submit(context.Background(), queue.Job{ID: "job-1", App: "chat", Path: "/v1/chat/completions", Body: []byte(`{}`)})
	took := time.Since(start)
	if !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("Submit with no stream: %v; want queue.ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "did not store it within 1.5s") {
		t.Errorf("Submit error %q does not say how long it waited", err)
	}
	if took < cfg.SubmitTimeout || took > cfg.SubmitTimeout+time.Second {
		t.Errorf("Submit gave up after %v; want about %v", took.Round(time.Millisecond), cfg.SubmitTimeout)
	}
}

// TestSubmitRefusesAnApplicationNoDispatcherServes checks that a job for an
// application no dispatcher has announced for StallTimeout is refused at
// once with queue.ErrNotServed (it used to wait StallTimeout and fail with
// a retryable ErrUnavailable), without being queued, and that one
// heartbeat of a dispatcher is enough to queue again.
func TestSubmitRefusesAnApplicationNoDispatcherServes(t *testing.T) {
	cfg := natsqueue.DefaultClientConfig()
	cfg.StallTimeout = 200 * time.Millisecond
	cfg.SubmitTimeout = 300 * time.Millisecond
	c, _, other := submitEnv(t, cfg)
	names := natsqueue.Names{Orchestra: "o"}
	var published sync.WaitGroup
	published.Add(1)
	sub, err := other.Subscribe(names.Request("chat"), func(*nats.Msg) { published.Done() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = other.Flush()

	time.Sleep(300 * time.Millisecond) // longer than StallTimeout since the client started
	start := time.Now()
	_, err = c.Submit(context.Background(), queue.Job{ID: "job-1", App: "chat", Path: "/v1/chat/completions", Body: []byte(`{}`)})
	if !errors.Is(err, queue.ErrNotServed) {
		t.Fatalf("Submit for an application no dispatcher announced: %v; want queue.ErrNotServed", err)
	}
	if errors.Is(err, queue.ErrUnavailable) {
		t.Errorf("the error %v is also ErrUnavailable, which clients retry", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("Submit took %v to refuse; want at once", took)
	}

	// A dispatcher announces the application: the job is published again.
	if err := other.Publish(names.Heartbeat("chat"), nil); err != nil {
		t.Fatal(err)
	}
	_ = other.Flush()
	time.Sleep(50 * time.Millisecond)
	_, err = c.Submit(context.Background(), queue.Job{ID: "job-2", App: "chat", Path: "/v1/chat/completions", Body: []byte(`{}`)})
	if errors.Is(err, queue.ErrNotServed) {
		t.Fatalf("Submit right after a heartbeat: %v", err)
	}
	published.Wait() // the stand-in saw the publish (it does not answer: ErrUnavailable)
}

// submitEnv starts a NATS server without the orchestra's stream and
// connects a client of orchestra "o" with cfg, and a second connection
// that tests use as a stand-in for the stream's leader.
func submitEnv(t *testing.T, cfg natsqueue.ClientConfig) (*natsqueue.Client, natsqueue.ClientConfig, *nats.Conn) {
	t.Helper()
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg.Orchestra = "o"
	c, err := natsqueue.Connect(srv.ClientURL(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	leader, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leader.Close)
	return c, cfg, leader
}
