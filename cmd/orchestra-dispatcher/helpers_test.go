package main

import (
	"errors"
	"testing"
	"time"
)

// eventually polls check until it returns nil, failing the test with the
// last error if that takes longer than within.
func eventually(t *testing.T, within time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holds adapts a condition to eventually: an error naming what is awaited
// while cond is false.
func holds(what string, cond func() bool) func() error {
	return func() error {
		if !cond() {
			return errors.New("waiting for " + what)
		}
		return nil
	}
}
