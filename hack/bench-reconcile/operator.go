package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// kind tells how to start an operator under test and read its metrics.
type kind int

const (
	// orchestra is cmd/orchestra-operator (the working tree's or a
	// baseline's).
	orchestra kind = iota
	// peer is operator-framework's helm-operator-plugins: its own
	// "helm-operator run" command, or helm-operator-tuned (the same command
	// with the client rate limit as a flag), built by hack/tools/install.sh.
	peer
)

// subject is one operator under test: a row of the tables per resource
// count and round.
type subject struct {
	name string // in the tables
	kind kind
	bin  string
	args []string // added to the common arguments
}

// peerTunedArgs raise the peer's client rate limit from controller-runtime's
// 20 requests/s (burst 30) to what our operator runs with by default.
var peerTunedArgs = []string{"--kube-api-qps", "100", "--kube-api-burst", "200"}

// peerSubjects are the peer at its defaults and with its client rate limit
// raised, built into binDir by hack/tools/install.sh helm-operator-plugins.
func peerSubjects(binDir string) ([]subject, error) {
	shipped, tuned := filepath.Join(binDir, "helm-operator"), filepath.Join(binDir, "helm-operator-tuned")
	for _, b := range []string{shipped, tuned} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("the peer is not built (run make tools, or pass -peer=false): %w", err)
		}
	}
	return []subject{
		{name: "peer", kind: peer, bin: shipped},
		{name: "peer, QPS 100 burst 200", kind: peer, bin: tuned, args: peerTunedArgs},
	}, nil
}

// setup is what every operator under test is given: the local control
// plane's kubeconfig, our watches file (chart by name, from chartsDir) and
// the peer's (chart by path).
type setup struct {
	kubeconfig, chartsDir, watches, peerWatches string
}

// writeWatchFiles writes both watches files into dir.
func writeWatchFiles(dir, chartsDir string) (setup, error) {
	f := setup{chartsDir: chartsDir, watches: filepath.Join(dir, "watches.yaml"), peerWatches: filepath.Join(dir, "peer-watches.yaml")}
	if err := os.WriteFile(f.watches, []byte("- {group: test.modelorchestra.io, version: v1, kind: Sample, chart: small}\n"), 0o600); err != nil {
		return f, err
	}
	peerWatches := fmt.Sprintf("- group: test.modelorchestra.io\n  version: v1\n  kind: Sample\n  chart: %s\n", filepath.Join(chartsDir, "small"))
	return f, os.WriteFile(f.peerWatches, []byte(peerWatches), 0o600)
}

// operator is a running operator process.
type operator struct {
	kind                   kind
	cmd                    *exec.Cmd
	log                    *os.File
	metricsAddr, probeAddr string
	started                time.Time
}

// startOperator starts s watching namespace ns with the given workers and
// reconcile period, and returns once its caches have synced and its
// workers run. Its output goes to logName in the temporary directory.
func startOperator(s subject, f setup, ns string, workers int, period, logName string) (*operator, error) {
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	op := &operator{kind: s.kind, metricsAddr: addrs[0], probeAddr: addrs[1]}
	common := []string{
		"--max-concurrent-reconciles", strconv.Itoa(workers),
		"--metrics-bind-address", op.metricsAddr,
		"--health-probe-bind-address", op.probeAddr,
		"--reconcile-period", period,
	}
	var args []string
	switch s.kind {
	case orchestra:
		args = append([]string{"--watches-file", f.watches, "--charts-dir", f.chartsDir, "--pprof", "--count-api-requests"}, common...)
	case peer:
		args = append([]string{"run", "--watches-file", f.peerWatches}, common...)
	}
	op.cmd = exec.Command(s.bin, append(args, s.args...)...)
	op.cmd.Env = append(os.Environ(), "KUBECONFIG="+f.kubeconfig, "WATCH_NAMESPACE="+ns, "GOMAXPROCS="+strconv.Itoa(runtime.NumCPU()))
	if op.log, err = os.Create(filepath.Join(os.TempDir(), logName)); err != nil {
		return nil, err
	}
	op.cmd.Stdout, op.cmd.Stderr = op.log, op.log
	op.started = time.Now()
	if err := op.cmd.Start(); err != nil {
		_ = op.log.Close()
		return nil, err
	}
	if err := op.waitReady(30 * time.Second); err != nil {
		op.stop()
		return nil, fmt.Errorf("%s did not start (log %s): %w", s.name, op.log.Name(), err)
	}
	return op, nil
}

// waitReady waits until the operator serves metrics and reconciles: ours
// reports ready on /readyz once its caches have synced; the peer's /readyz
// is a ping, so its controller's "Starting workers" log line (which
// controller-runtime writes after the caches have synced) is the signal.
func (op *operator) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if err := waitHTTP("http://"+op.metricsAddr+"/metrics", deadline); err != nil {
		return fmt.Errorf("no /metrics endpoint: %w", err)
	}
	if op.kind == orchestra {
		return waitHTTP("http://"+op.probeAddr+"/readyz", deadline)
	}
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(op.log.Name())
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("Starting workers")) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New(`no "Starting workers" in the log`)
}

// stop interrupts the operator and waits for it to exit, killing it after
// 30 seconds.
func (op *operator) stop() {
	_ = op.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() {
		_ = op.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = op.cmd.Process.Kill()
		<-done
	}
	_ = op.log.Close()
}

func (op *operator) pid() int { return op.cmd.Process.Pid }

// freeAddrs returns n distinct free loopback addresses. The listeners are
// all held open until every port is chosen, so that the kernel cannot hand
// out the same port twice (an operator given one port for both its metrics
// and its probes dies with "address already in use").
func freeAddrs(n int) ([]string, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// waitHTTP waits until url answers 200.
func waitHTTP(url string, deadline time.Time) error {
	last := errors.New("no answer")
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s answered %d", url, resp.StatusCode)
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	return last
}

// shortName is a namespace-safe form of a subject's name.
func shortName(s subject) string {
	switch {
	case s.kind == peer && len(s.args) > 0:
		return "peer-tuned"
	case s.kind == peer:
		return "peer"
	case strings.HasPrefix(s.name, "baseline"):
		return "baseline"
	default:
		return "ours"
	}
}
