package nodeagent_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/nodeagent"
)

func TestContainerOfCgroup(t *testing.T) {
	const uid = "6f1c2a4e-0b7d-4c1e-9a51-3d2f8e7b6a10"
	under := strings.ReplaceAll(uid, "-", "_")
	cid := strings.Repeat("0123456789abcdef", 4)
	for name, c := range map[string]struct {
		cgroup string
		want   nodeagent.ProcessContainer
		ok     bool
	}{
		"v2 systemd burstable":                  {"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + under + ".slice/cri-containerd-" + cid + ".scope\n", nodeagent.ProcessContainer{PodUID: uid, ContainerID: cid}, true},
		"v2 systemd guaranteed":                 {"0::/kubepods.slice/kubepods-pod" + under + ".slice/crio-" + cid + ".scope\n", nodeagent.ProcessContainer{PodUID: uid, ContainerID: cid}, true},
		"v2 cgroupfs besteffort":                {"0::/kubepods/besteffort/pod" + uid + "/" + cid + "\n", nodeagent.ProcessContainer{PodUID: uid, ContainerID: cid}, true},
		"v2 seen from another cgroup namespace": {"0::/../../kubepods-burstable-pod" + under + ".slice/cri-containerd-" + cid + ".scope\n", nodeagent.ProcessContainer{PodUID: uid, ContainerID: cid}, true},
		"v1 many hierarchies":                   {"12:pids:/kubepods/burstable/pod" + uid + "/" + cid + "\n11:memory:/kubepods/burstable/pod" + uid + "/" + cid + "\n", nodeagent.ProcessContainer{PodUID: uid, ContainerID: cid}, true},
		"the pod's own cgroup":                  {"0::/kubepods/burstable/pod" + uid + "\n", nodeagent.ProcessContainer{PodUID: uid}, true},
		"a host service":                        {"0::/system.slice/containerd.service\n", nodeagent.ProcessContainer{}, false},
		"a user session":                        {"0::/user.slice/user-0.slice/session-1.scope\n", nodeagent.ProcessContainer{}, false},
		"a pod-like name":                       {"0::/podman/pod-abc\n", nodeagent.ProcessContainer{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := nodeagent.ContainerOfCgroup(c.cgroup)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestMatchReleasePod(t *testing.T) {
	pods := []nodeagent.ReleasePod{
		{Name: "chat-0", UID: "uid-a", Containers: map[string]string{"c1": "engine", "c2": "sidecar"}},
		{Name: "chat-1", UID: "uid-b", Containers: map[string]string{"c3": "engine"}},
	}
	for name, c := range map[string]struct {
		pc             nodeagent.ProcessContainer
		pod, container string
		refused        string
	}{
		"our engine":              {pc: nodeagent.ProcessContainer{PodUID: "uid-b", ContainerID: "c3"}, pod: "chat-1", container: "engine"},
		"another pod":             {pc: nodeagent.ProcessContainer{PodUID: "uid-x", ContainerID: "c3"}, refused: "not a pod of this release on this node"},
		"a container not of ours": {pc: nodeagent.ProcessContainer{PodUID: "uid-a", ContainerID: "c3"}, refused: "not one of pod chat-0's running containers"},
		"the sandbox":             {pc: nodeagent.ProcessContainer{PodUID: "uid-a"}, refused: "sandbox"},
	} {
		t.Run(name, func(t *testing.T) {
			pod, container, err := nodeagent.MatchReleasePod(c.pc, pods)
			if c.refused != "" {
				if !errors.Is(err, nodeagent.ErrNotOfRelease) || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("err = %v, want ErrNotOfRelease saying %q", err, c.refused)
				}
				return
			}
			if err != nil || pod != c.pod || container != c.container {
				t.Fatalf("= %s, %s, %v; want %s, %s", pod, container, err, c.pod, c.container)
			}
		})
	}
}
