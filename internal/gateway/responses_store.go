package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
)

// ResponseStore keeps stored Responses API responses (store: true) with
// their conversations. Keys are opaque strings made of [A-Za-z0-9._-];
// values are the gateway's own JSON. Get returns nil, nil for a key that
// is absent or expired. natsqueue.ResponseStore keeps them in a JetStream
// key-value bucket whose TTL is the retention.
type ResponseStore interface {
	Get(ctx context.Context, key string) ([]byte, error)
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
}

// responseKey is the store key of response id owned by the token name
// owner: other tokens compute other keys, so they cannot find it.
func responseKey(owner, id string) string {
	sum := sha256.Sum256([]byte(owner))
	return "r." + hex.EncodeToString(sum[:16]) + "." + id
}

// MemoryResponseStore is a ResponseStore in memory, for tests and local
// runs: nothing survives the process, and nothing expires.
type MemoryResponseStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemoryResponseStore returns an empty in-memory store.
func NewMemoryResponseStore() *MemoryResponseStore {
	return &MemoryResponseStore{m: map[string][]byte{}}
}

// Get implements ResponseStore.
func (s *MemoryResponseStore) Get(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key], nil
}

// Put implements ResponseStore.
func (s *MemoryResponseStore) Put(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = append([]byte(nil), value...)
	return nil
}

// Delete implements ResponseStore.
func (s *MemoryResponseStore) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	return nil
}
