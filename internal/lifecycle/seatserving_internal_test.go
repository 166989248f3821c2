package lifecycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

func TestSeatServingAnnotationRoundTrips(t *testing.T) {
	s := SeatServing{"g-1": {"beta", "alpha", "beta"}, "g-0": {"gamma"}, "g-2": nil}
	if got, want := s.String(), `{"g-0":["gamma"],"g-1":["alpha","beta"]}`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	back := ParseSeatServing(s.String())
	if diff := cmp.Diff([]string{"g-1"}, back.Pods("alpha")); diff != "" {
		t.Errorf("Pods(alpha) (-want +got):\n%s", diff)
	}
	if !back.Serves("g-0", "gamma") || back.Serves("g-0", "alpha") {
		t.Errorf("Serves does not follow the annotation %s", back)
	}
	for _, bad := range []string{"", "not json", `["g-0"]`} {
		if got := ParseSeatServing(bad); len(got) != 0 {
			t.Errorf("ParseSeatServing(%q) = %v, want nothing served", bad, got)
		}
	}
}

func TestSeatPodsForServesOnlyWhereTheLeaderSaysAwake(t *testing.T) {
	pod := func(name string, ready, terminating bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.PodStatus{PodIP: "10.0.0." + name[len(name)-1:]}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if terminating {
			p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
		}
		return p
	}
	set := func(serving SeatServing) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{SeatServingAnnotation: serving.String()}}}
	}
	pods := []*corev1.Pod{pod("g-1", true, false), pod("g-0", true, false)}
	cases := []struct {
		name string
		set  *appsv1.StatefulSet
		pods []*corev1.Pod
		app  string
		want map[string]bool
	}{
		{"awake in one pod", set(SeatServing{"g-0": {"alpha"}, "g-1": {"beta"}}), pods, "alpha", map[string]bool{"g-0": true, "g-1": false}},
		{"awake in both pods", set(SeatServing{"g-0": {"alpha"}, "g-1": {"alpha", "beta"}}), pods, "alpha", map[string]bool{"g-0": true, "g-1": true}},
		{"asleep everywhere", set(SeatServing{"g-0": {"beta"}}), pods, "alpha", map[string]bool{"g-0": false, "g-1": false}},
		{"no annotation yet", &appsv1.StatefulSet{}, pods, "alpha", map[string]bool{"g-0": false, "g-1": false}},
		{"no StatefulSet in the cache", nil, pods, "alpha", map[string]bool{"g-0": false, "g-1": false}},
		{"a pod not Ready", set(SeatServing{"g-0": {"alpha"}}), []*corev1.Pod{pod("g-0", false, false)}, "alpha", map[string]bool{"g-0": false}},
		{"a terminating pod", set(SeatServing{"g-0": {"alpha"}}), []*corev1.Pod{pod("g-0", true, true)}, "alpha", map[string]bool{"g-0": false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]bool{}
			var order []string
			for _, p := range SeatPodsFor(tc.set, tc.pods, tc.app) {
				got[p.Pod.Name] = p.Serves
				order = append(order, p.Pod.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("serves (-want +got):\n%s", diff)
			}
			for i := 1; i < len(order); i++ {
				if order[i-1] > order[i] {
					t.Errorf("pods not in name order: %v", order)
				}
			}
		})
	}
}

func TestSeatConsumerOpensOnlyWhenAPodServesAndNoneDrains(t *testing.T) {
	cases := []struct {
		name    string
		written []string
		gates   map[string]Gate
		want    bool
	}{
		{"served by one pod", []string{"g-0"}, map[string]Gate{"g-0": GateOpen, "g-1": GateClosed}, true},
		{"served by both", []string{"g-0", "g-1"}, map[string]Gate{"g-0": GateOpen, "g-1": GateOpen}, true},
		{"served nowhere", nil, map[string]Gate{"g-0": GateClosed, "g-1": GateClosed}, false},
		{"one serves, the other drains", []string{"g-0", "g-1"}, map[string]Gate{"g-0": GateOpen, "g-1": GateDraining}, false},
		{"its only pod drains", []string{"g-0"}, map[string]Gate{"g-0": GateDraining}, false},
		{"the annotation still lists a pod that closed (its write failed)", []string{"g-0", "g-1"}, map[string]Gate{"g-0": GateOpen, "g-1": GateClosed}, false},
		{"open, but the annotation does not list it yet", nil, map[string]Gate{"g-0": GateOpen}, false},
		{"a pod's gate unknown (a new leader)", []string{"g-0"}, map[string]Gate{"g-0": GateOpen, "g-1": ""}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := seatConsumerOpen(tc.written, tc.gates); got != tc.want {
				t.Errorf("seatConsumerOpen(%v, %v) = %v, want %v", tc.written, tc.gates, got, tc.want)
			}
		})
	}
}

