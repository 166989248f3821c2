// Package polltest waits in tests: Eventually polls a check until it
// passes, Consistently proves that one keeps passing, Holds turns a
// condition into a check. Each test package keeps its own short
// eventually/consistently with the interval that suits what it polls (a
// few milliseconds for in-process servers, seconds for a cluster); the
// loop itself lives here only.
package polltest

import (
	"errors"
	"testing"
	"time"
)

// Eventually calls check every interval until it returns nil, and fails
// the test with check's last error, which says what was missing, once
// within has passed.
func Eventually(t testing.TB, within, interval time.Duration, check func() error) {
	t.Helper()
	EventuallyBackoff(t, within, interval, interval, check)
}

// EventuallyBackoff is Eventually with a pause that starts at first and
// doubles up to most, so a long wait on a real API server does not flood
// it.
func EventuallyBackoff(t testing.TB, within, first, most time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := first
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", within, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, most)
	}
}

// Consistently calls check every interval for the whole of within and
// fails the test at its first error, which says what happened: the way to
// assert that something does not happen.
func Consistently(t testing.TB, within, interval time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if err := check(); err != nil {
			t.Fatalf("failed within %v: %v", within, err)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(interval)
	}
}

// Holds turns a condition into a check for Eventually: while cond is
// false, an error saying that what is awaited has not happened.
func Holds(what string, cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errors.New("waiting for " + what)
	}
}
