package sidebyside

import (
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls f every 250 ms until it passes (polltest.Eventually).
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, 250*time.Millisecond, f)
}

// consistently calls f every 250 ms for the whole of within and fails the
// test at its first error (polltest.Consistently).
func consistently(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Consistently(t, within, 250*time.Millisecond, f)
}
