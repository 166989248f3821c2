package localcluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ModulePath is the Go module whose root holds the default bin/ directory.
const ModulePath = "github.com/model-orchestra/operator"

// Environment variables read by Options.Default.
const (
	// EnvBinDir overrides the directory that holds the Kubernetes binaries.
	EnvBinDir = "MO_BIN_DIR"
	// EnvKubebuilderAssets is envtest's directory for etcd and kube-apiserver;
	// when set, those two binaries are taken from it if present.
	EnvKubebuilderAssets = "KUBEBUILDER_ASSETS"
)

// ErrBinaryNotFound is returned when a component binary is missing.
var ErrBinaryNotFound = errors.New("binary not found")

// Options describe the cluster to start. The zero value is a bare control
// plane (etcd and kube-apiserver) with binaries from <module root>/bin.
type Options struct {
	// BinDir holds the component binaries (etcd, kube-apiserver,
	// kube-controller-manager, kube-scheduler, kwok, kubelet, kube-proxy,
	// coredns). Default: $MO_BIN_DIR, else <module root>/bin. When
	// $KUBEBUILDER_ASSETS is set, etcd and kube-apiserver are taken from it
	// if they are present there.
	BinDir string

	// ControllerManager starts kube-controller-manager (garbage collection,
	// Deployments, Jobs, ServiceAccounts, PersistentVolume binding, ...).
	ControllerManager bool

	// Scheduler starts kube-scheduler.
	Scheduler bool

	// Profiling serves kube-apiserver's /debug/pprof (to its admin
	// client), for benchmarks that profile the API server. Default off.
	Profiling bool

	// KwokNodes are simulated nodes run by kwok. Pods bound to them become
	// Running and Ready, and pods owned by a Job succeed. They only make
	// sense together with ControllerManager and Scheduler.
	KwokNodes []KwokNode

	// RealNode adds a node that runs real containers (Linux, root only):
	// containerd, kubelet, kube-proxy, the bridge CNI, cluster DNS and a
	// storage provisioner. It implies ControllerManager and Scheduler. Only
	// one real-node cluster can run on a machine at a time.
	RealNode bool

	// NodeName is the name of the real node. Default "mo-node".
	NodeName string

	// GPUs is the number of nvidia.com/gpu advertised on the real node as
	// an extended resource (no device is attached). Default 0.
	GPUs int

	// GPUProduct is the nvidia.com/gpu.product label set on the real node
	// when GPUs > 0. Default "NVIDIA-L4".
	GPUProduct string

	// Images are docker-archive tarballs imported into the real node's
	// containerd before Start returns. Pods use them with
	// imagePullPolicy: Never (or IfNotPresent).
	Images []string

	// LogDir keeps one <component>.log per process. Default: a directory
	// inside the cluster's work directory. A LogDir given here is kept by
	// Stop; a default one is removed with the work directory.
	LogDir string

	// WorkDir holds certificates, kubeconfigs, etcd data and, in real-node
	// mode, containerd and kubelet state. Default: a new temporary
	// directory, removed by Stop.
	WorkDir string

	// StartTimeout bounds how long Start waits for the components to
	// become ready. Default 2 minutes (5 minutes with RealNode).
	StartTimeout time.Duration

	// LockWait is how long a real-node Start waits for another real-node
	// cluster on this machine to go away before failing. Default 0: fail
	// at once with ErrRealNodeBusy.
	LockWait time.Duration
}

// KwokNode is a node simulated by kwok.
type KwokNode struct {
	// Name of the Node object. Required.
	Name string
	// CPU capacity, a Kubernetes quantity. Default "32".
	CPU string
	// Memory capacity, a Kubernetes quantity. Default "256Gi".
	Memory string
	// GPUs is the nvidia.com/gpu capacity. Default 0.
	GPUs int
	// GPUProduct is the value of the nvidia.com/gpu.product label when
	// GPUs > 0. Default "NVIDIA-L4".
	GPUProduct string
	// Labels are added to the node's labels.
	Labels map[string]string
	// Taints are set on the node.
	Taints []corev1.Taint
}

// Defaults for unset options.
const (
	DefaultNodeName     = "mo-node"
	DefaultGPUProduct   = "NVIDIA-L4"
	DefaultKwokCPU      = "32"
	DefaultKwokMemory   = "256Gi"
	defaultStartTimeout = 2 * time.Minute
	realNodeTimeout     = 5 * time.Minute
)

