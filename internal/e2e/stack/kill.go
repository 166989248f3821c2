package stack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrNoProcess means a container has no process on this node.
var ErrNoProcess = errors.New("no process of the container on this node")

// KillContainer sends SIGKILL to every process of a container of a pod on
// the real node, as when it crashes or the kernel kills it: nothing is
// flushed, no connection is closed cleanly. The kubelet restarts it in
// place under the pod's restart policy, with the same pod IP and volumes.
// It returns the container's restart count before the kill, so that a
// caller can wait for the restart.
func KillContainer(ctx context.Context, cs kubernetes.Interface, namespace, pod, container string) (int32, error) {
	p, err := cs.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("reading pod %s/%s: %w", namespace, pod, err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != container {
			continue
		}
		_, id, ok := strings.Cut(s.ContainerID, "://")
		if !ok || s.State.Running == nil {
			return 0, fmt.Errorf("container %s of pod %s/%s is not running (%q)", container, namespace, pod, s.ContainerID)
		}
		if _, err := killCgroup(id); err != nil {
			return 0, fmt.Errorf("killing container %s of pod %s/%s: %w", container, namespace, pod, err)
		}
		return s.RestartCount, nil
	}
	return 0, fmt.Errorf("pod %s/%s has no container %s", namespace, pod, container)
}

// killCgroup kills the processes of the container whose cgroup directory
// is named id: the kubelet's cgroupfs driver puts each container in
// kubepods/.../pod<uid>/<container id> of every hierarchy.
func killCgroup(id string) (int, error) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/kubepods")
	}
	pids := map[int]bool{}
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() != id {
				return nil //nolint:nilerr // cgroups come and go while we walk
			}
			data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil //nolint:nilerr // as above
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					pids[pid] = true
				}
			}
			return filepath.SkipDir
		})
	}
	if len(pids) == 0 {
		return 0, ErrNoProcess
	}
	for pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("SIGKILL to %d: %w", pid, err)
		}
	}
	return len(pids), nil
}
