package localcluster_test

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
