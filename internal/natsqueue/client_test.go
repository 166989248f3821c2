package natsqueue_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/queue"
)

// TestSubmitWaitsForTheStreamToAnswer checks that a job submitted while its
// stream has no responder (a NATS cluster electing the stream's leader after
// losing a server, which takes seconds) is queued once the stream answers
// within SubmitTimeout, rather than refused with a 503 after half a second.
func TestSubmitWaitsForTheStreamToAnswer(t *testing.T) {
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	cfg := natsqueue.DefaultClientConfig()
	cfg.Orchestra = "o"
	c, err := natsqueue.Connect(srv.ClientURL(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// No stream yet: publishes find no responder. A stand-in for the
	// stream's new leader answers from 1.5 s on.
	names := natsqueue.Names{Orchestra: "o"}
	leader, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
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
