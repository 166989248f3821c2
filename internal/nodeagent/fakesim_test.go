package nodeagent_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"
)

// The process snapshot tests dump a real simulator process: the test
// binary re-executes itself with the simulator's command line (argv[0]
// and the arguments are what /proc/<pid>/cmdline shows, which the node
// agent checks) and serves the simulator's API on a port of its own.

const (
	fakeEngineEnv = "ORCHESTRA_FAKE_ENGINE" // the kind to run: only the simulator here
	fakePortEnv   = "ORCHESTRA_FAKE_PORT"
	fakeLoadedEnv = "ORCHESTRA_FAKE_LOADED"  // "1": the weights are loaded at start
	fakeHotDirEnv = "ORCHESTRA_FAKE_HOT_DIR" // the simulator's hot tier
)

func TestMain(m *testing.M) {
	// Descriptors the test binary inherited (CI's flock holds one on its
	// lock file) stay out of the processes the tests start: criu refuses
	// to dump a process holding a file lock.
	_ = unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if kind := os.Getenv(fakeEngineEnv); kind != "" {
		os.Exit(runFakeSimulator(kind))
	}
	os.Exit(m.Run())
}

// runFakeSimulator is the fake engine process's main: the simulator
// itself, its weights loaded, on a snapshottable listener.
func runFakeSimulator(kind string) int {
	if kind != sidecarapi.EngineSimulator {
		fmt.Fprintln(os.Stderr, "unknown fake engine", kind)
		return 2
	}
	sc := sim.Default()
	sc.Weights.Bytes = 1 << 20
	sc.Sleep = sim.Sleep{Enabled: true, HotDir: os.Getenv(fakeHotDirEnv)}
	s := sim.New(sc, sim.WithLogger(slog.New(slog.DiscardHandler)))
	if err := s.LoadWeights(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := sim.Listen(context.Background(), "127.0.0.1:"+os.Getenv(fakePortEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	_ = srv.Close()
	return 0
}

func selfExe() string {
	p, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return p
}

// fakeArgs is the simulator's command line on port.
func fakeArgs(_ string, port int) []string {
	return []string{"/orchestra-sim", fmt.Sprintf("--addr=:%d", port), "--enable-sleep-mode"}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}