func TestNextPodGate(t *testing.T) {
	cases := []struct {
		name               string
		prev               Gate
		open, asleep, gone bool
		want               Gate
	}{
		{"released", GateClosed, true, false, false, GateOpen},
		{"held while serving: drains", GateOpen, false, false, false, GateDraining},
		{"held while draining: drains on", GateDraining, false, false, false, GateDraining},
		{"held once asleep: closes", GateDraining, false, true, false, GateClosed},
		{"held when its pod stopped serving: closes", GateOpen, false, false, true, GateClosed},
		{"held when not serving: stays closed", GateClosed, false, false, false, GateClosed},
		{"held, unknown before (a new leader)", "", false, false, false, GateClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextPodGate(tc.prev, tc.open, tc.asleep, tc.gone); got != tc.want {
				t.Errorf("nextPodGate(%q, open %v, asleep %v, gone %v) = %q, want %q", tc.prev, tc.open, tc.asleep, tc.gone, got, tc.want)
			}
		})
	}
}

func TestSeatPodDemand(t *testing.T) {
	const maxWait = 10 * time.Second
	busy := seatgroup.Demand{InFlight: 2, Queued: 5, OldestWait: time.Second}
	cases := []struct {
		name      string
		dm        seatgroup.Demand
		elsewhere bool
		want      seatgroup.Demand
	}{
		{"served nowhere else: the whole queue", busy, false, busy},
		{"served elsewhere and keeping up: no queue here, in flight still counts", busy, true, seatgroup.Demand{InFlight: 2}},
		{"served elsewhere but its oldest waited maxSwapWait: the queue counts", seatgroup.Demand{Queued: 5, OldestWait: maxWait}, true, seatgroup.Demand{Queued: 5, OldestWait: maxWait}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, seatPodDemand(tc.dm, tc.elsewhere, maxWait)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestGroupSeatState(t *testing.T) {
	st := func(s sidecarapi.State) sidecarapi.Status { return sidecarapi.Status{State: s} }
	cases := []struct {
		name     string
		readings []sidecarapi.Status
		ok       []bool
		want     v1alpha1.LifecycleState
	}{
		{"awake in one of two", []sidecarapi.Status{st(sidecarapi.Asleep), st(sidecarapi.Awake)}, []bool{true, true}, v1alpha1.LifecycleAwake},
		{"awake in one, the other unread", []sidecarapi.Status{st(sidecarapi.Awake), {}}, []bool{true, false}, v1alpha1.LifecycleAwake},
		{"waking in one", []sidecarapi.Status{st(sidecarapi.Asleep), st(sidecarapi.Waking)}, []bool{true, true}, v1alpha1.LifecycleWaking},
		{"draining in one", []sidecarapi.Status{st(sidecarapi.FallingAsleep), st(sidecarapi.Asleep)}, []bool{true, true}, v1alpha1.LifecycleDraining},
		{"asleep in both", []sidecarapi.Status{st(sidecarapi.Asleep), st(sidecarapi.Asleep)}, []bool{true, true}, v1alpha1.LifecycleAsleep},
		{"asleep in one, the other unread: unknown", []sidecarapi.Status{st(sidecarapi.Asleep), {}}, []bool{true, false}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := groupSeatState(tc.readings, tc.ok); got != tc.want {
				t.Errorf("groupSeatState = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestObserveGateForgetsAClosedGateWhosePauseWasReset(t *testing.T) {
	cases := []struct {
		name         string
		gate         Gate
		reading      consumerReading
		want         Gate
		wantHoldFail bool
	}{
		{"closed and paused: still closed", GateClosed, consumerReading{OK: true, Paused: true}, GateClosed, false},
		{"closed but not paused (a dispatcher provisioned it again): unknown, and counted busy", GateClosed, consumerReading{OK: true}, GateUnknown, true},
		{"open and not paused: open", GateOpen, consumerReading{OK: true}, GateOpen, false},
		{"a reading that failed changes nothing", GateClosed, consumerReading{}, GateClosed, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := consumerGate{app: "a", gate: tc.gate}
			observeGate(&g, tc.reading)
			if g.gate != tc.want || g.holdFailed != tc.wantHoldFail {
				t.Errorf("gate %q, holdFailed %v; want %q, %v", g.gate, g.holdFailed, tc.want, tc.wantHoldFail)
			}
		})
	}
}
