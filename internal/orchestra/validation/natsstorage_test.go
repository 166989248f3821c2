package validation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/natsqueue"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
)

// provisionWithStore starts a JetStream server whose max_file_store is
// size, as the chart configures the in-cluster NATS, and provisions the
// dispatcher's streams with the dispatcher's default stream limits.
func provisionWithStore(t *testing.T, size resource.Quantity) error {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		JetStreamMaxStore: size.Value(), JetStreamMaxMemory: 64 << 20, NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d := dispatch.Default().Stream
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return natsqueue.Provision(ctx, js, natsqueue.StreamSpec{
		Names: natsqueue.Names{Orchestra: "demo"}, Replicas: 1, MaxAge: d.MaxAge.Duration,
		MaxBytes: d.MaxBytes, MaxMsgs: d.MaxMsgs, Duplicates: d.Duplicates.Duration,
		DeadLetterMaxAge: d.DeadLetterMaxAge.Duration,
	}, []natsqueue.ConsumerSpec{{App: "chat", AckWait: 30 * time.Second, MaxAckPending: 100}})
}

// TestMinNATSStorageFitsTheStreams pins the reason for MinNATSStorage: with
// JetStream's file store as large as the volume, the dispatcher's streams
// are provisioned at the minimum, and refused at 1Gi (the request stream
// reserves all of it and the dead-letter stream finds no room).
func TestMinNATSStorageFitsTheStreams(t *testing.T) {
	if err := provisionWithStore(t, validation.MinNATSStorage); err != nil {
		t.Fatalf("provisioning the streams with max_file_store %s: %v", validation.MinNATSStorage.String(), err)
	}
	err := provisionWithStore(t, resource.MustParse("1Gi"))
	if err == nil || !strings.Contains(err.Error(), "insufficient storage resources") {
		t.Fatalf("provisioning with max_file_store 1Gi: %v; want insufficient storage resources", err)
	}
}
