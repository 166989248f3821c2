package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/ociimage"
)

// hostPaths are written by kubelet, containerd's shims and libcni no matter
// which directories they are configured with. Teardown removes those that
// did not exist before the cluster started.
var hostPaths = []string{
	"/run/containerd",
	"/run/netns",
	"/var/lib/cni",
	"/var/lib/kubelet",
	"/var/log/containers",
	"/var/log/pods",
}

// sysctls the node changes: the first group is set at start, the second is
// set by kubelet and kube-proxy. Teardown restores all of them.
var sysctlSettings = map[string]string{
	"net/ipv4/ip_forward":                 "1",
	"net/bridge/bridge-nf-call-iptables":  "1",
	"net/bridge/bridge-nf-call-ip6tables": "1",
}

var sysctlsTouched = []string{
	"net/ipv4/ip_forward",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"net/ipv4/conf/all/route_localnet",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// Owner is what OwnerFile holds.
type Owner struct {
	PID     int       `json:"pid"`
	WorkDir string    `json:"workDir"`
	Started time.Time `json:"started"`
	// Sysctls are the values before the cluster started.
	Sysctls map[string]string `json:"sysctls"`
	// AddedAddress is true when the cluster put nodeIP on lo.
	AddedAddress bool `json:"addedAddress"`
	// CreatedPaths are hostPaths that did not exist before.
	CreatedPaths []string `json:"createdPaths"`
}

// realNode is the host side of a real-node cluster.
type realNode struct {
	opts  Options
	lock  *os.File
	owner Owner
}

// acquireRealNode takes the machine-wide lock, waiting up to
// opts.LockWait, and cleans up after a previous cluster that crashed.
func acquireRealNode(ctx context.Context, opts Options) (*realNode, error) {
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", LockFile, err)
	}
	deadline := time.Now().Add(opts.LockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", LockFile, err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = f.Close()
			holder := "unknown"
			if o, err := ReadOwner(); err == nil {
				holder = fmt.Sprintf("pid %d, work directory %s, started %s", o.PID, o.WorkDir, o.Started.Format(time.RFC3339))
			}
			return nil, fmt.Errorf("%w (%s); stop it first (`devcluster down`), or wait for it (Options.LockWait; in tests $%s)", ErrRealNodeBusy, holder, EnvLockWait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	if stale, err := ReadOwner(); err == nil {
		// We hold the lock, so whoever wrote this is gone without cleaning up.
		if err := cleanupOwner(stale); err != nil {
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
			_ = f.Close()
			return nil, fmt.Errorf("cleaning up after the real-node cluster of pid %d (%s): %w", stale.PID, stale.WorkDir, err)
		}
	}
	return &realNode{opts: opts, lock: f}, nil
}

// ReadOwner returns the record of the running (or crashed) real-node
// cluster. It fails with an error satisfying errors.Is(err, os.ErrNotExist)
// when there is none.
func ReadOwner() (Owner, error) {
	var o Owner
	data, err := os.ReadFile(OwnerFile)
	if err != nil {
		return o, err
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("reading %s: %w", OwnerFile, err)
	}
	return o, nil
}

// CleanupStale tears down a real-node cluster whose process is gone: it
// takes the lock (failing with ErrRealNodeBusy if a live cluster holds it)
// and undoes everything OwnerFile records. It does nothing when no cluster
// is recorded.
func CleanupStale(ctx context.Context) error {
	n, err := acquireRealNode(ctx, Options{})
	if err != nil {
		return err
	}
	n.release()
	return nil
}

// recordOwner notes what the host looks like before the cluster changes it.
func (n *realNode) recordOwner(workDir string) error {
	n.owner = Owner{PID: os.Getpid(), WorkDir: workDir, Started: time.Now().UTC(), Sysctls: map[string]string{}}
	for _, key := range sysctlsTouched {
		if v, err := readSysctl(key); err == nil {
			n.owner.Sysctls[key] = v
		}
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			n.owner.CreatedPaths = append(n.owner.CreatedPaths, p)
		}
	}
	n.owner.AddedAddress = !hasLoopbackAddress()
	return n.writeOwner()
}

func (n *realNode) writeOwner() error {
	data, err := json.MarshalIndent(n.owner, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(OwnerFile, data, 0o644)
}

// prepareHost puts nodeIP on lo and enables forwarding.
func (n *realNode) prepareHost(ctx context.Context) error {
	if n.owner.AddedAddress {
		if out, err := exec.CommandContext(ctx, "ip", "addr", "replace", nodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
			return fmt.Errorf("adding %s to lo: %w: %s", nodeIP, err, out)
		}
	}
	for key, v := range sysctlSettings {
		if err := writeSysctl(key, v); err != nil {
			return err
		}
	}
	return nil
}

func hasLoopbackAddress() bool {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return false
	}
	addrs, err := lo.Addrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == nodeIP {
			return true
		}
	}
	return false
}

