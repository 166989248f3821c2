package natsqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

func TestParseLeaseUse(t *testing.T) {
	good, _ := json.Marshal(natsqueue.LeaseUse{Instance: "gw-1", Lease: "d-chat-7", Busy: true})
	u, err := natsqueue.ParseLeaseUse(good)
	if err != nil || u.Instance != "gw-1" || u.Lease != "d-chat-7" || !u.Busy {
		t.Errorf("ParseLeaseUse(%s) = %+v, %v", good, u, err)
	}
	for _, bad := range []string{``, `{`, `{"lease":"l"}`, `{"instance":"gw"}`, `[]`} {
		if _, err := natsqueue.ParseLeaseUse([]byte(bad)); err == nil {
			t.Errorf("ParseLeaseUse(%q) accepted", bad)
		}
	}
}

func TestLeaseUseFresh(t *testing.T) {
	at := time.Unix(1000, 0)
	for _, c := range []struct {
		age  time.Duration
		want bool
	}{
		{0, true},
		{natsqueue.LeaseUseEvery, true},
		{natsqueue.LeaseUseStale - time.Millisecond, true},
		{natsqueue.LeaseUseStale, false},
		{time.Hour, false},
	} {
		if got := natsqueue.LeaseUseFresh(at, at.Add(c.age)); got != c.want {
			t.Errorf("a report %v old: fresh %v, want %v", c.age, got, c.want)
		}
	}
}

// TestLeaseUseIsNotStored: the use reports are core NATS only: the request
// stream captures no report (a report is never a request, and never
// wakes anything).
func TestLeaseUseIsNotStored(t *testing.T) {
	srv, err := dataplanetest.StartNATS(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := natsqueue.Names{Orchestra: "o"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := natsqueue.Provision(ctx, js, natsqueue.StreamSpec{Names: names, Replicas: 1, MaxAge: time.Hour, Duplicates: time.Minute, DeadLetterMaxAge: time.Hour},
		[]natsqueue.ConsumerSpec{{App: "chat", AckWait: 30 * time.Second, MaxAckPending: 10}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, names.LeaseUse("chat"), []byte(`{}`)); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("publishing a use report to JetStream: %v; want no stream to capture %s", err, names.LeaseUse("chat"))
	}
	if _, err := js.Publish(ctx, names.Lease("chat"), []byte(`{}`)); err != nil {
		t.Errorf("the stream does not capture lease requests (%s): %v", names.Lease("chat"), err)
	}
}
