package nodeagent

import (
	"errors"
	"fmt"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// NodeConfig configures the node agent (orchestra-agent --role node).
type NodeConfig struct {
	Store StoreConfig `json:"store"`
	// ColdDir is where the cold tier (the model cache) is mounted; promotion
	// sources are paths inside it.
	ColdDir string `json:"coldDir,omitempty"`
	// ColdS3 are the S3 objects the agent may read as cold copies
	// (--cold-s3), each named for its application; a promotion or a wake
	// names one (coldS3).
	ColdS3 []ColdS3Source `json:"coldS3,omitempty"`
	// MeasureBytes is the size of the bandwidth probes run at start (0: do
	// not measure).
	MeasureBytes int64 `json:"measureBytes"`
	// RuntimeVersion is the node's container runtime as Kubernetes reports
	// it (status.nodeInfo.containerRuntimeVersion, e.g. containerd://1.6.20),
	// an override; empty: read it from the node NodeName through the API
	// server, else ask the containerd binary if there is one.
	RuntimeVersion string `json:"runtimeVersion,omitempty"`
	// NodeName is the agent's node (the downward API's spec.nodeName, the
	// NODE_NAME environment variable), whose runtime version the agent
	// reads with its ServiceAccount (get on nodes).
	NodeName string `json:"nodeName,omitempty"`
	// Release is the agent's Helm release (the app.kubernetes.io/instance
	// label of its pods): a process snapshot is taken only of a process in
	// a container of a pod of this release, in Store.Namespace, on NodeName.
	Release string `json:"release,omitempty"`
	// CRIU is the criu binary probed with `criu check` ("" skips it).
	CRIU string `json:"criu,omitempty"`
	// MountHotTier mounts a tmpfs with huge=within_size and the hot budget
	// as its size at the hot directory when it is not a mount point yet
	// (needs CAP_SYS_ADMIN). Off, the directory is used as it is.
	MountHotTier bool `json:"mountHotTier,omitempty"`
	// VerifyInterval is the period at which the agent re-hashes every copy
	// it keeps and drops one that no longer matches its digest (0: never).
	// The chart passes the shortest triggers.intervalSeconds of the
	// release's sleeping applications.
	VerifyInterval time.Duration `json:"verifyInterval,omitempty"`
	// SnapshotDir holds process snapshots (criu images); empty disables
	// them. They are taken only when the node's report says criu works.
	SnapshotDir string `json:"snapshotDir,omitempty"`
	// PromoteInterval is the period at which the agent predicts each
	// artifact's next wake from the wakes the leader reports (POST /wakes)
	// and promotes the artifacts whose wake is due, one tier up (0: never).
	PromoteInterval time.Duration `json:"promoteInterval,omitempty"`
	// CallerTokenFile holds the release's caller token (a mounted Secret
	// key, --caller-token-file): the agent's mutating endpoints accept only
	// requests that carry it (internal/nodeapi). Empty: they accept any
	// caller the network lets through, which only tests and development
	// setups should do; the agent says so when it starts.
	CallerTokenFile string `json:"callerTokenFile,omitempty"`
	// PromoteMargin is added to a promotion's copy time: it starts that
	// much before the copies strictly need to.
	PromoteMargin time.Duration `json:"promoteMargin,omitempty"`
}

// DefaultNodeConfig returns the node agent's defaults.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{
		Store: StoreConfig{
			HotDir:  "/dev/shm/model-orchestra",
			WarmDir: "/var/lib/model-orchestra/warm",
			Budgets: nodeapi.Budgets{Hot: 8 << 30, Warm: 100 << 30},
		},
		MeasureBytes:    256 << 20,
		CRIU:            "criu",
		VerifyInterval:  v1alpha1.DefaultVerifyInterval,
		PromoteInterval: 10 * time.Second,
		PromoteMargin:   30 * time.Second,
	}
}

// Validate reports every invalid field.
func (n NodeConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if n.Store.HotDir == "" || n.Store.WarmDir == "" {
		bad("hot and warm directories are required")
	}
	if n.Store.HotDir == n.Store.WarmDir && n.Store.HotDir != "" {
		bad("hot and warm directories must differ, both are %s", n.Store.HotDir)
	}
	if ns := n.Store.Namespace; ns != "" && !nodeapi.ValidNamespace(ns) {
		bad("namespace %q must be a Kubernetes namespace name (a DNS label)", ns)
	}
	if n.Store.Group < 0 {
		bad("copy group must be a group id (0 for none), got %d", n.Store.Group)
	}
	if n.Store.Budgets.Hot < 0 || n.Store.Budgets.Warm < 0 {
		bad("budgets must not be negative")
	}
	if n.MeasureBytes < 0 {
		bad("measure bytes must not be negative")
	}
	if n.VerifyInterval < 0 {
		bad("verify interval must not be negative, got %v", n.VerifyInterval)
	}
	names := map[string]bool{}
	for _, c := range n.ColdS3 {
		if err := c.Validate(); err != nil {
			errs = append(errs, err)
		}
		if names[c.Name] {
			bad("cold S3 source %q is given twice", c.Name)
		}
		names[c.Name] = true
	}
	if n.SnapshotDir != "" && (n.Release == "" || n.Store.Namespace == "" || n.NodeName == "") {
		bad("process snapshots (snapshot dir %s) need --release, --namespace and --node-name: the agent snapshots only the processes of its release's pods on its node", n.SnapshotDir)
	}
	if n.PromoteInterval < 0 || n.PromoteMargin < 0 {
		bad("promote interval and margin must not be negative, got %v and %v", n.PromoteInterval, n.PromoteMargin)
	}
	return errors.Join(errs...)
}
