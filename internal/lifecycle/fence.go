package lifecycle

import (
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fence between a scale to zero and the wake that follows it. The
// consumer stays paused from the drain until a root serves, and what
// counts as serving decides whether a request can reach a root on its way
// out: a wake that overtakes a scale to zero writes replicas back while
// the StatefulSet controller may still act on the zero, and a root pod it
// deletes stays Ready (and counted in the StatefulSet's readyReplicas)
// until its engine has stopped. servingRoots and unconfirmedRoots are that
// rule; the Waking step opens the gate only on what they leave.

// servingRoots returns the root pods among pods that serve the replica
// count replicas of the root StatefulSet set: serving by serves (Ready, or
// answering its probes, and not terminating), and only once the StatefulSet controller has acted on that count (the
// cached StatefulSet holds it and its status has observed its generation).
// Before that the controller may still delete a pod for an earlier, lower
// count, so none serves. At most replicas pods, by name.
func servingRoots(set *appsv1.StatefulSet, replicas int32, pods []*corev1.Pod, serves func(*corev1.Pod) bool) []*corev1.Pod {
	if set == nil || replicas <= 0 {
		return nil
	}
	cached := int32(1) // the API server's default
	if set.Spec.Replicas != nil {
		cached = *set.Spec.Replicas
	}
	if cached != replicas || set.Status.ObservedGeneration < set.Generation {
		return nil
	}
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Labels[labelComponent] == "root" && serves(p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out[:min(len(out), int(replicas))]
}

// servingWorkers counts the pods of worker StatefulSet set among pods
// that serve by serves.
func servingWorkers(set string, pods []*corev1.Pod, serves func(*corev1.Pod) bool) int32 {
	var n int32
	for _, p := range pods {
		if p.Labels[labelComponent] != "worker" {
			continue
		}
		if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "StatefulSet" && ref.Name == set && serves(p) {
			n++
		}
	}
	return n
}

// unconfirmedRoots returns the roots that existed when the application
// was last taken to zero (at zeroAt; zero: never): pods the scale to zero
// may have deleted, of which the cache can still show an older version.
// The leader reads them from the API server before it counts them. A
// pod's creation time has whole seconds: a pod created in the second of
// the scale to zero is read too.
func unconfirmedRoots(roots []*corev1.Pod, zeroAt time.Time) []*corev1.Pod {
	if zeroAt.IsZero() {
		return nil
	}
	var out []*corev1.Pod
	for _, p := range roots {
		if !p.CreationTimestamp.After(zeroAt.Truncate(time.Second)) {
			out = append(out, p)
		}
	}
	return out
}

// RootServes reports whether a root pod takes requests: Ready and not
// terminating (what the EndpointSlice of its Service lists as ready, a
// controller hop later). A terminating pod stays Ready while its engine
// stops.
func RootServes(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && podReady(p)
}
