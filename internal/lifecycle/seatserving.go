package lifecycle

import (
	"encoding/json"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Where a seat group serves. A group runs replicas pods, each with one
// engine per application and its own seats, and an application may be
// awake in some pods and asleep in others. The leader names, per pod, the
// applications awake there and not draining (SeatServing, in the
// annotation SeatServingAnnotation on the group's StatefulSet, which also
// keeps the pods that drain it until their engine sleeps); every
// dispatcher takes an application's roots from the group's pods that list
// it and are Ready and not terminating (SeatPodsFor), and from nothing
// else. The application's JetStream consumer is the second gate: it stays
// paused while no pod serves the application, and while a pod drains it
// (seatConsumerOpen), so that the requests in flight can be counted
// before an engine sleeps.

// SeatServingAnnotation is the annotation on a seat group's StatefulSet
// holding its SeatServing as JSON. Only the lifecycle leader writes it.
const SeatServingAnnotation = "modelorchestra.io/seat-serving"

// labelSeatGroup is the label the chart puts on a seat group's StatefulSet
// and pods, the group's name.
const labelSeatGroup = "modelorchestra.io/seat-group"

// SeatServing maps a seat group's pod name to the applications awake and
// serving in it (or draining), in name order.
type SeatServing map[string][]string

// ParseSeatServing reads the annotation's value; an empty or unreadable
// one serves nothing.
func ParseSeatServing(v string) SeatServing {
	var s SeatServing
	if v == "" || json.Unmarshal([]byte(v), &s) != nil {
		return SeatServing{}
	}
	return s
}

// String is the annotation's value: JSON with pods and applications in
// name order and pods serving nothing left out, so equal maps give equal
// strings.
func (s SeatServing) String() string {
	out := SeatServing{}
	for pod, apps := range s {
		if len(apps) == 0 {
			continue
		}
		a := slices.Clone(apps)
		slices.Sort(a)
		out[pod] = slices.Compact(a)
	}
	b, _ := json.Marshal(out) // a map of strings to strings marshals
	return string(b)
}

// Serves reports whether app is awake and serving in pod.
func (s SeatServing) Serves(pod, app string) bool { return slices.Contains(s[pod], app) }

// Pods returns the pods that serve app, in name order.
func (s SeatServing) Pods(app string) []string {
	var out []string
	for pod, apps := range s {
		if slices.Contains(apps, app) {
			out = append(out, pod)
		}
	}
	slices.Sort(out)
	return out
}

// SeatPod is one pod of a seat group and whether it serves an
// application.
type SeatPod struct {
	Pod    *corev1.Pod
	Serves bool
}

// SeatPodsFor returns the pods of a seat group (its StatefulSet set, which
// carries the leader's SeatServingAnnotation) and, for each, whether it
// serves app: it serves as a root does (Ready, not terminating) and the
// leader lists app as awake there. Without the StatefulSet no pod serves.
func SeatPodsFor(set *appsv1.StatefulSet, pods []*corev1.Pod, app string) []SeatPod {
	var serving SeatServing
	if set != nil {
		serving = ParseSeatServing(set.Annotations[SeatServingAnnotation])
	}
	out := make([]SeatPod, 0, len(pods))
	for _, p := range pods {
		out = append(out, SeatPod{Pod: p, Serves: set != nil && RootServes(p) && serving.Serves(p.Name, app)})
	}
	slices.SortFunc(out, func(a, b SeatPod) int { return strings.Compare(a.Pod.Name, b.Pod.Name) })
	return out
}

// seatConsumerOpen is the rule for an application's consumer in a seat
// group: open only while some pod serves it as the dispatchers were last
// told (written: the pods the last written SeatServingAnnotation lists for
// it), every pod so listed is still open, and no pod drains it. gates maps
// each pod to its gate for the application ("" unknown).
func seatConsumerOpen(written []string, gates map[string]Gate) bool {
	if len(written) == 0 {
		return false
	}
	for _, pod := range written {
		if gates[pod] != GateOpen {
			return false
		}
	}
	for _, g := range gates {
		if g == GateDraining {
			return false
		}
	}
	return true
}

// nextPodGate is a pod's gate for an application after the leader holds
// it (open false) or releases it (open true): a pod that was open or
// draining drains until its engine is known to be asleep (asleep), or its
// pod no longer serves (gone); one that was not open stays closed.
func nextPodGate(prev Gate, open, asleep, gone bool) Gate {
	switch {
	case open:
		return GateOpen
	case asleep || gone:
		return GateClosed
	case prev == GateOpen || prev == GateDraining:
		return GateDraining
	}
	return GateClosed
}
