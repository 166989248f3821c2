package localcluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopGrace is how long a node component (kubelet, kube-proxy, CoreDNS,
// containerd) gets to exit after SIGTERM before its process group is
// killed. The control plane is killed at once: its state is thrown away,
// and a graceful apiserver shutdown takes more than 10 s once etcd is gone.
const stopGrace = 3 * time.Second

// ErrExited is returned when a component exits while the cluster starts.
var ErrExited = errors.New("component exited")

// process is one running component.
type process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid after done is closed
}

// startProcess runs bin in its own process group with stdout and stderr
// appended to <logDir>/<name>.log. The process gets SIGKILL if the calling
// process dies, so a crashed test leaves no component behind.
func startProcess(logDir, name, bin string, args []string, env []string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = processAttrs()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process ID, which is also its process group ID.
func (p *process) PID() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes an unexpected exit with the tail of the log.
func (p *process) exitError() error {
	status := p.err
	if status == nil {
		status = errors.New("exit status 0")
	}
	return fmt.Errorf("%w: %s (%w); last lines of %s:\n%s", ErrExited, p.Name, status, p.LogPath, tailFile(p.LogPath, 20))
}

// stop sends SIGTERM to the process group, waits up to grace, then kills
// the group; with no grace it kills at once. It is safe to call more than
// once.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.cmd.Process == nil {
		return
	}
	if p.exited() {
		// Reaped: the group ID may already belong to someone else.
		return
	}
	if grace <= 0 {
		_ = signalGroup(p.PID(), syscall.SIGKILL)
		<-p.done
		return
	}
	_ = signalGroup(p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	_ = signalGroup(p.PID(), syscall.SIGKILL)
	<-p.done
}

// tailFile returns the last n lines of a file, or a note why it cannot.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer func() { _ = f.Close() }()
	const maxRead = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxRead {
		_, _ = f.Seek(fi.Size()-maxRead, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// freePort asks the kernel for a free TCP port on host. Another process can
// take it before the component binds it; callers retry on ErrExited.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// addressInUse reports whether a component failed because its port was
// taken in the meantime.
func addressInUse(p *process) bool {
	data, err := os.ReadFile(p.LogPath)
	return err == nil && strings.Contains(string(data), "address already in use")
}

func itoa(i int) string { return strconv.Itoa(i) }
