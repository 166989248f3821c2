package dispatch

import (
	"context"
	"time"
)

// waitChange is the one wait of the dispatcher's waiting loops (a root slot
// in the pool, a held request): the loop reads its state and the changed
// channel under the state's mutex (the channel is closed and replaced on
// every change), unlocks, and waits here until changed is closed, after
// has passed (never when 0: an ejected root's return) or ctx ends. It
// returns ctx's error once ctx has ended, so that a cancelled caller takes
// nothing.
func waitChange(ctx context.Context, changed <-chan struct{}, after time.Duration) error {
	var timer <-chan time.Time
	if after > 0 {
		t := time.NewTimer(after)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
	case <-changed:
	case <-timer:
	}
	return ctx.Err()
}
