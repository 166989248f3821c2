package sidebyside

import (
	"testing"
	"time"
)

// eventually calls f until it returns nil, and fails the test with f's last
// error, which says what was missing, if within passes first.
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", within, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// consistently calls f until within passes, and fails the test as soon as
// f returns an error, which says what happened.
func consistently(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if err := f(); err != nil {
			t.Fatalf("within %s: %v", within, err)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}
