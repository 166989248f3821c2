package dispatch

import (
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

// TestSeatApplicationRootsAreThePodsThatServeIt: a seat group's
// EndpointSlice lists every group pod, whatever its engines do; the
// dispatcher sends an application's requests only to the pods where the
// lifecycle leader says it is awake, and to none before it was told.
func TestSeatApplicationRootsAreThePodsThatServeIt(t *testing.T) {
	slice := []string{"http://10.0.0.1:8081", "http://10.0.0.2:8081"}
	seatPod := func(name, ip string, serves bool) lifecycle.SeatPod {
		return lifecycle.SeatPod{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.PodStatus{PodIP: ip}}, Serves: serves}
	}
	cases := []struct {
		name  string
		slice []string
		pods  []lifecycle.SeatPod // nil: the lifecycle told nothing yet
		want  []string
	}{
		{"not told yet: nothing", slice, nil, nil},
		{"awake in pod 0", slice, []lifecycle.SeatPod{seatPod("g-0", "10.0.0.1", true), seatPod("g-1", "10.0.0.2", false)}, []string{"http://10.0.0.1:8081"}},
		{"awake in pod 1", slice, []lifecycle.SeatPod{seatPod("g-0", "10.0.0.1", false), seatPod("g-1", "10.0.0.2", true)}, []string{"http://10.0.0.2:8081"}},
		{"awake in both", slice, []lifecycle.SeatPod{seatPod("g-0", "10.0.0.1", true), seatPod("g-1", "10.0.0.2", true)}, slice},
		{"asleep everywhere", slice, []lifecycle.SeatPod{seatPod("g-0", "10.0.0.1", false), seatPod("g-1", "10.0.0.2", false)}, nil},
		{"serving, but its EndpointSlice does not list it yet", []string{"http://10.0.0.1:8081"}, []lifecycle.SeatPod{seatPod("g-1", "10.0.0.2", true)}, nil},
		{"a serving pod without an address", slice, []lifecycle.SeatPod{seatPod("g-0", "", true)}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(4, testHealth(), func(string, bool) {})
			v := &rootView{app: App{Name: "alpha"}, pool: p, log: slog.New(slog.DiscardHandler), seat: true}
			v.setSlice(tc.slice)
			if tc.pods != nil {
				v.setSeatPods(tc.pods)
			}
			if diff := cmp.Diff(tc.want, p.urls()); diff != "" {
				t.Errorf("roots (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSeatRootsFollowTheLeader: a root leaves the pool when the leader
// takes the application out of its pod, and comes back when it wakes there.
func TestSeatRootsFollowTheLeader(t *testing.T) {
	p := newPool(4, testHealth(), func(string, bool) {})
	v := &rootView{app: App{Name: "alpha"}, pool: p, log: slog.New(slog.DiscardHandler), seat: true}
	v.setSlice([]string{"http://10.0.0.1:8081", "http://10.0.0.2:8081"})
	pod0 := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "g-0"}, Status: corev1.PodStatus{PodIP: "10.0.0.1"}}
	pod1 := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "g-1"}, Status: corev1.PodStatus{PodIP: "10.0.0.2"}}
	steps := []struct {
		serves0, serves1 bool
		want             []string
	}{
		{true, true, []string{"http://10.0.0.1:8081", "http://10.0.0.2:8081"}},
		{false, true, []string{"http://10.0.0.2:8081"}},
		{false, false, nil},
		{true, false, []string{"http://10.0.0.1:8081"}},
	}
	for i, s := range steps {
		v.setSeatPods([]lifecycle.SeatPod{{Pod: pod0, Serves: s.serves0}, {Pod: pod1, Serves: s.serves1}})
		if diff := cmp.Diff(s.want, p.urls()); diff != "" {
			t.Errorf("step %d: roots (-want +got):\n%s", i, diff)
		}
	}
}
