package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// TestSidecarRestartsAnEngineByItsProcessInAPod runs, on the real-node
// cluster, a pod shaped as a seat group's: a shared process namespace, a
// simulator engine without --restartable whose sleep keeps its memory
// (vllm#47654), and its sidecar with --restart-process, both as the
// same user with every capability dropped, which is all the kernel asks of
// a process that signals another and reads its open files. The chart runs
// a sidecar as its engine's user: root for upstream images that run as root,
// 65532:65532 for Ollama and the simulator. The sidecar's POST /restart stops
// the engine's process, the kubelet starts its container again, and the
// sidecar answers once the new engine sleeps at level 2: only the engine
// container restarted, and the next wake serves.
func TestSidecarRestartsAnEngineByItsProcessInAPod(t *testing.T) {
	requireCluster(t)
	for _, c := range []struct {
		name string
		ns   string
		user int64
	}{
		{"as root, the user of upstream engine images", "e2e-sidecar-restart", 0},
		{"as 65532, the user of Ollama and the simulator", "e2e-sidecar-nonroot", 65532},
	} {
		t.Run(c.name, func(t *testing.T) { sidecarRestartsItsEngine(t, c.ns, c.user) })
	}
}

func sidecarRestartsItsEngine(t *testing.T, namespace string, user int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, namespace)
	sc := func() *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsUser: ptr.To(user), RunAsGroup: ptr.To(user), RunAsNonRoot: ptr.To(user != 0),
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
	}
	image := func(name string) string { return "ghcr.io/model-orchestra/" + name + ":v1.0.0" }
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "group", Namespace: ns},
		Spec: corev1.PodSpec{
			ShareProcessNamespace:        ptr.To(true),
			AutomountServiceAccountToken: ptr.To(false),
			RestartPolicy:                corev1.RestartPolicyAlways,
			Containers: []corev1.Container{
				{
					Name: "engine", Image: image("orchestra-sim"), ImagePullPolicy: corev1.PullNever,
					Args:            []string{"--addr=:8080", "--weights-bytes=4MiB", "--enable-sleep-mode", "--hot-dir=/hot", "--fault-sleep-leak"},
					VolumeMounts:    []corev1.VolumeMount{{Name: "hot", MountPath: "/hot"}},
					SecurityContext: sc(),
				},
				{
					Name: "sidecar", Image: image("orchestra-agent"), ImagePullPolicy: corev1.PullNever,
					Args:            []string{"--role=sidecar", "--engine=simulator", "--engine-url=http://127.0.0.1:8080", "--addr=:9300", "--restart-process", "--restart-grace=5s"},
					SecurityContext: sc(),
				},
			},
			Volumes: []corev1.Volume{{Name: "hot", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}},
		},
	}
	created, err := env.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, func() error {
		st, err := sidecarState(ctx, ns, "group")
		if err == nil && st.State != sidecarapi.Awake {
			err = fmt.Errorf("sidecar %s", st.State)
		}
		return err
	})
	if user != 0 {
		for _, pr := range podProcesses(t, string(created.UID)) {
			if pr.uid == 0 || pr.gid == 0 || slices.Contains(pr.groups, 0) {
				t.Errorf("process %d (%s) runs as uid %d, gid %d, groups %v; want none of root's", pr.pid, pr.name, pr.uid, pr.gid, pr.groups)
			}
		}
	}

	must(t, seatPost(ctx, ns, "group", "sleep"))
	st, err := sidecarState(ctx, ns, "group")
	must(t, err)
	if st.ResidentBytes == nil || *st.ResidentBytes != 4<<20 {
		t.Fatalf("after the leaking sleep: resident %v, want the 4 MiB kept", st.ResidentBytes)
	}
	start := time.Now()
	must(t, seatPost(ctx, ns, "group", "restart"))
	t.Logf("restart by the process took %s", time.Since(start).Round(time.Millisecond))
	st, err = sidecarState(ctx, ns, "group")
	must(t, err)
	if st.State != sidecarapi.Asleep || st.Level != 2 || st.Restarts != 1 || st.LastRestart == nil || st.LastRestart.Via != sidecarapi.RestartViaProcess {
		t.Errorf("after the restart: state %s level %d restarts %d lastRestart %+v; want Asleep at level 2, one restart via process", st.State, st.Level, st.Restarts, st.LastRestart)
	}
	// The fault is deterministic: the new process's level-2 sleep after
	// its start keeps its weights too, which the leader would see and
	// restart again (docs/checkpoint.md); what the restart freed is the old
	// process's memory, which ended with it.
	// The kubelet reports the restart in the pod's status a moment after
	// the new engine answers the seat.
	eventually(t, 30*time.Second, func() error {
		p, err := env.cs.CoreV1().Pods(ns).Get(ctx, "group", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cs := range p.Status.ContainerStatuses {
			want := int32(0)
			if cs.Name == "engine" {
				want = 1
			}
			if cs.RestartCount != want {
				return fmt.Errorf("container %s restarted %d times, want %d", cs.Name, cs.RestartCount, want)
			}
		}
		return nil
	})
	must(t, seatPost(ctx, ns, "group", "wake"))
}

// seatPost calls POST path on the pod's seat through the API server's pod
// proxy and returns the error's body, nil on a 2xx.
func seatPost(ctx context.Context, ns, pod, path string) error {
	req := env.cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod + ":" + strconv.Itoa(sidecarPort)).
		SubResource("proxy").Suffix(path)
	if err := req.Do(ctx).Error(); err != nil {
		return fmt.Errorf("POST %s on the seat of %s: %w", path, pod, err)
	}
	return nil
}
