package polltest_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/polltest"
)

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.msg = format
	for _, a := range args {
		r.msg += " " + stringOf(a)
	}
	r.mu.Unlock()
	panic(r)
}

func stringOf(a any) string {
	switch v := a.(type) {
	case error:
		return v.Error()
	case time.Duration:
		return v.String()
	}
	return ""
}

// run calls f with a recorder and returns the failure message, "" when f
// did not fail.
func run(f func(t testing.TB)) (msg string) {
	r := &recorder{}
	defer func() {
		if p := recover(); p != nil && p != any(r) {
			panic(p)
		}
		msg = r.msg
	}()
	f(r)
	return ""
}

func TestEventually(t *testing.T) {
	calls := 0
	msg := run(func(tb testing.TB) {
		polltest.Eventually(tb, time.Second, time.Millisecond, func() error {
			if calls++; calls < 3 {
				return errors.New("not yet")
			}
			return nil
		})
	})
	if msg != "" || calls != 3 {
		t.Fatalf("a check that passes on the third call: failure %q after %d calls", msg, calls)
	}

	msg = run(func(tb testing.TB) {
		polltest.Eventually(tb, 20*time.Millisecond, time.Millisecond, polltest.Holds("the door to open", func() bool { return false }))
	})
	if !strings.Contains(msg, "waiting for the door to open") {
		t.Fatalf("a check that never passes fails with its last error, got %q", msg)
	}
}

func TestEventuallyBackoff(t *testing.T) {
	var at []time.Time
	msg := run(func(tb testing.TB) {
		polltest.EventuallyBackoff(tb, time.Second, time.Millisecond, 4*time.Millisecond, func() error {
			if at = append(at, time.Now()); len(at) < 6 {
				return errors.New("not yet")
			}
			return nil
		})
	})
	if msg != "" {
		t.Fatal(msg)
	}
	// Pauses of 1, 2, 4, 4, 4 ms: at least 15 ms from the first call to
	// the last.
	if d := at[len(at)-1].Sub(at[0]); d < 15*time.Millisecond {
		t.Fatalf("six calls with pauses doubling from 1 ms up to 4 ms took %v, want at least 15ms", d)
	}
}

func TestConsistently(t *testing.T) {
	calls := 0
	msg := run(func(tb testing.TB) {
		polltest.Consistently(tb, 10*time.Millisecond, time.Millisecond, func() error { calls++; return nil })
	})
	if msg != "" || calls < 2 {
		t.Fatalf("a check that keeps passing: failure %q after %d calls", msg, calls)
	}

	msg = run(func(tb testing.TB) {
		polltest.Consistently(tb, time.Second, time.Millisecond, func() error { return errors.New("it happened") })
	})
	if !strings.Contains(msg, "it happened") {
		t.Fatalf("a check that fails at once fails the test with its error, got %q", msg)
	}
}
