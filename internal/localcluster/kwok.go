package localcluster

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// kwokStages tells kwok how simulated nodes and pods behave.
//
//go:embed kwok-stages.yaml
var kwokStages []byte

// Labels and annotations on kwok nodes.
const (
	// AnnotationKwokNode marks nodes that kwok manages.
	AnnotationKwokNode = "kwok.x-k8s.io/node"
	// LabelNodeType is "kwok" on simulated nodes and "real" on the real node.
	LabelNodeType = "type"
)

// kwokPodCIDR is where kwok takes pod IPs from; it does not overlap the
// real node's pod or service ranges.
const kwokPodCIDR = "10.200.0.0/16"

// startKwok runs kwok for the nodes annotated as kwok nodes, creates them
// and waits until they are Ready.
func (c *Cluster) startKwok(ctx context.Context, cs kubernetes.Interface) error {
	bin, err := c.opts.binary("kwok")
	if err != nil {
		return err
	}
	dir := c.path("kwok")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stages := c.path("kwok", "stages.yaml")
	if err := os.WriteFile(stages, kwokStages, 0o644); err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + c.path("admin.kubeconfig"),
		"--config=" + stages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + AnnotationKwokNode + "=fake",
		"--cidr=" + kwokPodCIDR,
		"--node-lease-duration-seconds=40",
	}
	// kwok reads ~/.kwok/kwok.yaml when it exists; give it a home of its own
	// so that a developer's kwok settings cannot change the tests.
	env := []string{"HOME=" + dir, "KWOK_WORKDIR=" + dir}
	p, err := startProcess(c.logDir, "kwok", bin, args, env)
	if err != nil {
		return err
	}
	c.track(p)
	for i, n := range c.opts.KwokNodes {
		node, err := kwokNodeObject(n, i)
		if err != nil {
			return err
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating kwok node %s: %w", n.Name, err)
		}
	}
	for _, n := range c.opts.KwokNodes {
		if err := c.waitNodeReady(ctx, cs, n.Name); err != nil {
			return err
		}
	}
	return nil
}

// kwokNodeObject builds the Node for a simulated node. Its capacity is set
// at creation; kwok keeps it and only moves the node to Ready.
func kwokNodeObject(n KwokNode, index int) (*corev1.Node, error) {
	cpu, err := resource.ParseQuantity(n.CPU)
	if err != nil {
		return nil, fmt.Errorf("kwok node %s: cpu: %w", n.Name, err)
	}
	mem, err := resource.ParseQuantity(n.Memory)
	if err != nil {
		return nil, fmt.Errorf("kwok node %s: memory: %w", n.Name, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    cpu,
		corev1.ResourceMemory: mem,
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	labels := map[string]string{
		"kubernetes.io/hostname": n.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		LabelNodeType:            "kwok",
	}
	if n.GPUs > 0 {
		capacity[ResourceGPU] = *resource.NewQuantity(int64(n.GPUs), resource.DecimalSI)
		labels[LabelGPUProduct] = n.GPUProduct
		labels[LabelGPUCount] = strconv.Itoa(n.GPUs)
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	// Addresses from 10.210.0.0/16, one per node.
	ip := fmt.Sprintf("10.210.%d.%d", (index/250)%250, index%250+1)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        n.Name,
			Labels:      labels,
			Annotations: map[string]string{AnnotationKwokNode: "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{Taints: n.Taints},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: ip},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
		},
	}, nil
}

// waitNodeReady waits for the node's Ready condition to be True.
func (c *Cluster) waitNodeReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	return poll(ctx, 200*time.Millisecond, "node "+name+" to be Ready", func(ctx context.Context) (bool, error) {
		if err := c.checkProcesses(); err != nil {
			return false, err
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}
