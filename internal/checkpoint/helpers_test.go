package checkpoint_test

import (
	"testing"
	"time"
)

// eventually calls cond until it returns nil and fails the test with
// cond's last error if that takes longer than within.
func eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", within, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
