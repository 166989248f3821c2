package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/nodeapi"
)

// ErrSnapshotsUnsupported refuses a process snapshot on a node that cannot
// take one; the error says why (criu missing, `criu check` failing, no
// snapshot directory).
var ErrSnapshotsUnsupported = errors.New("process snapshots are not supported on this node")

// criuDiagnoses explain the `criu check` failures seen on real nodes.
var criuDiagnoses = []struct{ match, why string }{
	{"Unexpected rt vDSO area bounds", "this criu cannot parse the kernel's vDSO layout (changed in Linux 6.13, checkpoint-restore/criu#2532); it needs a criu release that knows the new layout"},
	{"Operation not permitted", "criu needs root, or CAP_CHECKPOINT_RESTORE with CAP_SYS_ADMIN"},
	{"seccomp", "the kernel or a seccomp profile blocks a feature criu needs"},
}

// criuCheckReason turns `criu check` output into one line: the first error
// and, when known, what it means.
func criuCheckReason(out string, err error) string {
	first := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "Error") {
			first = strings.TrimSpace(l)
			break
		}
	}
	if first == "" {
		first = tail(out, 200)
	}
	reason := fmt.Sprintf("criu check failed (%v): %s", err, first)
	for _, d := range criuDiagnoses {
		if strings.Contains(out, d.match) {
			return reason + ": " + d.why
		}
	}
	return reason
}

// CRIU takes and restores process snapshots with the criu binary, only on a
// node whose probe passed. It never restores a container through the
// runtime's CreateContainer (deprecated in containerd): it restores a plain
// process tree, the simulator with its weights in its memory.
type CRIU struct {
	// Bin is the criu binary.
	Bin string
	// Report is the node's probe; Dump and Restore refuse unless
	// Report.CheckPassed.
	Report nodeapi.CRIUReport
}

// SnapshotStats describes one dump or restore.
type SnapshotStats struct {
	Dir     string  `json:"dir"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	PID     int     `json:"pid,omitempty"`
}

func (c CRIU) usable() error {
	if !c.Report.CheckPassed {
		return fmt.Errorf("%w: %s", ErrSnapshotsUnsupported, c.Report.Reason)
	}
	return nil
}

// criuProcessFlags are what dump and restore both pass, for the same
// process: its terminal and stdio as they are (--shell-job), its TCP
// connections closed (--tcp-close), its file locks kept (--file-locks).
var criuProcessFlags = []string{"--shell-job", "--tcp-close", "--file-locks", "--verbosity=2"}

// Dump checkpoints the process tree rooted at pid into dir (created, mode
// 0700) and leaves it stopped-and-gone, as a sleep would: its memory,
// weights included, is in the images.
func (c CRIU) Dump(ctx context.Context, pid int, dir string) (SnapshotStats, error) {
	if err := c.usable(); err != nil {
		return SnapshotStats{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return SnapshotStats{}, fmt.Errorf("creating the snapshot directory: %w", err)
	}
	start := time.Now()
	out, err := runLong(ctx, c.Bin, append([]string{"dump", "--tree", strconv.Itoa(pid), "--images-dir", dir,
		"--log-file", "dump.log"}, criuProcessFlags...)...)
	st := SnapshotStats{Dir: dir, Seconds: time.Since(start).Seconds(), Bytes: dirBytes(dir)}
	if err != nil {
		return st, fmt.Errorf("criu dump of pid %d: %w: %s", pid, err, logTail(dir, "dump.log", out))
	}
	return st, nil
}

// Restore restores the snapshot in dir as a detached process tree and
// returns its root's pid.
func (c CRIU) Restore(ctx context.Context, dir string) (SnapshotStats, error) {
	if err := c.usable(); err != nil {
		return SnapshotStats{}, err
	}
	pidFile := filepath.Join(dir, "restored.pid")
	_ = os.Remove(pidFile)
	start := time.Now()
	out, err := runLong(ctx, c.Bin, append([]string{"restore", "--images-dir", dir, "--restore-detached",
		"--pidfile", pidFile, "--log-file", "restore.log"}, criuProcessFlags...)...)
	st := SnapshotStats{Dir: dir, Seconds: time.Since(start).Seconds(), Bytes: dirBytes(dir)}
	if err != nil {
		return st, fmt.Errorf("criu restore from %s: %w: %s", dir, err, logTail(dir, "restore.log", out))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return st, fmt.Errorf("criu restore wrote no pid file: %w", err)
	}
	if st.PID, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return st, fmt.Errorf("criu restore pid file %q: %w", b, err)
	}
	return st, nil
}

// runLong runs a command bounded by ctx only (dumps of large processes
// take as long as their memory takes to write).
func runLong(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// logTail is what a failed criu run logged: its last error lines (the
// cause comes last, before the summary), else the end of its output.
// criu logs an error when it cannot raise its own open-file limit and goes
// on; that line is never the cause and is left out.
func logTail(dir, file, out string) string {
	if b, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
		var errs []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "Error") && !strings.Contains(l, "RLIMIT_NOFILE") {
				errs = append(errs, strings.TrimSpace(l))
			}
		}
		if len(errs) > 0 {
			return strings.Join(errs[max(0, len(errs)-3):], " / ")
		}
	}
	return tail(out, 500)
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
