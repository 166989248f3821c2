// Command demo drives the `make run` demo on the local real-node cluster
// started by `devcluster up` (docs/demo.md):
//
//	go run ./hack/demo up     # mirror + operator + a ModelOrchestra serving the simulator and Ollama + a streamed chat from each
//	go run ./hack/demo up --model ~/models/x.gguf   # Ollama serves your GGUF file instead of the generated one
//	go run ./hack/demo down   # delete the resource, uninstall the operator, stop the mirror
//
// Both are idempotent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/localcluster"
)

type config struct {
	root          string // module root
	clusterState  string // devcluster state dir
	stateDir      string // the demo's own state: mirror binary, PID, log, model files
	namespace     string
	name          string
	operatorNS    string
	mirrorListen  string
	nodePort      int
	timeout       time.Duration
	prompt        string
	tokenSecret   string
	samplePath    string
	operatorChart string
	model         string // a GGUF file of the user's that Ollama serves; empty: the generated one
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: go run ./hack/demo up|down [flags]   (-h for the flags)")
		os.Exit(2)
	}
	cmd := os.Args[1]
	root, err := localcluster.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: finding the repository root:", err)
		os.Exit(1)
	}
	c := config{root: root}
	fs := flag.NewFlagSet("demo "+cmd, flag.ExitOnError)
	fs.StringVar(&c.clusterState, "cluster-state-dir", filepath.Join(root, ".localcluster"), "state directory of `devcluster up`")
	fs.StringVar(&c.stateDir, "state-dir", filepath.Join(root, "_output", "demo"), "the demo's state: mirror binary, PID and log, model files")
	fs.StringVar(&c.namespace, "namespace", "default", "namespace of the ModelOrchestra")
	fs.StringVar(&c.name, "name", "demo", "name of the ModelOrchestra")
	fs.StringVar(&c.operatorNS, "operator-namespace", "orchestra-system", "namespace of the operator release")
	fs.StringVar(&c.mirrorListen, "mirror-listen", net.JoinHostPort(stack.NodeAddress, "8088"), "address of the Hugging Face mirror (pods must reach it: the node address)")
	fs.IntVar(&c.nodePort, "node-port", 30080, "NodePort of the gateway (answers on 127.0.0.1); 0 lets Kubernetes choose")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "how long to wait for the stack to be Ready")
	fs.StringVar(&c.prompt, "prompt", "Tell me about Model Orchestra in a few words.", "the chat prompt sent through the gateway")
	fs.StringVar(&c.model, "model", "", "a GGUF file of yours for the Ollama application, served by the mirror and fetched and verified like the generated one (make run MODEL=...)")
	_ = fs.Parse(os.Args[2:])
	c.tokenSecret = c.name + "-token"
	c.samplePath = filepath.Join(root, "config", "samples", "simulator.yaml")
	c.operatorChart = filepath.Join(root, "charts", "orchestra-operator")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cmd == "up" {
		err = up(ctx, c)
	} else {
		err = down(ctx, c)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo %s failed: %v\n", cmd, err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }
func info(format string, args ...any) { fmt.Printf("    "+format+"\n", args...) }

type clients struct {
	kubeconfig string
	cs         kubernetes.Interface
	dyn        dynamic.Interface
}

func connect(c config) (*clients, error) {
	st, err := localcluster.ReadDevState(c.clusterState)
	if err != nil {
		if errors.Is(err, localcluster.ErrNotRunning) {
			return nil, fmt.Errorf("%w in %s: start one with `go run ./cmd/devcluster up --images _output/images` (make run does)", err, c.clusterState)
		}
		return nil, err
	}
	if !st.RealNode {
		return nil, errors.New("the local cluster has no real node (it was started with --control-plane-only): the demo runs pods")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", st.Kubeconfig, err)
	}
	rc.QPS, rc.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &clients{kubeconfig: st.Kubeconfig, cs: cs, dyn: dyn}, nil
}

func up(ctx context.Context, c config) error {
	step("Using the local cluster in %s", c.clusterState)
	cl, err := connect(c)
	if err != nil {
		return err
	}
	info("export KUBECONFIG=%s", cl.kubeconfig)

	ollamaModel, err := mirrorUserModel(c)
	if err != nil {
		return err
	}
	step("Starting the Hugging Face mirror on %s (serving hf://%s%s)", c.mirrorListen, stack.DemoModel, ollamaModel.also())
	if err := startMirror(ctx, c, ollamaModel); err != nil {
		return err
	}

	step("Installing the operator from %s into namespace %s", rel(c.root, c.operatorChart), c.operatorNS)
	err = stack.InstallOperator(ctx, cl.cs, stack.OperatorOptions{
		Kubeconfig: cl.kubeconfig, ChartDir: c.operatorChart, Namespace: c.operatorNS,
	}, info)
	if err != nil {
		return err
	}

	step("Creating the API token Secret %s/%s (label %s=true)", c.namespace, c.tokenSecret, stack.TokenLabel)
	token, err := stack.EnsureToken(ctx, cl.cs, c.namespace, c.tokenSecret)
	if err != nil {
		return err
	}

	obj, err := demoResource(c, ollamaModel)
	if err != nil {
		return err
	}
	step("Applying ModelOrchestra %s/%s (from %s, plus the application %q on Ollama)", c.namespace, c.name, rel(c.root, c.samplePath), ollamaApp)
	info("models downloaded by the operator's fetch Jobs from model.hubEndpoint http://%s: hf://%s%s", c.mirrorListen, stack.DemoModel, ollamaModel.also())
	if _, err := stack.Apply(ctx, cl.dyn, obj); err != nil {
		return err
	}

	step("Waiting for Ready (timeout %s)", c.timeout)
	start := time.Now()
	mo, err := stack.WaitReady(ctx, cl.dyn, cl.cs, c.namespace, c.name, stack.WaitOptions{
		Timeout:           c.timeout,
		OperatorNamespace: c.operatorNS,
		Progress: func(line string) {
			info("[%4.0fs] %s", time.Since(start).Seconds(), line)
		},
	})
	if err != nil {
		return err
	}
	base, err := stack.GatewayURL(ctx, cl.cs, c.namespace, c.name)
	if err != nil {
		return err
	}
	var models []string
	for _, a := range []struct{ app, what string }{
		{simulatorApp, "the simulator (orchestra-sim: fast and deterministic, no real model)"},
		{ollamaApp, "the real Ollama engine on " + ollamaModel.describe()},
	} {
		model := mo.Status.Applications[a.app].ServedModelName
		models = append(models, model)
		step("Streaming a chat completion from %q, %s, through the gateway at %s", model, a.what, base)
		fmt.Printf("    > %s\n    < ", c.prompt)
		res, err := stack.StreamChatOnceReachable(ctx, base, token, model, c.prompt, 64, func(s string) { fmt.Print(s) }, 30*time.Second)
		fmt.Println()
		if err != nil {
			return err
		}
		info("(%d chunks, finish_reason %s)", res.Chunks, res.FinishReason)
	}
	model := models[len(models)-1]

	fmt.Printf(`
Model Orchestra is serving %s.

  OpenAI base URL  %s
  API token        %s   (Secret %s/%s)
  In the cluster   %s

  export OPENAI_BASE_URL=%s
  export OPENAI_API_KEY=%s

  curl -N %s/chat/completions \
    -H "Authorization: Bearer %s" -H "Content-Type: application/json" \
    -d '{"model":%q,"stream":true,"messages":[{"role":"user","content":"Hello!"}]}'

  kubectl get mo -n %s            # KUBECONFIG=%s
  go run ./hack/demo down         # make down: remove the demo, then the cluster
`, quotedList(models), base, token, c.namespace, c.tokenSecret, mo.Status.Endpoint, base, token, base, token, model, c.namespace, cl.kubeconfig)
	return nil
}

// quotedList is ["a", "b"] as "a" and "b".
func quotedList(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = strconv.Quote(n)
	}
	return strings.Join(quoted, " and ")
}

