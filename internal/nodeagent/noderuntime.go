package nodeagent

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// NodeRuntimeReader reads a node's container runtime version as Kubernetes
// reports it (status.nodeInfo.containerRuntimeVersion).
type NodeRuntimeReader interface {
	ContainerRuntimeVersion(ctx context.Context, node string) (string, error)
}

// apiNodes reads Node objects from the API server: one get, the only
// verb the agent's ServiceAccount holds.
type apiNodes struct{ cs kubernetes.Interface }

// NewNodeRuntimeReader reads nodes through the API server at cfg.
func NewNodeRuntimeReader(cfg *rest.Config) (NodeRuntimeReader, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return apiNodes{cs: cs}, nil
}

func (a apiNodes) ContainerRuntimeVersion(ctx context.Context, node string) (string, error) {
	n, err := a.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsForbidden(err) {
		return "", fmt.Errorf("reading node %s: %w: grant the agent's ServiceAccount get on nodes (docs/checkpoint.md), or set the agent chart's runtimeVersion", node, err)
	}
	if err != nil {
		return "", fmt.Errorf("reading node %s: %w", node, err)
	}
	if v := n.Status.NodeInfo.ContainerRuntimeVersion; v != "" {
		return v, nil
	}
	return "", fmt.Errorf("node %s reports no status.nodeInfo.containerRuntimeVersion", node)
}

// inClusterNodes is the reader of the agent's own node in a pod: its
// ServiceAccount through the in-cluster configuration. Without one (no
// token mounted) it says why.
func inClusterNodes() (NodeRuntimeReader, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no API access to read the node (%w): the agent chart mounts the token of the agent's ServiceAccount unless runtimeVersion is set", err)
	}
	return NewNodeRuntimeReader(cfg)
}
