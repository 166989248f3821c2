package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// A detached cluster (`make run`, cmd/devcluster) lives in a state
// directory and is run by a supervisor process: `devcluster up` starts the
// supervisor in a new session, the supervisor calls Start and waits for
// SIGTERM, then calls Stop. The state directory holds:
//
//	options.json   the Options the cluster was started with
//	state.json     the supervisor's PID, the kubeconfig and component PIDs
//	supervisor.log the supervisor's own output
//	logs/          one <component>.log per process (kept after down)
//	work/          certificates, etcd, containerd and kubelet state
const (
	optionsFile    = "options.json"
	stateFile      = "state.json"
	supervisorLog  = "supervisor.log"
	stateWorkDir   = "work"
	stateLogDir    = "logs"
	upPollInterval = 200 * time.Millisecond
)

// DevState describes a detached cluster; it is written to state.json once
// the cluster is ready.
type DevState struct {
	SupervisorPID int            `json:"supervisorPID"`
	Kubeconfig    string         `json:"kubeconfig"`
	APIServer     string         `json:"apiServer"`
	WorkDir       string         `json:"workDir"`
	LogDir        string         `json:"logDir"`
	RealNode      bool           `json:"realNode"`
	Processes     map[string]int `json:"processes"`
	Started       time.Time      `json:"started"`
	StartDuration string         `json:"startDuration"`
}

// ErrNotRunning is returned when the state directory has no live cluster.
var ErrNotRunning = errors.New("no local cluster is running")

// Up starts a detached cluster in stateDir and returns once it is ready.
// supervisor is the command that runs Serve (normally the devcluster
// binary with its hidden "serve" subcommand); it gets "--state-dir
// <stateDir>" appended.
func Up(ctx context.Context, stateDir string, opts Options, supervisor []string) (DevState, error) {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return DevState{}, err
	}
	if st, err := ReadDevState(stateDir); err == nil && processAlive(st.SupervisorPID) {
		return st, fmt.Errorf("a local cluster is already up (supervisor pid %d): use it, or run `devcluster down` first", st.SupervisorPID)
	}
	// Whatever a crashed run left behind goes first.
	if err := Down(ctx, stateDir); err != nil {
		return DevState{}, fmt.Errorf("cleaning up the previous cluster: %w", err)
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return DevState{}, err
	}
	opts.WorkDir = filepath.Join(stateDir, stateWorkDir)
	opts.LogDir = filepath.Join(stateDir, stateLogDir)
	_ = os.RemoveAll(opts.LogDir)
	data, err := json.MarshalIndent(opts, "", "  ")
	if err != nil {
		return DevState{}, err
	}
	if err := os.WriteFile(filepath.Join(stateDir, optionsFile), data, 0o644); err != nil {
		return DevState{}, err
	}
	logPath := filepath.Join(stateDir, supervisorLog)
	logFile, err := os.Create(logPath)
	if err != nil {
		return DevState{}, err
	}
	defer func() { _ = logFile.Close() }()
	args := append(append([]string{}, supervisor[1:]...), "--state-dir", stateDir)
	cmd := exec.Command(supervisor[0], args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// A session of its own: the cluster outlives this command and its terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return DevState{}, fmt.Errorf("starting the supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timeout := opts.Default().StartTimeout + 30*time.Second
	deadline := time.After(timeout)
	for {
		select {
		case err := <-exited:
			return DevState{}, fmt.Errorf("the supervisor exited (%w) before the cluster was ready; last lines of %s:\n%s", err, logPath, tailFile(logPath, 30))
		case <-deadline:
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
			return DevState{}, fmt.Errorf("the cluster was not ready after %s; see %s and %s", timeout, logPath, opts.LogDir)
		case <-ctx.Done():
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
			return DevState{}, ctx.Err()
		case <-time.After(upPollInterval):
		}
		if st, err := ReadDevState(stateDir); err == nil && st.SupervisorPID == cmd.Process.Pid {
			// Leave the supervisor running; nobody waits for it from here on.
			_ = cmd.Process.Release()
			return st, nil
		}
	}
}

