package checkpoint

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// Roles of orchestra-agent.
const (
	// RoleSeat is the sidecar in each engine pod.
	RoleSeat = "seat"
	// RoleNode is the DaemonSet that owns the node's hot and warm tiers.
	RoleNode = "node"
)

// Config configures orchestra-agent. Default holds every default;
// Validate reports every invalid field at once.
type Config struct {
	// Role is seat or node.
	Role string `json:"role"`
	// Addr is the HTTP listen address of the agent's API, /readyz and
	// /metrics.
	Addr string     `json:"addr"`
	Seat SeatConfig `json:"seat"`
	Node NodeConfig `json:"node"`
}

// SeatConfig configures the seat role.
type SeatConfig struct {
	Engine EngineConfig `json:"engine"`
	// SleepLevel is used when a sleep names none: 1 keeps the weights in
	// host RAM, 2 drops them.
	SleepLevel int `json:"sleepLevel"`
	// DrainTimeout bounds the wait for in-flight requests before a sleep;
	// past it the sleep fails and the engine stays awake.
	DrainTimeout time.Duration `json:"drainTimeout"`
	// SleepTimeout and WakeTimeout bound the engine calls.
	SleepTimeout time.Duration `json:"sleepTimeout"`
	WakeTimeout  time.Duration `json:"wakeTimeout"`
	// PollInterval paces drain checks and the engine state watch.
	PollInterval time.Duration `json:"pollInterval"`
	// RestartProcess lets POST /restart stop the engine container's
	// processes (SIGTERM, then SIGKILL after RestartGrace) so that the
	// kubelet starts the container again, for an engine that cannot
	// restart itself. It needs a pod with shareProcessNamespace and the
	// seat running as the engine's user; no capability.
	RestartProcess bool `json:"restartProcess,omitempty"`
	// RestartGrace is the wait between SIGTERM and SIGKILL.
	RestartGrace time.Duration `json:"restartGrace"`
	// NvidiaSMI is the nvidia-smi binary the seat reads the engine's
	// device memory with, attributed by the PIDs of the engine container's
	// processes (needs shareProcessNamespace); empty: not read.
	NvidiaSMI string `json:"nvidiaSMI,omitempty"`
	// Model points the engine at the hottest verified copy of its model
	// file on the node (modelcopy.go); zero: not pointed.
	Model ModelCopiesConfig `json:"model,omitzero"`
	// CallerTokenFile holds the release's caller token (a mounted Secret
	// key, --caller-token-file), as for the node agent: the sidecar's
	// mutating endpoints (sleep, wake, restart) accept only requests
	// carrying it; empty accepts any caller the network lets through.
	CallerTokenFile string `json:"callerTokenFile,omitempty"`
	// Proc is the procfs the seat reads processes from (default /proc).
	Proc ProcFS `json:"-"`
}

// enginePort is the TCP port of an engine URL (the scheme's default when
// the URL names none), or 0 when it has none.
func enginePort(raw string) int {
	u, err := url.Parse(raw)
	if err != nil {
		return 0
	}
	p := u.Port()
	if p == "" {
		switch u.Scheme {
		case "http":
			return 80
		case "https":
			return 443
		}
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// NodeConfig configures the node role.
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

// Default returns the defaults of both roles.
func Default() Config {
	return Config{
		Role: RoleSeat,
		Addr: ":8090",
		Seat: SeatConfig{
			Engine:       EngineConfig{Kind: EngineVLLM, URL: "http://127.0.0.1:8000", KeepAlive: "-1", PollInterval: 100 * time.Millisecond},
			SleepLevel:   int(v1alpha1.DefaultSleepLevel),
			DrainTimeout: 30 * time.Second,
			SleepTimeout: 2 * time.Minute,
			WakeTimeout:  v1alpha1.EngineWakeTimeout,
			PollInterval: 100 * time.Millisecond,
			RestartGrace: 30 * time.Second,
		},
		Node: NodeConfig{
			Store: StoreConfig{
				HotDir:  "/dev/shm/model-orchestra",
				WarmDir: "/var/lib/model-orchestra/warm",
				Budgets: Budgets{Hot: 8 << 30, Warm: 100 << 30},
			},
			MeasureBytes:    256 << 20,
			CRIU:            "criu",
			VerifyInterval:  v1alpha1.DefaultVerifyInterval,
			PromoteInterval: 10 * time.Second,
			PromoteMargin:   30 * time.Second,
		},
	}
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Addr == "" {
		bad("addr must not be empty")
	}
	switch c.Role {
	case RoleSeat:
		s := c.Seat
		if _, err := NewEngine(s.Engine, nil); err != nil {
			errs = append(errs, err)
		}
		if u, err := url.Parse(s.Engine.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("engine url %q must be an http(s) URL such as http://127.0.0.1:8000", s.Engine.URL)
		}
		if s.SleepLevel != 1 && s.SleepLevel != 2 {
			bad("sleep level must be 1 or 2, got %d", s.SleepLevel)
		}
		if s.RestartProcess || s.NvidiaSMI != "" {
			if _, err := NewEngineProcess(s.Engine.Kind, enginePort(s.Engine.URL), s.RestartGrace); err != nil {
				bad("finding the engine's processes (restart-process, nvidia-smi): %v", err)
			}
			if s.RestartProcess && s.RestartGrace <= 0 {
				bad("restart grace must be positive, got %v", s.RestartGrace)
			}
		}
		errs = append(errs, s.Model.validate(s.Engine.Kind)...)
		for name, d := range map[string]time.Duration{"drain timeout": s.DrainTimeout, "sleep timeout": s.SleepTimeout, "wake timeout": s.WakeTimeout, "poll interval": s.PollInterval} {
			if d <= 0 {
				bad("%s must be positive, got %v", name, d)
			}
		}
	case RoleNode:
		n := c.Node
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
	default:
		bad("role must be %s or %s, got %q", RoleSeat, RoleNode, c.Role)
	}
	return errors.Join(errs...)
}
