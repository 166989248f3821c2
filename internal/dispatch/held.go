package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// held is an application's requests delivered to this dispatcher that wait
// for an engine slot (at most Prefetch). They are kept alive with
// InProgress like requests being served, so that JetStream redelivers a
// request only when the dispatcher holding it died: which is what lets
// AckWait be short, and a dead dispatcher's requests come back fast.
type held struct {
	mu      sync.Mutex
	msgs    []jetstream.Msg
	changed chan struct{} // closed and replaced on every change
}

func newHeld() *held { return &held{changed: make(chan struct{})} }

func (h *held) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *held) push(m jetstream.Msg) {
	h.mu.Lock()
	h.msgs = append(h.msgs, m)
	h.notifyLocked()
	h.mu.Unlock()
}

// pop takes the oldest message, waiting for one until ctx ends.
func (h *held) pop(ctx context.Context) (jetstream.Msg, error) {
	for {
		h.mu.Lock()
		if len(h.msgs) > 0 {
			m := h.msgs[0]
			h.msgs[0] = nil
			h.msgs = h.msgs[1:]
			h.notifyLocked()
			h.mu.Unlock()
			return m, nil
		}
		changed := h.changed
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

// wait waits until a message is held or ctx ends.
func (h *held) wait(ctx context.Context) error {
	for {
		h.mu.Lock()
		n := len(h.msgs)
		changed := h.changed
		h.mu.Unlock()
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// space waits until fewer than limit messages are held and returns how
// many more may be fetched.
func (h *held) space(ctx context.Context, limit int) (int, error) {
	for {
		h.mu.Lock()
		n := limit - len(h.msgs)
		changed := h.changed
		h.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-changed:
		}
	}
}

// len is the number of messages held.
func (h *held) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// keepAlive reports progress on every held message every interval until
// ctx ends.
func (h *held) keepAlive(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		msgs := append([]jetstream.Msg(nil), h.msgs...)
		h.mu.Unlock()
		for _, m := range msgs {
			_ = m.InProgress()
		}
	}
}

// drain removes and returns every held message.
func (h *held) drain() []jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	msgs := h.msgs
	h.msgs = nil
	h.notifyLocked()
	return msgs
}
