package dispatch

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

func TestPodProgress(t *testing.T) {
	pod := func(name string, mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if mut != nil {
			mut(p)
		}
		return p
	}
	scheduled := func(p *corev1.Pod) { p.Spec.NodeName = "node-a" }
	unschedulable := func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: "Unschedulable", Message: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}}
	}
	fetching := func(p *corev1.Pod) {
		scheduled(p)
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "fetch", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	}
	creating := func(p *corev1.Pod) {
		scheduled(p)
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "engine", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
	}
	running := func(p *corev1.Pod) {
		scheduled(p)
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "engine", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	}
	for _, tc := range []struct {
		name string
		pods []lifecycle.RootPod
		want string
	}{
		{"no pods", nil, ""},
		{"pending", []lifecycle.RootPod{{Pod: pod("r-0", nil)}}, "pod r-0 is waiting to be scheduled"},
		{"unschedulable", []lifecycle.RootPod{{Pod: pod("r-0", unschedulable)}},
			"pod r-0 is not scheduled yet (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"},
		{"init container", []lifecycle.RootPod{{Pod: pod("r-0", fetching)}}, "pod r-0 is scheduled on node node-a; its init container fetch prepares the model"},
		{"creating", []lifecycle.RootPod{{Pod: pod("r-0", creating)}}, "pod r-0 is scheduled on node node-a; starting container engine (ContainerCreating)"},
		{"loading", []lifecycle.RootPod{{Pod: pod("r-0", running)}}, "pod r-0 is scheduled on node node-a; the engine is running and loading the model"},
		{"the furthest pod", []lifecycle.RootPod{{Pod: pod("r-0", nil)}, {Pod: pod("r-1", running)}, {Pod: pod("r-2", creating)}},
			"pod r-1 is scheduled on node node-a; the engine is running and loading the model"},
		{"ready", []lifecycle.RootPod{{Pod: pod("r-0", running), Serves: true}}, "pod r-0 is ready"},
		{"terminating pods do not count", []lifecycle.RootPod{{Pod: pod("r-0", func(p *corev1.Pod) {
			running(p)
			p.DeletionTimestamp = &metav1.Time{}
		}), Serves: true}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := podProgress(tc.pods); got != tc.want {
				t.Errorf("podProgress = %q, want %q", got, tc.want)
			}
		})
	}
}
