package lifecycle

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

func TestWaitedForWake(t *testing.T) {
	awakeAt := time.Date(2026, 11, 26, 12, 0, 10, 450e6, time.UTC) // to the nanosecond, as in the bucket
	awake := v1alpha1.LifecycleStatus{State: v1alpha1.LifecycleAwake, Since: &metav1.Time{Time: awakeAt}}
	waking := v1alpha1.LifecycleStatus{State: v1alpha1.LifecycleWaking}
	at := func(d time.Duration) time.Time { return awakeAt.Add(d) }
	for _, tc := range []struct {
		name string
		st   v1alpha1.LifecycleStatus
		t    firstAnswer
		want bool
	}{
		{"still waking", waking, firstAnswer{stored: at(-time.Second)}, true},
		{"stored 300 ms before it turned awake", awake, firstAnswer{stored: at(-300 * time.Millisecond)}, true},
		// The root never left the pool (an engine that slept in its pod):
		// the moment it turned awake tells, within its second too.
		{"stored 20 ms before it turned awake, root kept, state known in time", awake, firstAnswer{stored: at(-20 * time.Millisecond)}, true},
		{"stored 20 ms after it turned awake, root kept: warm", awake, firstAnswer{stored: at(20 * time.Millisecond)}, false},
		{"stored before the root joined the pool", awake, firstAnswer{stored: at(400 * time.Millisecond), rootsSince: at(500 * time.Millisecond)}, true},
		{"stored after the root joined, awake: warm", awake, firstAnswer{stored: at(600 * time.Millisecond), rootsSince: at(500 * time.Millisecond)}, false},
		// The answer went out before this dispatcher heard of the wake,
		// which an awake application's warm request never does.
		{"heard of the wake late", awake, firstAnswer{stored: at(20 * time.Millisecond), late: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := waitedForWake(tc.st, tc.t); got != tc.want {
				t.Errorf("waitedForWake = %v, want %v", got, tc.want)
			}
		})
	}
}
