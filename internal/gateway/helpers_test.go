package gateway

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// metricEquals checks that a single-series collector reads want.
func metricEquals(name string, c prometheus.Collector, want float64) func() error {
	return func() error {
		if got := testutil.ToFloat64(c); got != want {
			return fmt.Errorf("%s = %v, want %v", name, got, want)
		}
		return nil
	}
}