// ResourceGPU is the extended resource of NVIDIA GPUs.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// GPU labels, as NVIDIA GPU feature discovery publishes them.
const (
	LabelGPUProduct = "nvidia.com/gpu.product"
	LabelGPUCount   = "nvidia.com/gpu.count"
)

// Default fills unset fields. It reads $MO_BIN_DIR and looks for the module
// root from the working directory.
func (o Options) Default() Options {
	if o.BinDir == "" {
		o.BinDir = os.Getenv(EnvBinDir)
	}
	if o.BinDir == "" {
		if root, err := ModuleRoot(); err == nil {
			o.BinDir = filepath.Join(root, "bin")
		}
	}
	if o.RealNode {
		o.ControllerManager = true
		o.Scheduler = true
	}
	if o.NodeName == "" {
		o.NodeName = DefaultNodeName
	}
	if o.GPUProduct == "" {
		o.GPUProduct = DefaultGPUProduct
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = defaultStartTimeout
		if o.RealNode {
			o.StartTimeout = realNodeTimeout
		}
	}
	nodes := make([]KwokNode, len(o.KwokNodes))
	for i, n := range o.KwokNodes {
		if n.CPU == "" {
			n.CPU = DefaultKwokCPU
		}
		if n.Memory == "" {
			n.Memory = DefaultKwokMemory
		}
		if n.GPUProduct == "" {
			n.GPUProduct = DefaultGPUProduct
		}
		nodes[i] = n
	}
	o.KwokNodes = nodes
	return o
}

// Validate reports the first problem with defaulted options.
func (o Options) Validate() error {
	if o.BinDir == "" {
		return fmt.Errorf("no binary directory: set Options.BinDir or $%s, or run inside the %s module", EnvBinDir, ModulePath)
	}
	if o.GPUs < 0 {
		return fmt.Errorf("GPUs must not be negative, got %d", o.GPUs)
	}
	if len(o.Images) > 0 && !o.RealNode {
		return errors.New("images can only be imported into a real node: set RealNode")
	}
	for _, img := range o.Images {
		if _, err := os.Stat(img); err != nil {
			return fmt.Errorf("image tarball: %w", err)
		}
	}
	seen := map[string]bool{o.NodeName: o.RealNode}
	for i, n := range o.KwokNodes {
		if n.Name == "" {
			return fmt.Errorf("kwok node %d has no name", i)
		}
		if seen[n.Name] {
			return fmt.Errorf("node name %q is used twice", n.Name)
		}
		seen[n.Name] = true
		if _, err := resource.ParseQuantity(n.CPU); err != nil {
			return fmt.Errorf("kwok node %s: cpu %q: %w", n.Name, n.CPU, err)
		}
		if _, err := resource.ParseQuantity(n.Memory); err != nil {
			return fmt.Errorf("kwok node %s: memory %q: %w", n.Name, n.Memory, err)
		}
		if n.GPUs < 0 {
			return fmt.Errorf("kwok node %s: GPUs must not be negative, got %d", n.Name, n.GPUs)
		}
	}
	return nil
}

// binary returns the path of a component binary, preferring
// $KUBEBUILDER_ASSETS for etcd and kube-apiserver.
func (o Options) binary(name string) (string, error) {
	if name == "etcd" || name == "kube-apiserver" {
		if dir := os.Getenv(EnvKubebuilderAssets); dir != "" {
			p := filepath.Join(dir, name)
			if isExecutable(p) {
				return p, nil
			}
		}
	}
	p := filepath.Join(o.BinDir, name)
	if !isExecutable(p) {
		return "", fmt.Errorf("%w: %s (build the tools with `make tools`, or point $%s at a directory that has it)", ErrBinaryNotFound, p, EnvBinDir)
	}
	return p, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// ModuleRoot walks up from the working directory to the directory whose
// go.mod declares ModulePath.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return moduleRootFrom(dir)
}

// moduleRootNear finds the module root from the working directory, else
// from binDir (normally <module root>/bin).
func moduleRootNear(binDir string) (string, error) {
	root, err := ModuleRoot()
	if err == nil {
		return root, nil
	}
	if binDir != "" {
		if abs, absErr := filepath.Abs(binDir); absErr == nil {
			if root, err2 := moduleRootFrom(abs); err2 == nil {
				return root, nil
			}
		}
	}
	return "", err
}

func moduleRootFrom(dir string) (string, error) {
	start := dir
	for {
		if declaresModule(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above %s", ModulePath, start)
		}
		dir = parent
	}
}

func declaresModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if rest, ok := strings.CutPrefix(line, "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`) == ModulePath
		}
	}
	return false
}
