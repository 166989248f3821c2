package localcluster

import (
	"errors"
)

// Real-node networking. These are machine-wide, which is why only one
// real-node cluster can run on a machine at a time.
const (
	// nodeIP is put on lo and used as the node, kubelet and apiserver
	// address: kubelet rejects loopback node IPs.
	nodeIP = "10.123.0.1"
	// apiServerRealNodePort is the apiserver port in real-node mode.
	apiServerRealNodePort = 6443
	// podCIDR is the bridge network of the real node's pods.
	podCIDR = "10.244.0.0/24"
	// clusterCIDR is what kube-proxy treats as cluster-internal.
	clusterCIDR = "10.244.0.0/16"
	// clusterDNS is the kube-dns Service address.
	clusterDNS = "10.96.0.10"
	// bridgeName is the CNI bridge.
	bridgeName = "cni0"
	// pauseImage is the sandbox image, built from ./pause.
	pauseImage = "localhost/localcluster/pause:v1"
)

// ErrRealNodeUnsupported is returned when real-node mode is asked for
// without Linux and root.
var ErrRealNodeUnsupported = errors.New("real-node mode needs Linux and root (containerd, kubelet and iptables change the host)")

// ErrRealNodeBusy is returned when another real-node cluster holds the
// machine-wide lock.
var ErrRealNodeBusy = errors.New("another real-node cluster is running on this machine")

// ErrNoRealNode is returned by operations that need a real node.
var ErrNoRealNode = errors.New("the cluster has no real node (Options.RealNode)")

// Machine-wide files of the real-node lock. /run is a tmpfs, so a reboot
// clears them together with everything they protect.
const (
	// LockFile is flock(2)ed while a real-node cluster runs.
	LockFile = "/run/model-orchestra-localcluster.lock"
	// OwnerFile records the running real-node cluster: its process, work
	// directory and what it changed on the host. A cluster that stops
	// cleanly removes it; a crashed one leaves it for the next start (or
	// `devcluster down`) to clean up after.
	OwnerFile = "/run/model-orchestra-localcluster.json"
)
