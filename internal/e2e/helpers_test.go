package e2e

import (
	"testing"
	"time"
)

// eventually calls f every second until it returns nil, and fails the test
// when within has passed; the last error says what was missing.
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %s: %v", within, err)
		}
		time.Sleep(time.Second)
	}
}
