package lifecycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fence between a scale to zero and the wake that overtakes it: the
// gate opens only on a root pod that the scale to zero cannot take away.
func TestServingRoots(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	set := func(spec *int32, gen, observed int64, ready int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Generation: gen},
			Spec:       appsv1.StatefulSetSpec{Replicas: spec},
			// readyReplicas counts a terminating pod that is still Ready,
			// as the StatefulSet controller does: never trusted alone.
			Status: appsv1.StatefulSetStatus{ObservedGeneration: observed, ReadyReplicas: ready},
		}
	}
	one, two, zero := int32(1), int32(2), int32(0)
	type podOpt func(*corev1.Pod)
	terminating := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }
	notReady := func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
	worker := func(p *corev1.Pod) { p.Labels[labelComponent] = "worker" }
	pod := func(name string, opts ...podOpt) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelComponent: "root"}},
			Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		for _, o := range opts {
			o(p)
		}
		return p
	}
	cases := []struct {
		name     string
		set      *appsv1.StatefulSet
		replicas int32 // the count the leader goes by (its own write, before the cache has it)
		pods     []*corev1.Pod
		want     []string
	}{
		{"awake: the ready root serves", set(&one, 3, 3, 1), 1, []*corev1.Pod{pod("r-0")}, []string{"r-0"}},
		{"a StatefulSet without replicas has one", set(nil, 1, 1, 1), 1, []*corev1.Pod{pod("r-0")}, []string{"r-0"}},
		{"the wake's count is not in the cache yet: the old root may still be deleted", set(&zero, 4, 4, 1), 1, []*corev1.Pod{pod("r-0")}, nil},
		{"the controller has not acted on the wake's count yet", set(&one, 5, 4, 1), 1, []*corev1.Pod{pod("r-0")}, nil},
		{"the scale to zero deleted the root: terminating, still Ready and counted", set(&one, 5, 5, 1), 1, []*corev1.Pod{pod("r-0", terminating)}, nil},
		{"the new root is not ready yet", set(&one, 5, 5, 0), 1, []*corev1.Pod{pod("r-0", notReady)}, nil},
		{"a ready root before the StatefulSet counts it", set(&one, 5, 5, 0), 1, []*corev1.Pod{pod("r-0")}, []string{"r-0"}},
		{"workers are not roots", set(&one, 5, 5, 1), 1, []*corev1.Pod{pod("r-worker-0", worker)}, nil},
		{"going from two to one, the second root is on its way out", set(&one, 6, 6, 2), 1, []*corev1.Pod{pod("r-1", terminating), pod("r-0")}, []string{"r-0"}},
		{"no more than the replica count", set(&one, 6, 6, 2), 1, []*corev1.Pod{pod("r-1"), pod("r-0")}, []string{"r-0"}},
		{"two replicas", set(&two, 6, 6, 2), 2, []*corev1.Pod{pod("r-1"), pod("r-0")}, []string{"r-0", "r-1"}},
		{"at zero nothing serves", set(&zero, 6, 6, 1), 0, []*corev1.Pod{pod("r-0")}, nil},
		{"no StatefulSet", nil, 1, []*corev1.Pod{pod("r-0")}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range servingRoots(tc.set, tc.replicas, tc.pods, RootServes) {
				got = append(got, p.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("servingRoots (-want +got):\n%s", diff)
			}
		})
	}
}

// A root that existed when the application was taken to zero is read from
// the API server before the gate opens on it; one created since is not.
func TestUnconfirmedRoots(t *testing.T) {
	zeroAt := time.Date(2026, 1, 1, 12, 0, 0, 500_000_000, time.UTC)
	pod := func(name string, created time.Time) *corev1.Pod {
		// The API server keeps whole seconds.
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Time{Time: created.Truncate(time.Second)}}}
	}
	cases := []struct {
		name   string
		zeroAt time.Time
		roots  []*corev1.Pod
		want   []string
	}{
		{"never at zero", time.Time{}, []*corev1.Pod{pod("old", zeroAt.Add(-time.Hour))}, nil},
		{"the root from before the scale to zero", zeroAt, []*corev1.Pod{pod("old", zeroAt.Add(-time.Hour))}, []string{"old"}},
		{"created in the second of the scale to zero: read too", zeroAt, []*corev1.Pod{pod("same", zeroAt.Add(300*time.Millisecond))}, []string{"same"}},
		{"created after the scale to zero", zeroAt, []*corev1.Pod{pod("new", zeroAt.Add(2*time.Second))}, nil},
		{"both", zeroAt, []*corev1.Pod{pod("new", zeroAt.Add(11*time.Second)), pod("old", zeroAt.Add(-time.Minute))}, []string{"old"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range unconfirmedRoots(tc.roots, tc.zeroAt) {
				got = append(got, p.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("unconfirmedRoots (-want +got):\n%s", diff)
			}
		})
	}
}

// A replica's workers count from their pods, by the rule a root's pod
// follows: the pods of that worker StatefulSet that serve.
func TestServingWorkers(t *testing.T) {
	pod := func(name, component, owner string, ready bool) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelComponent: component}},
			Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}},
		}
		if owner != "" {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "StatefulSet", Name: owner, Controller: ptrTo(true)}}
		}
		if ready {
			p.Status.Conditions[0].Status = corev1.ConditionTrue
		}
		return p
	}
	pods := []*corev1.Pod{
		pod("w0-0", "worker", "w0", true),
		pod("w0-1", "worker", "w0", false), // answering its probes early
		pod("w0-2", "worker", "w0", false),
		pod("w1-0", "worker", "w1", true),
		pod("root-0", "root", "root", true),
		pod("stray", "worker", "", true),
	}
	early := map[string]bool{"w0-1": true}
	serves := func(p *corev1.Pod) bool { return RootServes(p) || early[p.Name] }
	for set, want := range map[string]int32{"w0": 2, "w1": 1, "w2": 0, "root": 0} {
		if got := servingWorkers(set, pods, serves); got != want {
			t.Errorf("servingWorkers(%s) = %d, want %d", set, got, want)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }
