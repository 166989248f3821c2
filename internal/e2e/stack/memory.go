package stack

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Memory is what a container's memory cgroup on the real node charges to
// it, in bytes. Shmem counts tmpfs pages the container touched first (a
// sleeping simulator's level-1 offload in the hot tier), which count
// against its memory limit like any other page.
type Memory struct {
	Usage int64 // memory.usage_in_bytes (v1) or memory.current (v2)
	Peak  int64 // memory.max_usage_in_bytes (v1) or memory.peak (v2)
	Shmem int64 // "shmem" of memory.stat
	RSS   int64 // "rss" (v1) or "anon" (v2) of memory.stat: anonymous memory
	Cache int64 // "cache" (v1) or "file" (v2) of memory.stat: page cache, shmem included
	Limit int64 // memory.limit_in_bytes (v1) or memory.max (v2); 0 when unlimited
}

// String is the memory in MiB, for logs.
func (m Memory) String() string {
	return fmt.Sprintf("usage %d MiB (anon %d, cache %d, tmpfs %d), peak %d MiB, limit %d MiB",
		m.Usage>>20, m.RSS>>20, m.Cache>>20, m.Shmem>>20, m.Peak>>20, m.Limit>>20)
}

// ContainerMemory reads the memory cgroup of a running container of a pod
// on the real node (the kubelet's cgroupfs driver, cgroup v1 or v2).
func ContainerMemory(ctx context.Context, cs kubernetes.Interface, namespace, pod, container string) (Memory, error) {
	p, err := cs.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return Memory{}, fmt.Errorf("reading pod %s/%s: %w", namespace, pod, err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != container {
			continue
		}
		_, id, ok := strings.Cut(s.ContainerID, "://")
		if !ok || s.State.Running == nil {
			return Memory{}, fmt.Errorf("container %s of pod %s/%s is not running (%q)", container, namespace, pod, s.ContainerID)
		}
		dir, v2, err := memoryCgroup(id)
		if err != nil {
			return Memory{}, fmt.Errorf("container %s of pod %s/%s: %w", container, namespace, pod, err)
		}
		return readMemory(dir, v2)
	}
	return Memory{}, fmt.Errorf("pod %s/%s has no container %s", namespace, pod, container)
}

// memoryCgroup finds the memory cgroup directory of the container id.
func memoryCgroup(id string) (dir string, v2 bool, err error) {
	for _, c := range []struct {
		root string
		v2   bool
	}{{"/sys/fs/cgroup/memory/kubepods", false}, {"/sys/fs/cgroup/kubepods", true}} {
		if _, err := os.Stat(c.root); err != nil {
			continue
		}
		_ = filepath.WalkDir(c.root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil //nolint:nilerr // cgroups come and go while we walk
			}
			if d.Name() == id {
				dir = path
				return filepath.SkipAll
			}
			return nil
		})
		if dir != "" {
			return dir, c.v2, nil
		}
	}
	return "", false, fmt.Errorf("no memory cgroup named %s on this node", id)
}

func readMemory(dir string, v2 bool) (Memory, error) {
	names := [3]string{"memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.limit_in_bytes"}
	if v2 {
		names = [3]string{"memory.current", "memory.peak", "memory.max"}
	}
	var vals [3]int64
	for i, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return Memory{}, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		if vals[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return Memory{}, fmt.Errorf("%s: %w", n, err)
		}
	}
	m := Memory{Usage: vals[0], Peak: vals[1], Limit: vals[2]}
	if m.Limit >= 1<<62 { // v1 writes "unlimited" as a page-rounded max int64
		m.Limit = 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return Memory{}, err
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "shmem":
			m.Shmem = n
		case "rss", "anon":
			m.RSS = n
		case "cache", "file":
			m.Cache = n
		}
	}
	return m, nil
}
