package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
)

// TestMain runs the real main in a child process when asked to, so that the
// test below exercises the binary as Kubernetes runs it: flags, config
// file, probes and SIGTERM.
func TestMain(m *testing.M) {
	if args := os.Getenv("ORCHESTRA_DISPATCHER_ARGS"); args != "" {
		os.Args = append([]string{"orchestra-dispatcher"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestProbesAndMetricsOfTheBinary(t *testing.T) {
	engine, err := dataplanetest.StartEngine(dataplanetest.FastSim())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(engine.Close)
	httpPort, natsPort := freePort(t), freePort(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "dispatcher.yaml")
	cfg := fmt.Sprintf(`listenAddr: "127.0.0.1:%d"
orchestra: probes
nats:
  url: nats://127.0.0.1:%d
apps:
- name: chat
  endpoints: [%q]
shutdownTimeout: 2s
`, httpPort, natsPort, engine.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ORCHESTRA_DISPATCHER_ARGS=--config "+cfgPath)
	cmd.Stderr = io.Discard
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // no-op once it exited
		if err := <-exited; err != nil {
			t.Logf("dispatcher process at cleanup: %v", err) // killed: expected when the test failed early
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)

	eventually(t, 20*time.Second, holds("/healthz 200 without NATS", func() bool { code, _ := get(base + "/healthz"); return code == http.StatusOK }))
	if code, _ := get(base + "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz without NATS = %d, want 503", code)
	}

	srv, err := dataplanetest.StartNATS(filepath.Join(dir, "nats"), natsPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	eventually(t, 20*time.Second, holds("/readyz 200 with NATS", func() bool { code, _ := get(base + "/readyz"); return code == http.StatusOK }))

	code, body := get(base + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`orchestra_dispatcher_backlog{app="chat"}`,
		`orchestra_dispatcher_inflight{app="chat"} 0`,
		`orchestra_dispatcher_queue_wait_seconds_count{app="chat"} 0`,
		fmt.Sprintf(`orchestra_dispatcher_root_healthy{app="chat",root=%q} 1`, engine.URL),
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("still running 15s after SIGTERM")
	}
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

// get returns the status and body of GET url (0 when it cannot connect).
func get(url string) (int, string) {
	res, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer func() { _ = res.Body.Close() }()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
