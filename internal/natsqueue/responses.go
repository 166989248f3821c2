package natsqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ResponsesBucket is the key-value bucket of the gateway's stored
// Responses API responses.
func (n Names) ResponsesBucket() string { return n.Stream() + "_RESPONSES" }

// ResponseStore keeps the gateway's stored responses in a JetStream
// key-value bucket (file storage) whose TTL is the retention: a response
// is gone retention after it was stored. The bucket is created (or its
// retention updated) on first use, so that a gateway starting while NATS is
// down starts anyway; every later use retries that until it succeeds.
type ResponseStore struct {
	js        jetstream.JetStream
	bucket    string
	retention time.Duration
	replicas  int

	mu sync.Mutex
	kv jetstream.KeyValue
}

// ResponseStore returns the store of this client's orchestra.
func (c *Client) ResponseStore(retention time.Duration, replicas int) *ResponseStore {
	return &ResponseStore{js: c.js, bucket: c.names.ResponsesBucket(), retention: retention, replicas: replicas}
}

func (s *ResponseStore) open(ctx context.Context) (jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      s.bucket,
		Description: "Stored Responses API responses of the orchestra's gateways",
		History:     1,
		TTL:         s.retention,
		Storage:     jetstream.FileStorage,
		Replicas:    s.replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("opening key-value bucket %s: %w", s.bucket, err)
	}
	s.kv = kv
	return kv, nil
}

// Get returns the value of key, or nil when it is absent, deleted or
// expired.
func (s *ResponseStore) Get(ctx context.Context, key string) ([]byte, error) {
	kv, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return e.Value(), nil
}

// Put stores value under key; it returns once JetStream stored it.
func (s *ResponseStore) Put(ctx context.Context, key string, value []byte) error {
	kv, err := s.open(ctx)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, key, value)
	return err
}

// Delete removes key and its history.
func (s *ResponseStore) Delete(ctx context.Context, key string) error {
	kv, err := s.open(ctx)
	if err != nil {
		return err
	}
	return kv.Purge(ctx, key)
}