// The demo's applications: the sample's simulator, and Ollama.
const (
	simulatorApp = "echo"
	ollamaApp    = "ollama"
)

// demoResource is config/samples/simulator.yaml with the demo's name and
// namespace, a second application on the real Ollama engine (the image
// `make images` built), the models from the mirror (model.hubEndpoint) and
// a NodePort gateway.
func demoResource(c config, m userModel) (*unstructured.Unstructured, error) {
	obj, err := stack.LoadResource(c.samplePath)
	if err != nil {
		return nil, err
	}
	obj.SetName(c.name)
	obj.SetNamespace(c.namespace)
	image, err := stack.ImageRef(filepath.Join(c.root, "_output", "images", "ollama.tar"))
	if err != nil {
		return nil, err
	}
	ollama := map[string]any{
		"runtime": map[string]any{
			"engine": "ollama",
			"image":  image,
			// Small requests, so that the demo fits a laptop; no memory
			// limit, so that a model of the user's loads whatever its size.
			"resources": map[string]any{"requests": map[string]any{"cpu": "250m", "memory": "512Mi"}},
		},
		"serving": map[string]any{"servedModelName": m.served(), "maxConcurrency": int64(4)},
	}
	if err := unstructured.SetNestedMap(obj.Object, ollama, "spec", "applications", ollamaApp); err != nil {
		return nil, err
	}
	if err := stack.MirrorModel(obj, "http://"+c.mirrorListen); err != nil {
		return nil, err
	}
	if m.repo != "" {
		model := map[string]any{
			"source":      "hf://" + m.repo,
			"hubEndpoint": "http://" + c.mirrorListen,
			"format":      "gguf",
			"file":        m.file,
			"cache":       map[string]any{"size": m.cacheSize()},
		}
		if err := unstructured.SetNestedMap(obj.Object, model, "spec", "applications", ollamaApp, "model"); err != nil {
			return nil, err
		}
	}
	svc := map[string]any{"type": "NodePort"}
	if c.nodePort != 0 {
		svc["nodePort"] = int64(c.nodePort)
	}
	if err := unstructured.SetNestedMap(obj.Object, svc, "spec", "gateway", "service"); err != nil {
		return nil, err
	}
	return obj, nil
}

