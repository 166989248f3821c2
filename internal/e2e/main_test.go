// Package e2e runs Model Orchestra end to end on the local real-node
// cluster: the operator installed from its install chart as the real
// Deployment, the images built by `make images`, real pods, the gateway
// reached through its NodePort. See docs/demo.md.
package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/hubtest"
	"github.com/model-orchestra/operator/internal/localcluster"
)

// images are the tarballs `make images` writes, all needed by the stack.
var images = []string{"orchestra-operator", "orchestra-gateway", "orchestra-dispatcher", "orchestra-fetch", "orchestra-sim", "orchestra-agent", "nats-server", "ollama"}

const operatorNamespace = "orchestra-system"

// env is the cluster shared by every test of the package.
var env struct {
	skip       string // why the package is skipped; empty when it runs
	root       string
	kubeconfig string
	cs         kubernetes.Interface
	dyn        dynamic.Interface
	mapper     *restmapper.DeferredDiscoveryRESTMapper
	hub        string // the mirror's URL, reachable from pods
	noOllama   string // why the real Ollama engine's tests skip; empty when its image is loaded
	cluster    *localcluster.Cluster
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := localcluster.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	env.root = root
	var tarballs []string
	for _, img := range images {
		tarballs = append(tarballs, filepath.Join(root, "_output", "images", img+".tar"))
	}
	switch {
	case testing.Short():
		env.skip = localcluster.ShortSkip
	case runtime.GOOS != "linux":
		env.skip = "end-to-end tests need Linux (a real-node local cluster)"
	case os.Geteuid() != 0:
		env.skip = "end-to-end tests need root (a real-node local cluster runs containerd and kubelet)"
	default:
		var found []string
		for _, t := range tarballs {
			_, err := os.Stat(t)
			switch {
			case err != nil && filepath.Base(t) == "ollama.tar":
				// make images OLLAMA_IMAGE=0: only the real-engine tests skip.
				env.noOllama = fmt.Sprintf("the real Ollama engine's tests need its image: %s is missing (make images without OLLAMA_IMAGE=0)", t)
			case err != nil:
				env.skip = fmt.Sprintf("end-to-end tests need the images from `make images`: %s is missing", t)
			default:
				found = append(found, t)
			}
		}
		tarballs = found
	}
	if env.skip != "" {
		return m.Run() // every test skips with env.skip
	}

	lockWait := 15 * time.Minute
	if v := os.Getenv(localcluster.EnvLockWait); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			lockWait = d
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), lockWait+10*time.Minute)
	defer cancel()
	start := time.Now()
	opts := localcluster.Options{RealNode: true, Images: tarballs, LockWait: lockWait}
	if dir := os.Getenv(localcluster.EnvLogDir); dir != "" {
		opts.LogDir = filepath.Join(dir, "e2e-"+time.Now().UTC().Format("20060102-150405"))
	}
	cluster, err := localcluster.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the real-node local cluster:", err)
		return 1
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: stopping the cluster:", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "e2e: real-node cluster up in %s\n", time.Since(start).Round(time.Second))
	teardown, err := setup(ctx, cluster)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		fmt.Fprintln(os.Stderr, cluster.LogTails(30))
		return 1
	}
	defer teardown()
	return m.Run()
}

// setup connects to the cluster, starts the mirror and installs the
// operator; it returns what stops the mirror.
func setup(ctx context.Context, cluster *localcluster.Cluster) (func(), error) {
	env.cluster = cluster
	rc := cluster.Config()
	rc.QPS, rc.Burst = 50, 100
	env.kubeconfig = cluster.KubeconfigFile()
	var err error
	if env.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if env.dyn, err = dynamic.NewForConfig(rc); err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, err
	}
	env.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

	hub, stopHub, err := startMirror()
	if err != nil {
		return nil, err
	}
	env.hub = hub
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", args...) }
	start := time.Now()
	err = stack.InstallOperator(ctx, env.cs, stack.OperatorOptions{
		Kubeconfig: env.kubeconfig,
		ChartDir:   filepath.Join(env.root, "charts", "orchestra-operator"),
		Namespace:  operatorNamespace,
		Timeout:    4 * time.Minute,
	}, logf)
	if err != nil {
		stopHub()
		return nil, err
	}
	logf("operator installed in %s", time.Since(start).Round(time.Second))
	return stopHub, nil
}

// startMirror serves the demo model repository as a Hugging Face hub on
// the node address, where pods reach it.
func startMirror() (string, func(), error) {
	srv := &hubtest.Server{}
	repo := &hubtest.Repo{ID: stack.DemoModel}
	for path, data := range stack.TinyModelFiles() {
		repo.Files = append(repo.Files, hubtest.File{Path: path, Content: fetchtest.Bytes(data), LFS: strings.HasSuffix(path, ".gguf")})
	}
	srv.AddRepo(repo)
	hf := &hubtest.Repo{ID: stack.DemoHFModel}
	for path, data := range stack.TinyHFModelFiles() {
		hf.Files = append(hf.Files, hubtest.File{Path: path, Content: fetchtest.Bytes(data), LFS: strings.HasSuffix(path, ".safetensors")})
	}
	srv.AddRepo(hf)
	srv.SetCDNBase("")
	ln, err := net.Listen("tcp", net.JoinHostPort(stack.NodeAddress, "0"))
	if err != nil {
		return "", nil, fmt.Errorf("listening for the hub mirror on the node address: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "e2e: hub mirror:", err)
		}
	}()
	return "http://" + ln.Addr().String(), func() { _ = hs.Close() }, nil
}

// requireOllama skips the test when the package cannot run here or the
// Ollama image was not built.
func requireOllama(t *testing.T) {
	t.Helper()
	requireCluster(t)
	if env.noOllama != "" {
		t.Skip(env.noOllama)
	}
}

// requireCluster skips the test when the package cannot run here.
func requireCluster(t *testing.T) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}
