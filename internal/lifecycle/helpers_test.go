package lifecycle_test

import (
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls cond until it passes, every 10 ms at first and backing
// off to 100 ms, so a long wait on a real API server does not flood it.
func eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	polltest.EventuallyBackoff(t, within, 10*time.Millisecond, 100*time.Millisecond, cond)
}

// consistently calls cond every 10 ms for the whole of within and fails the
// test at its first error (polltest.Consistently).
func consistently(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	polltest.Consistently(t, within, 10*time.Millisecond, cond)
}

// holds is polltest.Holds: what is awaited, while cond is false.
var holds = polltest.Holds
