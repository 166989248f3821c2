package natsqueue_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// TestResponseStoreIsDurableAndExpires stores a response, restarts NATS on
// the same storage, reads it back, deletes one and lets another expire.
func TestResponseStoreIsDurableAndExpires(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	srv, err := dataplanetest.StartNATS(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	cfg := natsqueue.DefaultClientConfig()
	cfg.Orchestra = "o"
	c, err := natsqueue.Connect(srv.ClientURL(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := c.ResponseStore(2*time.Second, 1)
	if v, err := s.Get(ctx, "r.a.resp_1"); err != nil || v != nil {
		t.Fatalf("Get of a key never stored = %q, %v; want nil, nil", v, err)
	}
	for _, k := range []string{"r.a.resp_1", "r.a.resp_2"} {
		if err := s.Put(ctx, k, []byte(`{"k":"`+k+`"}`)); err != nil {
			t.Fatal(err)
		}
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	if srv, err = dataplanetest.StartNATS(dir, port); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	v, err := s.Get(ctx, "r.a.resp_1") // the client reconnects within its retries
	for i := 0; err != nil && i < 40; i++ {
		time.Sleep(100 * time.Millisecond)
		v, err = s.Get(ctx, "r.a.resp_1")
	}
	if err != nil || string(v) != `{"k":"r.a.resp_1"}` {
		t.Fatalf("Get after a NATS restart = %q, %v", v, err)
	}
	if err := s.Delete(ctx, "r.a.resp_1"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, "r.a.resp_1"); err != nil || v != nil {
		t.Errorf("Get after Delete = %q, %v; want nil, nil", v, err)
	}
	time.Sleep(3 * time.Second) // past the 2 s retention
	if v, err := s.Get(ctx, "r.a.resp_2"); err != nil || v != nil {
		t.Errorf("Get past the retention = %q, %v; want nil, nil", v, err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	n, _ := strconv.Atoi(p)
	return n
}
