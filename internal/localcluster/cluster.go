package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Network layout shared by both modes.
const (
	serviceCIDR   = "10.96.0.0/16"
	kubernetesSvc = "10.96.0.1"
	clusterDomain = "cluster.local"
)

// Cluster is a running local cluster. Stop it when done.
type Cluster struct {
	opts       Options
	workDir    string
	ownWorkDir bool
	logDir     string
	ownLogDir  bool

	pki            *pki
	host           string // address the apiserver binds and advertises
	apiServerURL   string
	admin          *rest.Config
	kubeconfigPath string

	mu    sync.Mutex
	procs []*process // in start order

	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	node *realNode // nil unless Options.RealNode

	stopOnce sync.Once
	stopErr  error
}

// Start brings up a cluster as described by opts and returns once it is
// usable: the apiserver is ready, the default ServiceAccount exists (when the
// controller-manager runs), kwok nodes and the real node are Ready, and the
// images are imported. On error everything started so far is stopped.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	opts = opts.Default()
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("localcluster: invalid options: %w", err)
	}
	c := &Cluster{opts: opts, host: "127.0.0.1"}
	if opts.RealNode {
		if runtime.GOOS != "linux" || os.Geteuid() != 0 {
			return nil, fmt.Errorf("localcluster: %w", ErrRealNodeUnsupported)
		}
		// Waiting for the machine-wide lock does not count against StartTimeout.
		node, err := acquireRealNode(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		c.node = node
		c.host = nodeIP
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := c.start(ctx); err != nil {
		if stopErr := c.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stopping after failed start: %w", stopErr))
		}
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	var err error
	if c.opts.WorkDir != "" {
		c.workDir = c.opts.WorkDir
		if err := os.MkdirAll(c.workDir, 0o755); err != nil {
			return err
		}
	} else {
		if c.workDir, err = os.MkdirTemp("", "localcluster-"); err != nil {
			return err
		}
		c.ownWorkDir = true
	}
	if c.node != nil {
		if err := c.node.recordOwner(c.workDir); err != nil {
			return err
		}
	}
	if c.opts.LogDir != "" {
		c.logDir = c.opts.LogDir
	} else {
		c.logDir = filepath.Join(c.workDir, "logs")
		c.ownLogDir = true
	}
	for _, d := range []string{c.logDir, c.path("pki")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if c.node != nil {
		if err := c.node.prepareHost(ctx); err != nil {
			return fmt.Errorf("preparing host network: %w", err)
		}
	}
	if c.pki, err = newPKI("localcluster"); err != nil {
		return err
	}
	if err := c.writeCredentials(); err != nil {
		return err
	}
	etcdURL, err := c.startEtcd(ctx)
	if err != nil {
		return err
	}
	if err := c.startAPIServer(ctx, etcdURL); err != nil {
		return err
	}
	bgCtx, bgCancel := context.WithCancel(context.Background())
	c.bgCancel = bgCancel
	if c.opts.ControllerManager {
		if err := c.startControllerManager(); err != nil {
			return err
		}
	}
	if c.opts.Scheduler {
		if err := c.startScheduler(); err != nil {
			return err
		}
	}
	cs, err := kubernetes.NewForConfig(c.admin)
	if err != nil {
		return err
	}
	if c.opts.ControllerManager {
		if err := c.waitForDefaultServiceAccount(ctx, cs); err != nil {
			return err
		}
		if err := c.startProvisioner(ctx, bgCtx, cs); err != nil {
			return err
		}
	}
	if len(c.opts.KwokNodes) > 0 {
		if err := c.startKwok(ctx, cs); err != nil {
			return err
		}
	}
	if c.node != nil {
		if err := c.node.start(ctx, c, cs); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops every component, undoes host changes made in real-node mode
// and removes the work directory (and the log directory when it was not
// given in Options). It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		var errs []error
		if c.bgCancel != nil {
			c.bgCancel()
			c.bg.Wait()
		}
		c.mu.Lock()
		procs := c.procs
		c.mu.Unlock()
		if c.node != nil {
			errs = append(errs, c.node.stop(c, procs))
		}
		// The rest is thrown away: stop it all at once rather than in turn.
		var wg sync.WaitGroup
		for _, p := range procs {
			wg.Go(func() { p.stop(0) })
		}
		wg.Wait()
		if c.node != nil {
			errs = append(errs, c.node.cleanupHost(c.workDir))
		}
		if c.ownWorkDir && c.workDir != "" {
			errs = append(errs, os.RemoveAll(c.workDir))
		}
		if c.node != nil {
			c.node.release()
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// Config returns a copy of the admin (system:masters) client config.
func (c *Cluster) Config() *rest.Config { return rest.CopyConfig(c.admin) }

// KubeconfigFile is the path of the admin kubeconfig, with credentials
// embedded. Use it with kubectl --kubeconfig.
func (c *Cluster) KubeconfigFile() string { return c.kubeconfigPath }

// LogDir is the directory with one <component>.log per process.
func (c *Cluster) LogDir() string { return c.logDir }

// WorkDir is the directory with certificates, kubeconfigs and state.
func (c *Cluster) WorkDir() string { return c.workDir }

// APIServerURL is the https URL of kube-apiserver.
func (c *Cluster) APIServerURL() string { return c.apiServerURL }

// CACertPEM is the cluster CA certificate (PEM).
func (c *Cluster) CACertPEM() []byte { return c.pki.CA.CertPEM }

// ImpersonateServiceAccount returns the admin config impersonating the
// ServiceAccount namespace/name with the groups the apiserver gives
// ServiceAccount tokens, so that RBAC applies exactly as for a pod
// running under that account.
func (c *Cluster) ImpersonateServiceAccount(namespace, name string) *rest.Config {
	cfg := c.Config()
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return cfg
}

// Processes lists the running components by name with their process IDs,
// which are also their process group IDs.
func (c *Cluster) Processes() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.procs))
	for _, p := range c.procs {
		if !p.exited() {
			out[p.Name] = p.PID()
		}
	}
	return out
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.workDir}, elem...)...)
}

