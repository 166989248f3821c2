package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/model-orchestra/operator/internal/engineproc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The node agent acts on a process (a process snapshot) only when it runs
// in a container of a pod of the agent's own release on the agent's own
// node. The check starts from the process, not from the caller's word:
//
//  1. /proc/<pid>/cgroup names the pod and the container: the kubelet puts
//     every container in a cgroup below its pod's
//     (".../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope"
//     with the systemd driver, ".../kubepods/burstable/pod<uid>/<id>"
//     with cgroupfs), and a process cannot leave its cgroup for another
//     pod's without the privileges of the node;
//  2. the API server lists the pods of the release (label
//     app.kubernetes.io/instance=<release>) in the agent's namespace on its
//     node (spec.nodeName): the pod UID must be one of them and the
//     container ID one of that pod's containers (status.containerStatuses).
//
// A pod UID is unique in the cluster and never reused, so a pod of another
// release, namespace or tenant cannot pass for one of ours, and neither can
// a host process (no pod cgroup). The alternatives were weaker: the
// process's environment or command line is whatever its image says, the
// kubelet's pod list (/pods on 10250) needs nodes/proxy, which is
// cluster-wide power over every kubelet.

// ErrNotOfRelease refuses an action on a process that does not run in a
// container of a pod of the agent's own release on its node.
var ErrNotOfRelease = errors.New("not a process of this release's engines")

// ProcessOwner checks that a process belongs to an engine of the agent's
// release; the error wraps ErrNotOfRelease when it does not.
type ProcessOwner interface {
	CheckProcess(ctx context.Context, pid int) error
}

// ProcessOwnerFunc adapts a function to ProcessOwner.
type ProcessOwnerFunc func(ctx context.Context, pid int) error

// CheckProcess implements ProcessOwner.
func (f ProcessOwnerFunc) CheckProcess(ctx context.Context, pid int) error { return f(ctx, pid) }

// ProcessContainer is the pod and container of a process, from its cgroup.
type ProcessContainer struct {
	// PodUID is the pod's metadata.uid.
	PodUID string
	// ContainerID is the runtime's container ID (hex), empty when the
	// cgroup path does not end in one (a process of the pod's sandbox).
	ContainerID string
}

var (
	// podSegment matches a pod's cgroup directory: pod<uid> (cgroupfs) or
	// kubepods[-<qos>]-pod<uid with _>.slice (systemd).
	podSegment = regexp.MustCompile(`^(?:kubepods(?:-[a-z]+)?-)?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})(?:\.slice)?$`)
	// containerSegment matches a container's cgroup directory:
	// <runtime>-<id>.scope (systemd) or <id> (cgroupfs).
	containerSegment = regexp.MustCompile(`^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$`)
)

// ContainerOfCgroup reads the pod and container of a process from the
// text of its /proc/<pid>/cgroup (cgroup v1 or v2, either driver, paths
// relative to a cgroup namespace included).
func ContainerOfCgroup(text string) (ProcessContainer, bool) {
	for _, line := range strings.Split(text, "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		segs := strings.Split(parts[2], "/")
		for i, s := range segs {
			m := podSegment.FindStringSubmatch(s)
			if m == nil {
				continue
			}
			pc := ProcessContainer{PodUID: strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))}
			if i+1 < len(segs) {
				if c := containerSegment.FindStringSubmatch(segs[i+1]); c != nil {
					pc.ContainerID = c[1]
				}
			}
			return pc, true
		}
	}
	return ProcessContainer{}, false
}

// ReleasePod is a pod of the release on the agent's node.
type ReleasePod struct {
	Name string
	UID  string
	// Containers maps the runtime's container IDs (without the
	// "<runtime>://" prefix) of the pod's containers to their names.
	Containers map[string]string
}

// MatchReleasePod finds the pod and container of pc among pods; the error
// (wrapping ErrNotOfRelease) says what did not match.
func MatchReleasePod(pc ProcessContainer, pods []ReleasePod) (pod, container string, err error) {
	for _, p := range pods {
		if p.UID != pc.PodUID {
			continue
		}
		if pc.ContainerID == "" {
			return "", "", fmt.Errorf("%w: it runs in pod %s's sandbox, not in one of its containers", ErrNotOfRelease, p.Name)
		}
		name, ok := p.Containers[pc.ContainerID]
		if !ok {
			return "", "", fmt.Errorf("%w: its container %.12s is not one of pod %s's running containers", ErrNotOfRelease, pc.ContainerID, p.Name)
		}
		return p.Name, name, nil
	}
	return "", "", fmt.Errorf("%w: its pod (uid %s) is not a pod of this release on this node", ErrNotOfRelease, pc.PodUID)
}

// PodLister lists the release's pods on the agent's node.
type PodLister interface {
	ReleasePods(ctx context.Context) ([]ReleasePod, error)
}

// ReleaseProcesses is the ProcessOwner of a node agent in a cluster: the
// process's cgroup read from Proc, the pods from Pods.
type ReleaseProcesses struct {
	Proc engineproc.ProcFS
	Pods PodLister
}

// CheckProcess implements ProcessOwner.
func (r ReleaseProcesses) CheckProcess(ctx context.Context, pid int) error {
	b, err := os.ReadFile(filepath.Join(r.Proc.Dir(), strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return fmt.Errorf("process %d: %w: reading its cgroup: %w", pid, ErrNotOfRelease, err)
	}
	pc, ok := ContainerOfCgroup(string(b))
	if !ok {
		return fmt.Errorf("process %d: %w: its cgroup (%s) is no pod's", pid, ErrNotOfRelease, strings.TrimSpace(string(b)))
	}
	pods, err := r.Pods.ReleasePods(ctx)
	if err != nil {
		return fmt.Errorf("process %d: listing the release's pods to check its owner: %w", pid, err)
	}
	if _, _, err := MatchReleasePod(pc, pods); err != nil {
		return fmt.Errorf("process %d: %w", pid, err)
	}
	return nil
}

// noProcessOwner refuses every process: the agent was not told its
// release, node and API access, so it cannot tell its release's
// processes from others.
type noProcessOwner struct{ why string }

func (o noProcessOwner) CheckProcess(_ context.Context, pid int) error {
	return fmt.Errorf("process %d: %w: %s", pid, ErrNotOfRelease, o.why)
}

// apiPods lists the release's pods through the API server: one list of
// pods in the namespace with the release's instance label on the node.
type apiPods struct {
	cs                       kubernetes.Interface
	namespace, release, node string
}

// NewAPIPodLister lists the pods of release in namespace on node through
// the API server at cfg (list on pods in namespace).
func NewAPIPodLister(cfg *rest.Config, namespace, release, node string) (PodLister, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return apiPods{cs: cs, namespace: namespace, release: release, node: node}, nil
}

func (a apiPods) ReleasePods(ctx context.Context) ([]ReleasePod, error) {
	list, err := a.cs.CoreV1().Pods(a.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{"app.kubernetes.io/instance": a.release}.String(),
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", a.node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of release %s in %s on node %s: %w", a.release, a.namespace, a.node, err)
	}
	out := make([]ReleasePod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, releasePodOf(&list.Items[i]))
	}
	return out, nil
}

func releasePodOf(p *corev1.Pod) ReleasePod {
	rp := ReleasePod{Name: p.Name, UID: string(p.UID), Containers: map[string]string{}}
	for _, st := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range st {
			if _, id, ok := strings.Cut(c.ContainerID, "://"); ok && id != "" {
				rp.Containers[id] = c.Name
			}
		}
	}
	return rp
}
