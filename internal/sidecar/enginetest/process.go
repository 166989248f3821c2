package enginetest

// Fake engines as real processes (the sidecar's restart and device memory
// tests, the node agent's process snapshots): a test re-executes its own
// binary with the command line of the engine it mimics (argv[0] and the
// arguments are what /proc/<pid>/cmdline shows, Args) and its API on a
// port of its own:
//
//	vllm serve <model> --port N        with a child VLLM::EngineCore (vLLM v1's engine process)
//	ollama serve                       with a child `ollama runner` while its model is loaded
//	llama-server --port N --models-preset …
//	orchestra-sim --addr=:N …          the simulator itself
//
// The test binary's TestMain calls MainIfFakeEngine first.

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/sim"
	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// The fake engine process's environment.
const (
	EngineEnv = "ORCHESTRA_FAKE_ENGINE" // the kind to run, or "child"
	PortEnv   = "ORCHESTRA_FAKE_PORT"
	LoadedEnv = "ORCHESTRA_FAKE_LOADED" // "1": the model is loaded at start
	NoTermEnv = "ORCHESTRA_FAKE_IGNORE_SIGTERM"
	HotDirEnv = "ORCHESTRA_FAKE_HOT_DIR" // the simulator's hot tier
	FirstEnv  = "ORCHESTRA_FAKE_FIRST"   // "1": the container's first start
	Model     = "m"
)

// RunFakeEngine is the fake engine process's main: kind's fake (or the
// real simulator) serving on PortEnv until SIGTERM; it returns the exit
// code.
func RunFakeEngine(kind v1alpha1.Engine) int {
	if os.Getenv(NoTermEnv) == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	if kind == "child" {
		select {} // an engine's worker: holds its memory until it is killed
	}
	var h http.Handler
	var child []string
	loaded := os.Getenv(LoadedEnv) == "1"
	switch kind {
	case v1alpha1.EngineVLLM:
		v := NewVLLM() // vLLM starts awake, its weights loaded
		h, child = v.Handler(), []string{"VLLM::EngineCore"}
	case v1alpha1.EngineOllama:
		var models []string
		if loaded {
			models = []string{Model}
			child = []string{"ollama", "runner", "--model", "/models/blobs/sha256-m", "--port", "40001"}
		}
		o := NewOllama(models...)
		o.Create(Model) // the chart's script created it as the engine started
		h = o.Handler()
	case v1alpha1.EngineLlamaCPP:
		h = NewLlamaCPP(Model).Handler() // load-on-startup
	case v1alpha1.EngineSimulator:
		// The simulator itself, without --restartable, leaking its memory
		// on every sleep of its first start (vllm#47654).
		sc := sim.Default()
		sc.Weights.Bytes = 1 << 20
		sc.Sleep = sim.Sleep{Enabled: true, HotDir: os.Getenv(HotDirEnv)}
		sc.Faults.SleepLeak = os.Getenv(FirstEnv) == "1"
		s := sim.New(sc, sim.WithLogger(slog.New(slog.DiscardHandler)))
		if err := s.LoadWeights(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		h = s.Handler()
	default:
		fmt.Fprintln(os.Stderr, "unknown fake engine", kind)
		return 2
	}
	if child != nil {
		cmd := exec.Command(SelfExe())
		cmd.Args = child
		cmd.Env = append(os.Environ(), EngineEnv+"=child")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer func() { _ = cmd.Process.Kill() }()
	}
	ln, err := sim.Listen(context.Background(), "127.0.0.1:"+os.Getenv(PortEnv)) // snapshottable (TestNodeSnapshotsASimulator)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	if os.Getenv(NoTermEnv) == "1" {
		select {} // only SIGKILL ends it
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	_ = srv.Close()
	return 0
}

// SelfExe is the running (test) binary.
func SelfExe() string {
	p, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return p
}

// Args is each kind's command line on port.
func Args(kind v1alpha1.Engine, port int) []string {
	p := strconv.Itoa(port)
	switch kind {
	case v1alpha1.EngineVLLM:
		return []string{"/usr/bin/python3", "/usr/local/bin/vllm", "serve", "/models/m", "--port", p, "--enable-sleep-mode"}
	case v1alpha1.EngineOllama:
		return []string{"ollama", "serve"}
	case v1alpha1.EngineSimulator:
		return []string{"/orchestra-sim", "--addr=:" + p, "--enable-sleep-mode", "--fault-sleep-leak"}
	default:
		return []string{"/app/llama-server", "--host", "0.0.0.0", "--port", p, "--models-preset", "/etc/llama/models.ini"}
	}
}

// FreePort is a TCP port free on 127.0.0.1 now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// MainIfFakeEngine, called first in a TestMain, makes the test binary the
// fake engine named by EngineEnv (and exits) when it is set. Descriptors
// the test binary inherited (CI's flock holds one on its lock file) stay
// out of the processes the tests start: criu refuses to dump a process
// holding a file lock.
func MainIfFakeEngine() {
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if kind := os.Getenv(EngineEnv); kind != "" {
		os.Exit(RunFakeEngine(v1alpha1.Engine(kind)))
	}
}
