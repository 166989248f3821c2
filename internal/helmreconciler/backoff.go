package helmreconciler

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Failed Helm actions are retried with an exponential back-off per resource
// and wanted digest. The controller's own rate limiter cannot do it: a
// failed install writes and removes release Secrets, whose watch events
// enqueue the resource again at once, so without this the engine would
// retry (and record a Warning event) every second or two for as long as
// the inputs stay wrong. A change of the inputs (another digest) retries at
// once.
const (
	failureBackoffBase = 2 * time.Second
	failureBackoffMax  = 5 * time.Minute
)

// failureBackoff is one resource's record of consecutive failed actions for
// one wanted digest.
type failureBackoff struct {
	uid      types.UID
	want     string
	failures int
	next     time.Time // no action for want before this
}

// errBackingOff is returned when a Helm action is due but the last one for
// the same inputs failed too recently.
type errBackingOff struct{ wait time.Duration }

func (e *errBackingOff) Error() string {
	return fmt.Sprintf("the last Helm action for these inputs failed; retrying in %s", e.wait.Round(time.Millisecond))
}

// backingOff returns how long a retried action must still wait, or nil.
func (r *Reconciler) backingOff(obj *unstructured.Unstructured, want string, now time.Time) error {
	v, ok := r.failures.Load(client.ObjectKeyFromObject(obj))
	if !ok {
		return nil
	}
	b := v.(*failureBackoff)
	if b.uid != obj.GetUID() || b.want != want || !now.Before(b.next) {
		return nil
	}
	return &errBackingOff{wait: b.next.Sub(now)}
}

// noteAction records the outcome of a Helm action for want: a failure
// doubles the wait before the next one (from failureBackoffBase up to
// failureBackoffMax); a success forgets the failures.
func (r *Reconciler) noteAction(obj *unstructured.Unstructured, want string, err error, now time.Time) {
	key := client.ObjectKeyFromObject(obj)
	if err == nil || errors.Is(err, errHistoryChanged) {
		// errHistoryChanged is a lost race, not a failure: retry at once.
		if err == nil {
			r.failures.Delete(key)
		}
		return
	}
	b := &failureBackoff{uid: obj.GetUID(), want: want}
	if v, ok := r.failures.Load(key); ok {
		if old := v.(*failureBackoff); old.uid == b.uid && old.want == want {
			b.failures = old.failures
		}
	}
	b.failures++
	b.next = now.Add(failureBackoffDelay(b.failures))
	r.failures.Store(key, b)
}

// failureBackoffDelay is the wait after n consecutive failures.
func failureBackoffDelay(n int) time.Duration {
	d := failureBackoffBase
	for i := 1; i < n && d < failureBackoffMax; i++ {
		d *= 2
	}
	return min(d, failureBackoffMax)
}
