package simengine_test

import (
	"testing"
	"time"
)

// eventually polls f until it returns nil or within passes.
func eventually(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
