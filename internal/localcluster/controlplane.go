package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// portAttempts bounds retries when a freshly chosen port is taken by
// someone else before the component binds it.
const portAttempts = 4

// startEtcd starts etcd on free loopback ports and returns its client URL.
func (c *Cluster) startEtcd(ctx context.Context) (string, error) {
	bin, err := c.opts.binary("etcd")
	if err != nil {
		return "", err
	}
	for attempt := 1; ; attempt++ {
		clientPort, err := freePort("127.0.0.1")
		if err != nil {
			return "", err
		}
		peerPort, err := freePort("127.0.0.1")
		if err != nil {
			return "", err
		}
		clientURL := "http://127.0.0.1:" + itoa(clientPort)
		peerURL := "http://127.0.0.1:" + itoa(peerPort)
		args := []string{
			"--name=localcluster",
			"--data-dir=" + c.path("etcd"),
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=localcluster=" + peerURL,
			"--initial-cluster-state=new",
			// A throwaway cluster: losing the last writes on a machine
			// crash is fine, and fsync is slow on shared disks.
			"--unsafe-no-fsync=true",
			"--log-level=warn",
		}
		p, err := startProcess(c.logDir, "etcd", bin, args, nil)
		if err != nil {
			return "", err
		}
		c.track(p)
		err = waitHTTP(ctx, p, "etcd", clientURL+"/health", func(code int, body string) bool {
			return code == http.StatusOK && strings.Contains(body, `"health":"true"`)
		})
		if err == nil {
			return clientURL, nil
		}
		if errors.Is(err, ErrExited) && addressInUse(p) && attempt < portAttempts {
			c.untrack(p)
			continue
		}
		return "", err
	}
}

// startAPIServer starts kube-apiserver and waits until /readyz answers.
func (c *Cluster) startAPIServer(ctx context.Context, etcdURL string) error {
	bin, err := c.opts.binary("kube-apiserver")
	if err != nil {
		return err
	}
	pki := c.path("pki")
	for attempt := 1; ; attempt++ {
		port := apiServerRealNodePort
		if c.node == nil {
			if port, err = freePort(c.host); err != nil {
				return err
			}
		}
		if err := c.setAPIServer(port); err != nil {
			return err
		}
		args := []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=" + c.host,
			"--advertise-address=" + c.host,
			"--secure-port=" + itoa(port),
			"--cert-dir=" + c.path("apiserver-certs"),
			"--service-cluster-ip-range=" + serviceCIDR,
			"--client-ca-file=" + pki + "/ca.crt",
			"--tls-cert-file=" + pki + "/apiserver.crt",
			"--tls-private-key-file=" + pki + "/apiserver.key",
			"--service-account-issuer=https://kubernetes.default.svc." + clusterDomain,
			"--service-account-key-file=" + pki + "/sa.pub",
			"--service-account-signing-key-file=" + pki + "/sa.key",
			"--authorization-mode=Node,RBAC",
			"--allow-privileged=true",
			"--profiling=" + strconv.FormatBool(c.opts.Profiling),
		}
		if c.node != nil {
			args = append(args,
				"--enable-admission-plugins=NodeRestriction",
				"--kubelet-client-certificate="+pki+"/apiserver-kubelet-client.crt",
				"--kubelet-client-key="+pki+"/apiserver-kubelet-client.key",
				"--kubelet-certificate-authority="+pki+"/ca.crt",
				"--kubelet-preferred-address-types=InternalIP,Hostname",
			)
		}
		p, err := startProcess(c.logDir, "kube-apiserver", bin, args, nil)
		if err != nil {
			return err
		}
		c.track(p)
		client, err := httpClientFor(c.admin)
		if err != nil {
			return err
		}
		err = waitHTTPWith(ctx, client, p, "kube-apiserver", c.apiServerURL+"/readyz", func(code int, _ string) bool {
			return code == http.StatusOK
		})
		if err == nil {
			return nil
		}
		if c.node == nil && errors.Is(err, ErrExited) && addressInUse(p) && attempt < portAttempts {
			c.untrack(p)
			continue
		}
		return err
	}
}

// startControllerManager starts kube-controller-manager without a serving
// port (nothing to collide with), each controller with its own
// ServiceAccount credentials as in a real cluster.
func (c *Cluster) startControllerManager() error {
	bin, err := c.opts.binary("kube-controller-manager")
	if err != nil {
		return err
	}
	pki := c.path("pki")
	args := []string{
		"--kubeconfig=" + c.path("controller-manager.kubeconfig"),
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pki + "/sa.key",
		"--root-ca-file=" + pki + "/ca.crt",
		"--cluster-signing-cert-file=" + pki + "/ca.crt",
		"--cluster-signing-key-file=" + pki + "/ca.key",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--controllers=*",
	}
	p, err := startProcess(c.logDir, "kube-controller-manager", bin, args, nil)
	if err != nil {
		return err
	}
	c.track(p)
	return nil
}

// startScheduler starts kube-scheduler without a serving port.
func (c *Cluster) startScheduler() error {
	bin, err := c.opts.binary("kube-scheduler")
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + c.path("scheduler.kubeconfig"),
		"--secure-port=0",
		"--leader-elect=false",
	}
	p, err := startProcess(c.logDir, "kube-scheduler", bin, args, nil)
	if err != nil {
		return err
	}
	c.track(p)
	return nil
}

// waitForDefaultServiceAccount waits for the ServiceAccount controller:
// until the "default" ServiceAccount exists, pods cannot be created in the
// default namespace.
func (c *Cluster) waitForDefaultServiceAccount(ctx context.Context, cs kubernetes.Interface) error {
	return poll(ctx, 200*time.Millisecond, "the default ServiceAccount", func(ctx context.Context) (bool, error) {
		if err := c.checkProcesses(); err != nil {
			return false, err
		}
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// checkProcesses returns an error when a component has exited.
func (c *Cluster) checkProcesses() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.exited() {
			return permanent(p.exitError())
		}
	}
	return nil
}

// permanentError stops poll at once.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

func permanent(err error) error { return permanentError{err} }

// waitHTTP polls url until ok accepts the answer, the process exits, or ctx
// ends.
func waitHTTP(ctx context.Context, p *process, what, url string, ok func(code int, body string) bool) error {
	return waitHTTPWith(ctx, &http.Client{Timeout: 2 * time.Second}, p, what, url, ok)
}

func waitHTTPWith(ctx context.Context, client *http.Client, p *process, what, url string, ok func(code int, body string) bool) error {
	return poll(ctx, 100*time.Millisecond, what+" to be ready", func(ctx context.Context) (bool, error) {
		if p.exited() {
			return false, permanent(p.exitError())
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, permanent(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if ok(resp.StatusCode, string(body)) {
			return true, nil
		}
		return false, fmt.Errorf("%s answered %d: %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
	})
}

// httpClientFor is an HTTP client that authenticates like cfg.
func httpClientFor(cfg *rest.Config) (*http.Client, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building HTTP client: %w", err)
	}
	client.Timeout = 2 * time.Second
	return client, nil
}
