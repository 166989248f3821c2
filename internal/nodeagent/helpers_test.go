package nodeagent_test

import (
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls cond every 5 ms until it passes (polltest.Eventually).
func eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	polltest.Eventually(t, within, 5*time.Millisecond, cond)
}