func (c *Cluster) track(p *process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs = append(c.procs, p)
}

// untrack forgets a process that failed to start properly.
func (c *Cluster) untrack(p *process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, q := range c.procs {
		if q == p {
			c.procs = append(c.procs[:i], c.procs[i+1:]...)
			return
		}
	}
}

// writeCredentials writes the certificates and kubeconfigs every component
// uses, and builds the admin rest.Config.
func (c *Cluster) writeCredentials() error {
	dir := c.path("pki")
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), c.pki.CA.CertPEM, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), c.pki.CA.KeyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), c.pki.ServiceAccountKeyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), c.pki.ServiceAccountPubKeyPEM, 0o644); err != nil {
		return err
	}
	serving, err := c.pki.issue(certSpec{
		CommonName: "kube-apiserver",
		Server:     true,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc." + clusterDomain},
		IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(nodeIP), net.ParseIP(kubernetesSvc)},
	})
	if err != nil {
		return err
	}
	if _, _, err := serving.write(dir, "apiserver"); err != nil {
		return err
	}
	clients := []struct {
		file string
		spec certSpec
	}{
		{"admin", certSpec{CommonName: "localcluster-admin", Organization: []string{"system:masters"}}},
		{"controller-manager", certSpec{CommonName: "system:kube-controller-manager"}},
		{"scheduler", certSpec{CommonName: "system:kube-scheduler"}},
		{"kube-proxy", certSpec{CommonName: "system:kube-proxy"}},
		{"kubelet", certSpec{CommonName: "system:node:" + c.opts.NodeName, Organization: []string{"system:nodes"}}},
		{"apiserver-kubelet-client", certSpec{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}},
	}
	for _, cl := range clients {
		kp, err := c.pki.issue(cl.spec)
		if err != nil {
			return err
		}
		if _, _, err := kp.write(dir, cl.file); err != nil {
			return err
		}
		if cl.file == "apiserver-kubelet-client" {
			continue
		}
		if err := c.writeKubeconfig(c.path(cl.file+".kubeconfig"), cl.file, kp); err != nil {
			return err
		}
		if cl.file == "admin" {
			c.kubeconfigPath = c.path("kubeconfig")
			c.admin = &rest.Config{
				TLSClientConfig: rest.TLSClientConfig{
					CAData:   c.pki.CA.CertPEM,
					CertData: kp.CertPEM,
					KeyData:  kp.KeyPEM,
				},
				QPS:   100,
				Burst: 200,
			}
		}
	}
	return nil
}

// setAPIServer records the apiserver address once its port is known, and
// rewrites the kubeconfigs to point at it.
func (c *Cluster) setAPIServer(port int) error {
	c.apiServerURL = "https://" + net.JoinHostPort(c.host, itoa(port))
	c.admin.Host = c.apiServerURL
	for _, name := range []string{"admin", "controller-manager", "scheduler", "kube-proxy", "kubelet"} {
		path := c.path(name + ".kubeconfig")
		cfg, err := clientcmd.LoadFromFile(path)
		if err != nil {
			return err
		}
		for _, cl := range cfg.Clusters {
			cl.Server = c.apiServerURL
		}
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(c.path("admin.kubeconfig"))
	if err != nil {
		return err
	}
	return os.WriteFile(c.kubeconfigPath, data, 0o600)
}

func (c *Cluster) writeKubeconfig(path, user string, kp *keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["localcluster"] = &clientcmdapi.Cluster{
		Server:                   c.apiServerURL,
		CertificateAuthorityData: c.pki.CA.CertPEM,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: kp.CertPEM,
		ClientKeyData:         kp.KeyPEM,
	}
	cfg.Contexts["localcluster"] = &clientcmdapi.Context{Cluster: "localcluster", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = "localcluster"
	return clientcmd.WriteToFile(*cfg, path)
}

// poll calls cond every interval until it returns true, returns an error,
// or ctx ends; then it returns what went wrong with a description of the
// wait.
func poll(ctx context.Context, interval time.Duration, what string, cond func(context.Context) (bool, error)) error {
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return fmt.Errorf("waiting for %s: %w", what, perm.error)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %w)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}