func down(ctx context.Context, c config) error {
	cl, err := connect(c)
	switch {
	case errors.Is(err, localcluster.ErrNotRunning):
		step("No local cluster is running: only stopping the mirror")
	case err != nil:
		return err
	default:
		step("Deleting ModelOrchestra %s/%s", c.namespace, c.name)
		if err := deleteResource(ctx, cl, c); err != nil {
			return err
		}
		step("Removing the demo's token")
		if err := deleteDemoObjects(ctx, cl, c); err != nil {
			return err
		}
		step("Uninstalling the operator from namespace %s", c.operatorNS)
		if err := stack.UninstallOperator(ctx, cl.cs, stack.OperatorOptions{Kubeconfig: cl.kubeconfig, Namespace: c.operatorNS}, info); err != nil {
			return err
		}
	}
	step("Stopping the Hugging Face mirror")
	return stopMirror(c)
}

func deleteResource(ctx context.Context, cl *clients, c config) error {
	_, err := cl.dyn.Resource(stack.GVR).Namespace(c.namespace).List(ctx, metav1.ListOptions{Limit: 1})
	if apierrors.IsNotFound(err) {
		info("the ModelOrchestra CRD is not installed")
		return nil
	}
	return stack.Delete(ctx, cl.dyn, c.namespace, c.name, 3*time.Minute, info)
}

