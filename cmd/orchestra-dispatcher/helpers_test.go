package main

import (
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls check every 10 ms until it passes (polltest.Eventually).
func eventually(t *testing.T, within time.Duration, check func() error) {
	t.Helper()
	polltest.Eventually(t, within, 10*time.Millisecond, check)
}

// holds is polltest.Holds: what is awaited, while cond is false.
var holds = polltest.Holds
