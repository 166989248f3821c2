package lifecycle_test

import (
	"errors"
	"testing"
	"time"
)

// eventually calls cond until it returns nil and fails the test with
// cond's last error if that takes longer than within. It polls every
// 10 ms at first and backs off to 100 ms, so a long wait on a real API
// server does not flood it.
func eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := 10 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", within, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// consistently calls cond for the whole of within and fails the test at
// the first error: it proves that something does not happen.
func consistently(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if err := cond(); err != nil {
			t.Fatalf("failed within %v: %v", within, err)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holds turns a condition into the error eventually wants: what was
// awaited, while cond is false.
func holds(what string, cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errors.New("waiting for " + what)
	}
}
