package simengine_test

import (
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls f every 10 ms until it passes (polltest.Eventually).
func eventually(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, 10*time.Millisecond, f)
}