// Serve is the supervisor: it starts the cluster described by
// <stateDir>/options.json, records it in state.json, and stops it on
// SIGTERM or SIGINT (SIGHUP is ignored).
func Serve(ctx context.Context, stateDir string) error {
	data, err := os.ReadFile(filepath.Join(stateDir, optionsFile))
	if err != nil {
		return err
	}
	var opts Options
	if err := json.Unmarshal(data, &opts); err != nil {
		return fmt.Errorf("reading %s: %w", optionsFile, err)
	}
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	began := time.Now()
	c, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	st := DevState{
		SupervisorPID: os.Getpid(),
		Kubeconfig:    c.KubeconfigFile(),
		APIServer:     c.APIServerURL(),
		WorkDir:       c.WorkDir(),
		LogDir:        c.LogDir(),
		RealNode:      opts.RealNode,
		Processes:     c.Processes(),
		Started:       began.UTC(),
		StartDuration: time.Since(began).Round(10 * time.Millisecond).String(),
	}
	if err := writeJSON(filepath.Join(stateDir, stateFile), st); err != nil {
		return errors.Join(err, c.Stop())
	}
	slog.Info("cluster ready", "took", st.StartDuration, "kubeconfig", st.Kubeconfig)
	<-ctx.Done()
	slog.Info("stopping the cluster")
	err = c.Stop()
	_ = os.Remove(filepath.Join(stateDir, stateFile))
	return err
}

// Down stops the cluster of stateDir and undoes its host changes. It works
// after a crash of the supervisor or of the whole machine, and does
// nothing when nothing runs. Component logs are kept.
func Down(ctx context.Context, stateDir string) error {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	st, stErr := ReadDevState(stateDir)
	if stErr == nil && processAlive(st.SupervisorPID) {
		_ = syscall.Kill(st.SupervisorPID, syscall.SIGTERM)
		deadline := time.Now().Add(2 * time.Minute)
		for processAlive(st.SupervisorPID) && time.Now().Before(deadline) {
			time.Sleep(upPollInterval)
		}
		if processAlive(st.SupervisorPID) {
			_ = syscall.Kill(st.SupervisorPID, syscall.SIGKILL)
		}
	}
	// Components of a supervisor that died (their parent-death signal
	// normally takes them along, but not the containerd shims).
	work := filepath.Join(stateDir, stateWorkDir)
	for _, pid := range ProcessesUsing(work) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	var errs []error
	if o, err := ReadOwner(); err == nil && o.WorkDir == work {
		errs = append(errs, CleanupStale(ctx))
	}
	errs = append(errs, removeState(stateDir))
	return errors.Join(errs...)
}

func removeState(stateDir string) error {
	var errs []error
	for _, p := range []string{stateFile, optionsFile, stateWorkDir} {
		if err := os.RemoveAll(filepath.Join(stateDir, p)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ReadDevState reads <stateDir>/state.json; it fails with ErrNotRunning
// when there is none.
func ReadDevState(stateDir string) (DevState, error) {
	var st DevState
	data, err := os.ReadFile(filepath.Join(stateDir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, ErrNotRunning
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("reading %s: %w", stateFile, err)
	}
	return st, nil
}

// DevStatus is what `devcluster status` reports.
type DevStatus struct {
	DevState
	SupervisorAlive bool
	APIServerReady  bool
	APIServerError  string
	Alive           map[string]bool
}

// Status checks the detached cluster of stateDir.
func Status(ctx context.Context, stateDir string) (DevStatus, error) {
	st, err := ReadDevState(stateDir)
	if err != nil {
		return DevStatus{}, err
	}
	s := DevStatus{DevState: st, SupervisorAlive: processAlive(st.SupervisorPID), Alive: map[string]bool{}}
	for name, pid := range st.Processes {
		s.Alive[name] = processAlive(pid)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		s.APIServerError = err.Error()
		return s, nil
	}
	client, err := httpClientFor(cfg)
	if err != nil {
		s.APIServerError = err.Error()
		return s, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.APIServer+"/readyz", nil)
	if err != nil {
		return s, err
	}
	resp, err := client.Do(req)
	if err != nil {
		s.APIServerError = err.Error()
		return s, nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	s.APIServerReady = resp.StatusCode == http.StatusOK
	if !s.APIServerReady {
		s.APIServerError = fmt.Sprintf("/readyz answered %d: %s", resp.StatusCode, body)
	}
	return s, nil
}

// ImportImages imports docker-archive tarballs into the real node of the
// detached cluster in stateDir.
func ImportImages(ctx context.Context, stateDir string, tarballs ...string) error {
	st, err := ReadDevState(stateDir)
	if err != nil {
		return err
	}
	if !st.RealNode {
		return ErrNoRealNode
	}
	socket := filepath.Join(st.WorkDir, "containerd", "run", "containerd.sock")
	for _, t := range tarballs {
		if err := importImage(ctx, socket, t); err != nil {
			return err
		}
	}
	return nil
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
