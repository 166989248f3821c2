package lifecycle

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

func TestWaitedForWake(t *testing.T) {
	awakeAt := time.Date(2026, 11, 26, 12, 0, 10, 0, time.UTC) // whole seconds, as in the bucket
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
		{"stored before the second it turned awake", awake, firstAnswer{stored: at(-300 * time.Millisecond)}, true},
		{"stored before the root joined the pool", awake, firstAnswer{stored: at(400 * time.Millisecond), rootsSince: at(500 * time.Millisecond)}, true},
		{"stored after the root joined, awake: warm", awake, firstAnswer{stored: at(600 * time.Millisecond), rootsSince: at(500 * time.Millisecond)}, false},
		// Within the wake's second, with a root that never left the pool,
		// only the order of events tells: the answer went out before this
		// dispatcher heard of the wake, which an awake application's
		// warm request never does.
		{"same second, root kept, heard of the wake late", awake, firstAnswer{stored: at(400 * time.Millisecond), late: true}, true},
		{"same second, root kept, state known in time", awake, firstAnswer{stored: at(400 * time.Millisecond)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := waitedForWake(tc.st, tc.t); got != tc.want {
				t.Errorf("waitedForWake = %v, want %v", got, tc.want)
			}
		})
	}
}
