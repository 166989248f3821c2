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

// await calls ready under h.mu until it returns true, waiting for a
// change of the held messages between calls; it returns ctx's error when
// ctx ends first.
func (h *held) await(ctx context.Context, ready func() bool) error {
	for {
		h.mu.Lock()
		ok := ready()
		changed := h.changed
		h.mu.Unlock()
		if ok {
			return nil
		}
		if err := waitChange(ctx, changed, 0); err != nil {
			return err
		}
	}
}

func (h *held) push(m jetstream.Msg) {
	h.mu.Lock()
	h.msgs = append(h.msgs, m)
	h.notifyLocked()
	h.mu.Unlock()
}

// pop takes the oldest message, waiting for one until ctx ends.
func (h *held) pop(ctx context.Context) (jetstream.Msg, error) {
	var m jetstream.Msg
	err := h.await(ctx, func() bool {
		if len(h.msgs) == 0 {
			return false
		}
		m = h.msgs[0]
		h.msgs[0] = nil
		h.msgs = h.msgs[1:]
		h.notifyLocked()
		return true
	})
	return m, err
}

// wait waits until a message is held or ctx ends.
func (h *held) wait(ctx context.Context) error {
	return h.await(ctx, func() bool { return len(h.msgs) > 0 })
}

// space waits until fewer than limit messages are held and returns how
// many more may be fetched.
func (h *held) space(ctx context.Context, limit int) (int, error) {
	var n int
	err := h.await(ctx, func() bool {
		n = limit - len(h.msgs)
		return n > 0
	})
	if err != nil {
		return 0, err
	}
	return n, nil
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
