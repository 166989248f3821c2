//go:build !linux

package localcluster

import (
	"context"
	"os"

	"k8s.io/client-go/kubernetes"
)

// Owner is the record of a real-node cluster; real-node mode is Linux only.
type Owner struct {
	PID     int
	WorkDir string
}

type realNode struct{}

func acquireRealNode(context.Context, Options) (*realNode, error) {
	return nil, ErrRealNodeUnsupported
}

// ReadOwner reports that no real-node cluster runs: the mode is Linux only.
func ReadOwner() (Owner, error) { return Owner{}, os.ErrNotExist }

// CleanupStale does nothing: real-node mode is Linux only.
func CleanupStale(context.Context) error { return nil }

// ProcessesUsing is only implemented on Linux.
func ProcessesUsing(string) []int { return nil }

func (*realNode) recordOwner(string) error          { return ErrRealNodeUnsupported }
func (*realNode) prepareHost(context.Context) error { return ErrRealNodeUnsupported }
func (*realNode) start(context.Context, *Cluster, kubernetes.Interface) error {
	return ErrRealNodeUnsupported
}
func (*realNode) stop(*Cluster, []*process) error { return nil }
func (*realNode) cleanupHost(string) error        { return nil }
func (*realNode) release()                        {}

// ImportImage needs a real node, which needs Linux.
func (c *Cluster) ImportImage(context.Context, string) error { return ErrNoRealNode }

func importImage(context.Context, string, string) error { return ErrNoRealNode }

// OwnIPTablesChains is only implemented on Linux.
func OwnIPTablesChains(string) []string { return nil }