func readSysctl(key string) (string, error) {
	data, err := os.ReadFile(filepath.Join("/proc/sys", key))
	return strings.TrimSpace(string(data)), err
}

func writeSysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// start runs containerd, kubelet, kube-proxy and DNS, and imports images.
func (n *realNode) start(ctx context.Context, c *Cluster, cs kubernetes.Interface) error {
	if err := n.startContainerd(ctx, c); err != nil {
		return err
	}
	pause, err := n.buildPauseImage(ctx, c)
	if err != nil {
		return err
	}
	for _, img := range append([]string{pause}, n.opts.Images...) {
		if err := c.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	if err := n.startKubelet(c); err != nil {
		return err
	}
	if err := n.startKubeProxy(c); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx, cs, n.opts.NodeName); err != nil {
		return err
	}
	if n.opts.GPUs > 0 {
		if err := n.advertiseGPUs(ctx, cs); err != nil {
			return err
		}
	}
	return n.startDNS(ctx, c, cs)
}

func (c *Cluster) containerdSocket() string { return c.path("containerd", "run", "containerd.sock") }

func (n *realNode) startContainerd(ctx context.Context, c *Cluster) error {
	if _, err := exec.LookPath("containerd"); err != nil {
		return fmt.Errorf("%w: containerd: the real node needs containerd, runc, the CNI plugins, iptables, conntrack and socat (hack/setup-node.sh installs them on Debian)", ErrBinaryNotFound)
	}
	netDir := c.path("cni", "net.d")
	if err := os.MkdirAll(netDir, 0o755); err != nil {
		return err
	}
	cniConf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "localcluster",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": bridgeName, "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": c.path("cni", "ipam"),
					"ranges":  []any{[]any{map[string]any{"subnet": podCIDR}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
			map[string]any{"type": "loopback"},
		},
	}
	data, err := json.MarshalIndent(cniConf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(netDir, "10-localcluster.conflist"), data, 0o644); err != nil {
		return err
	}
	cniBin := "/usr/lib/cni"
	if _, err := os.Stat(filepath.Join(cniBin, "bridge")); err != nil {
		cniBin = "/opt/cni/bin"
	}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = %q
    # Without CAP_SYS_RESOURCE (as in many VMs) runc cannot lower
    # oom_score_adj and every sandbox fails to start.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_cdi = false
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = %q
      conf_dir = %q
  [plugins."io.containerd.internal.v1.opt"]
    path = %q
`, c.path("containerd", "root"), c.path("containerd", "run"), c.containerdSocket(), pauseImage,
		cniBin, netDir, c.path("containerd", "opt"))
	confPath := c.path("containerd", "config.toml")
	if err := os.MkdirAll(filepath.Dir(confPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(confPath, []byte(config), 0o644); err != nil {
		return err
	}
	p, err := startProcess(c.logDir, "containerd", "containerd", []string{"--config", confPath}, nil)
	if err != nil {
		return err
	}
	c.track(p)
	return poll(ctx, 100*time.Millisecond, "containerd to be ready", func(ctx context.Context) (bool, error) {
		if p.exited() {
			return false, permanent(p.exitError())
		}
		out, err := exec.CommandContext(ctx, "ctr", "-a", c.containerdSocket(), "version").CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("ctr version: %w: %s", err, out)
		}
		return true, nil
	})
}

// ImportImage imports a docker-archive tarball into the real node's
// containerd, where kubelet finds it (imagePullPolicy: Never).
func (c *Cluster) ImportImage(ctx context.Context, tarball string) error {
	if c.node == nil {
		return ErrNoRealNode
	}
	return importImage(ctx, c.containerdSocket(), tarball)
}

func importImage(ctx context.Context, socket, tarball string) error {
	out, err := exec.CommandContext(ctx, "ctr", "-a", socket, "-n", "k8s.io", "images", "import", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("importing image %s: %w: %s", tarball, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// buildPauseImage compiles ./pause and packs it as the sandbox image. A
// prebuilt static binary at <BinDir>/pause is used when present.
func (n *realNode) buildPauseImage(ctx context.Context, c *Cluster) (string, error) {
	dir := c.path("images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(n.opts.BinDir, "pause")
	if !isExecutable(bin) {
		root, err := moduleRootNear(n.opts.BinDir)
		if err != nil {
			return "", fmt.Errorf("building the pause image needs the %s source (run from the repository) or a static binary at %s: %w",
				ModulePath, filepath.Join(n.opts.BinDir, "pause"), err)
		}
		bin = filepath.Join(dir, "pause")
		goBin, err := exec.LookPath("go")
		if err != nil {
			return "", fmt.Errorf("building the pause binary needs the go command on PATH, or a static binary at %s: %w",
				filepath.Join(n.opts.BinDir, "pause"), err)
		}
		cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./internal/localcluster/pause")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("building the pause binary: %w: %s", err, out)
		}
	}
	tarball := filepath.Join(dir, "pause.tar")
	if _, err := ociimage.Pack(ociimage.Options{Binary: bin, Ref: pauseImage, Out: tarball, Path: "/pause"}); err != nil {
		return "", fmt.Errorf("packing the pause image: %w", err)
	}
	return tarball, nil
}

func (n *realNode) startKubelet(c *Cluster) error {
	bin, err := n.opts.binary("kubelet")
	if err != nil {
		return err
	}
	pki := c.path("pki")
	serving, err := c.pki.issue(certSpec{
		CommonName: n.opts.NodeName, Server: true,
		DNSNames: []string{n.opts.NodeName, "localhost"},
		IPs:      []net.IP{net.ParseIP(nodeIP), net.ParseIP("127.0.0.1")},
	})
	if err != nil {
		return err
	}
	certFile, keyFile, err := serving.write(pki, "kubelet-serving")
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"address":                  nodeIP,
		"port":                     10250,
		"healthzBindAddress":       nodeIP,
		"healthzPort":              10248,
		"readOnlyPort":             0,
		"containerRuntimeEndpoint": "unix://" + c.containerdSocket(),
		// This VM family runs cgroup v1 without systemd.
		"cgroupDriver": "cgroupfs",
		"failCgroupV1": false,
		"failSwapOn":   false,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": pki + "/ca.crt"},
		},
		"authorization":     map[string]any{"mode": "Webhook"},
		"tlsCertFile":       certFile,
		"tlsPrivateKeyFile": keyFile,
		"clusterDomain":     clusterDomain,
		"clusterDNS":        []string{clusterDNS},
		"resolvConf":        "/etc/resolv.conf",
		"podLogsDir":        c.path("kubelet", "pod-logs"),
		// Imported images cannot be pulled again: keep image GC and
		// eviction out of the way on a shared, busy disk.
		"evictionHard": map[string]string{
			"memory.available":  "50Mi",
			"nodefs.available":  "1%",
			"imagefs.available": "1%",
		},
		"imageGCHighThresholdPercent": 99,
		"imageGCLowThresholdPercent":  98,
		"maxPods":                     110,
		"serializeImagePulls":         false,
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgPath := c.path("kubelet-config.yaml")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		return err
	}
	labels := []string{LabelNodeType + "=real"}
	if n.opts.GPUs > 0 {
		labels = append(labels, LabelGPUProduct+"="+n.opts.GPUProduct, LabelGPUCount+"="+strconv.Itoa(n.opts.GPUs))
	}
	args := []string{
		"--config=" + cfgPath,
		"--kubeconfig=" + c.path("kubelet.kubeconfig"),
		"--root-dir=" + c.path("kubelet"),
		"--node-ip=" + nodeIP,
		"--hostname-override=" + n.opts.NodeName,
		"--node-labels=" + strings.Join(labels, ","),
		"--v=1",
	}
	p, err := startProcess(c.logDir, "kubelet", bin, args, nil)
	if err != nil {
		return err
	}
	c.track(p)
	return nil
}

func (n *realNode) startKubeProxy(c *Cluster) error {
	bin, err := n.opts.binary("kube-proxy")
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": c.path("kube-proxy.kubeconfig")},
		"hostnameOverride":   n.opts.NodeName,
		"mode":               "iptables",
		"clusterCIDR":        clusterCIDR,
		"healthzBindAddress": nodeIP + ":10256",
		"metricsBindAddress": nodeIP + ":10249",
		// NodePorts answer on 127.0.0.1 and the node address only.
		"nodePortAddresses": []string{"127.0.0.1/32", nodeIP + "/32"},
		"iptables":          map[string]any{"localhostNodePorts": true},
		// Leave the machine's conntrack settings alone.
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"min":                   0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgPath := c.path("kube-proxy-config.yaml")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		return err
	}
	p, err := startProcess(c.logDir, "kube-proxy", bin, []string{"--config=" + cfgPath, "--v=1"}, nil)
	if err != nil {
		return err
	}
	c.track(p)
	return nil
}

// advertiseGPUs adds nvidia.com/gpu to the node's capacity, the way the
// Kubernetes docs advertise an extended resource. kubelet keeps it and
// derives allocatable from it.
func (n *realNode) advertiseGPUs(ctx context.Context, cs kubernetes.Interface) error {
	q := strconv.Itoa(n.opts.GPUs)
	patch := fmt.Sprintf(`{"status":{"capacity":{%q:%q},"allocatable":{%q:%q}}}`, ResourceGPU, q, ResourceGPU, q)
	if _, err := cs.CoreV1().Nodes().PatchStatus(ctx, n.opts.NodeName, []byte(patch)); err != nil {
		return fmt.Errorf("advertising %d GPUs on node %s: %w", n.opts.GPUs, n.opts.NodeName, err)
	}
	return poll(ctx, 200*time.Millisecond, "GPUs to be allocatable", func(ctx context.Context) (bool, error) {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.opts.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got := node.Status.Allocatable[ResourceGPU]
		return got.Cmp(*resource.NewQuantity(int64(n.opts.GPUs), resource.DecimalSI)) == 0, nil
	})
}

// startDNS runs CoreDNS as a host process on nodeIP:53 and points the
// kube-dns Service at it through a hand-made EndpointSlice. Running it on
// the host avoids packing a 60 MB image at every start; pods reach it like
// any other Service.
func (n *realNode) startDNS(ctx context.Context, c *Cluster, cs kubernetes.Interface) error {
	bin, err := n.opts.binary("coredns")
	if err != nil {
		return err
	}
	corefile := fmt.Sprintf(`.:53 {
    bind %s
    errors
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s localcluster
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
}
`, nodeIP, clusterDomain, c.path("admin.kubeconfig"))
	path := c.path("Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return err
	}
	p, err := startProcess(c.logDir, "coredns", bin, []string{"-conf", path}, nil)
	if err != nil {
		return err
	}
	c.track(p)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterDNS,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
			},
		},
	}
	if _, err := cs.CoreV1().Services(metav1.NamespaceSystem).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns Service: %w", err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-host", Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: "kube-dns",
				discoveryv1.LabelManagedBy:   "localcluster.modelorchestra.io",
			}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{nodeIP},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
			NodeName:   new(n.opts.NodeName),
		}},
		Ports: []discoveryv1.EndpointPort{
			{Name: new("dns"), Port: new(int32(53)), Protocol: new(corev1.ProtocolUDP)},
			{Name: new("dns-tcp"), Port: new(int32(53)), Protocol: new(corev1.ProtocolTCP)},
		},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceSystem).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns EndpointSlice: %w", err)
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(nodeIP, "53"))
	}}
	return poll(ctx, 200*time.Millisecond, "cluster DNS to answer", func(ctx context.Context) (bool, error) {
		if p.exited() {
			return false, permanent(p.exitError())
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		addrs, err := resolver.LookupHost(qctx, "kubernetes.default.svc."+clusterDomain)
		if err != nil {
			return false, err
		}
		return len(addrs) > 0 && addrs[0] == kubernetesSvc, nil
	})
}