func deleteDemoObjects(ctx context.Context, cl *clients, c config) error {
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &bg}
	var errs []error
	if err := cl.cs.CoreV1().Secrets(c.namespace).Delete(ctx, c.tokenSecret, opts); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	// The stack's claims (model cache, NATS volumes) go with its release:
	// Helm deletes the cache claim, the NATS StatefulSet's retention policy
	// its claims, each once no pod uses it. Delete any that nothing is
	// deleting, and wait for all of them, so that nothing is left behind.
	claims := cl.cs.CoreV1().PersistentVolumeClaims(c.namespace)
	byInstance := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + c.name}
	pvcs, err := claims.List(ctx, byInstance)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, p := range pvcs.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		info("deleting claim %s, which the stack left", p.Name)
		if err := claims.Delete(ctx, p.Name, opts); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		left, err := claims.List(ctx, byInstance)
		return err == nil && len(left.Items) == 0, nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("claims of %s/%s are still there: %w", c.namespace, c.name, err))
	}
	return errors.Join(errs...)
}

// The mirror runs detached (its own session) so that it outlives `demo up`;
// its PID is kept in the state directory for `demo down`.

func (c config) mirrorBinary() string  { return filepath.Join(c.stateDir, "hubmirror") }
func (c config) mirrorPIDFile() string { return filepath.Join(c.stateDir, "hubmirror.pid") }

// mirrorPID returns the PID of the running mirror, or 0.
func mirrorPID(c config) int {
	data, err := os.ReadFile(c.mirrorPIDFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || strings.TrimSuffix(exe, " (deleted)") != c.mirrorBinary() {
		return 0 // gone, or the PID now belongs to another program
	}
	return pid
}

// startMirror starts the mirror, or keeps the running one unless restart
// (the mirror reads its repositories when it starts).
func startMirror(ctx context.Context, c config, m userModel) error {
	restart := m.repo != ""
	modelRoot := filepath.Join(c.stateDir, "models")
	if err := stack.WriteTinyModel(modelRoot); err != nil {
		return err
	}
	// the safetensors checkpoint of config/samples/ollama-safetensors.yaml
	if err := stack.WriteTinyHFModel(modelRoot); err != nil {
		return err
	}
	url := "http://" + c.mirrorListen
	if pid := mirrorPID(c); pid != 0 && !restart {
		info("already running (pid %d)", pid)
		return waitMirror(ctx, url, pid, 0)
	} else if pid != 0 {
		info("restarting it (pid %d) to serve your model", pid)
		if err := stopMirror(c); err != nil {
			return err
		}
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", c.mirrorBinary(), "./hack/hubmirror")
	build.Dir = c.root
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building hack/hubmirror: %w", err)
	}
	logPath := filepath.Join(c.stateDir, "hubmirror.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }() // the child keeps its own descriptor
	args := []string{"--root", modelRoot, "--listen", c.mirrorListen}
	if m.repo != "" {
		args = append(args, "--file", m.repo+"="+m.path)
	}
	cmd := exec.Command(c.mirrorBinary(), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the mirror: %w", err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	if err := os.WriteFile(c.mirrorPIDFile(), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return err
	}
	info("pid %d, log %s", pid, rel(c.root, logPath))
	// The mirror hashes a file of the user's before it answers (at 50 MiB/s
	// or better).
	if err := waitMirror(ctx, url, pid, time.Duration(m.size/(50<<20))*time.Second); err != nil {
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("%w\nmirror log:\n%s", err, log)
	}
	return nil
}

// waitMirror waits until the mirror answers for the demo repository.
func waitMirror(ctx context.Context, url string, pid int, extra time.Duration) error {
	probe := url + "/api/models/" + stack.DemoModel + "/revision/main"
	deadline := time.Now().Add(30*time.Second + extra)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, probe, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close() // only the status matters
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		if syscall.Kill(pid, 0) != nil {
			return fmt.Errorf("the mirror (pid %d) exited", pid)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the mirror does not answer %s: %w", probe, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func stopMirror(c config) error {
	pid := mirrorPID(c)
	if pid == 0 {
		info("not running")
		_ = os.Remove(c.mirrorPIDFile())
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping the mirror (pid %d): %w", pid, err)
	}
	for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	info("stopped (pid %d)", pid)
	return os.Remove(c.mirrorPIDFile())
}

func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil {
		return r
	}
	return p
}
