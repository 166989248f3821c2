package natsqueue_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// TestWakeProgressKeepsTheLastSentencePerApp: what a dispatcher says on an
// application's wake progress subject is what the gateway's watcher
// returns for that application, and nothing for another.
func TestWakeProgressKeepsTheLastSentencePerApp(t *testing.T) {
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg := natsqueue.DefaultClientConfig()
	cfg.Orchestra = "o"
	c, err := natsqueue.Connect(srv.ClientURL(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w, err := c.WatchWakeProgress()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	names := natsqueue.Names{Orchestra: "o"}
	for _, s := range []string{"pod r-0 is waiting to be scheduled", "pod r-0 is scheduled on node a; starting its containers"} {
		if err := nc.Publish(names.WakeProgress("chat"), []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	deadline := time.Now().Add(5 * time.Second)
	for w.PodProgress("chat") != "pod r-0 is scheduled on node a; starting its containers" {
		if time.Now().After(deadline) {
			t.Fatalf("PodProgress(chat) = %q", w.PodProgress("chat"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.PodProgress("other"); got != "" {
		t.Errorf("PodProgress(other) = %q, want nothing", got)
	}
}
