package sidecar

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/engineproc"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// A seat-group pod shares its process namespace (shareProcessNamespace), so
// a sidecar sees the processes of every container of the pod. To restart
// its engine in place it finds the engine's container by the one thing no
// other engine of the pod shares, the port its engine listens on, checks
// that the listening process is the kind of engine it drives, and stops
// that container's processes (SIGTERM, then SIGKILL after a grace period).
// The kubelet starts the container again (restartPolicy Always). The sidecar
// needs no capability: it runs as its engine's user, and the kernel lets a
// process signal, and read the open files of, processes of its own user.

// ErrEngineProcessNotFound is returned when no process of the sidecar's
// engine kind listens on the engine's port.
var ErrEngineProcessNotFound = errors.New("the engine's process was not found")

// ErrEngineNotRunning is returned when nothing listens on the engine's
// port: its container is not running (it ended, or is starting again).
var ErrEngineNotRunning = fmt.Errorf("%w: nothing listens on the engine's port", ErrEngineProcessNotFound)

// EngineProcess finds one engine's processes in a shared process namespace
// and stops them.
type EngineProcess struct {
	Kind v1alpha1.Engine
	// Port is the engine's TCP port, which only its process listens on.
	Port  int
	Proc  engineproc.ProcFS
	Match engineproc.EngineMatcher
	// Grace is the wait between SIGTERM and SIGKILL.
	Grace time.Duration
	// Poll paces the checks that the processes ended.
	Poll time.Duration
	// self is the agent's own PID; it and its ancestors are never stopped.
	self int
}

// NewEngineProcess returns the finder of kind's process listening on port.
func NewEngineProcess(kind v1alpha1.Engine, port int, grace time.Duration) (*EngineProcess, error) {
	m, ok := engineproc.Matcher(kind)
	if !ok {
		return nil, fmt.Errorf("no process matcher for engine %q", kind)
	}
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("engine port %d out of range", port)
	}
	return &EngineProcess{Kind: kind, Port: port, Match: m, Grace: grace, Poll: 20 * time.Millisecond, self: os.Getpid()}, nil
}

// Tree returns the engine container's processes: the main process first,
// then its descendants. The main process is the highest ancestor of the
// process listening on the port below the namespace's top (a parent
// outside it, PID 0, or the pod's pause process, PID 1) and below the
// agent's own ancestors (a test runs fake engines as its children).
func (e *EngineProcess) Tree() ([]engineproc.Proc, error) {
	pids, denied, err := e.Proc.Listeners(e.Port)
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 && denied == 0 {
		if inodes, err := e.Proc.ListenerInodes(e.Port); err == nil && len(inodes) == 0 {
			return nil, fmt.Errorf("%w (%d)", ErrEngineNotRunning, e.Port)
		}
	}
	procs, err := e.Proc.All()
	if err != nil {
		return nil, err
	}
	byPID := make(map[int]engineproc.Proc, len(procs))
	for _, p := range procs {
		byPID[p.PID] = p
	}
	var listener *engineproc.Proc
	for _, pid := range pids {
		p, ok := byPID[pid]
		if ok && e.Match(p.Cmdline) {
			listener = &p
			break
		}
	}
	if listener == nil {
		var seen []string
		for _, pid := range pids {
			seen = append(seen, fmt.Sprintf("%d %q", pid, strings.Join(byPID[pid].Cmdline, " ")))
		}
		detail := ""
		if len(seen) > 0 {
			detail += " (listening: " + strings.Join(seen, ", ") + ")"
		}
		if denied > 0 {
			detail += fmt.Sprintf("; %d processes of another user could not be read: the sidecar must run as its engine's user, in a pod with shareProcessNamespace", denied)
		}
		return nil, fmt.Errorf("%w: no %s process listens on port %d%s", ErrEngineProcessNotFound, e.Kind, e.Port, detail)
	}
	mine := map[int]bool{}
	for pid := e.self; pid > 1; {
		mine[pid] = true
		p, ok := byPID[pid]
		if !ok {
			break
		}
		pid = p.PPID
	}
	if mine[listener.PID] {
		return nil, fmt.Errorf("the process listening on port %d is the agent itself or its parent", e.Port)
	}
	main := *listener
	for main.PPID > 1 && !mine[main.PPID] {
		parent, ok := byPID[main.PPID]
		if !ok {
			break
		}
		main = parent
	}
	tree := []engineproc.Proc{main}
	for i := 0; i < len(tree); i++ {
		for _, p := range procs {
			if p.PPID == tree[i].PID {
				tree = append(tree, p)
			}
		}
	}
	return tree, nil
}

// PIDs returns the PIDs of the engine container's processes.
func (e *EngineProcess) PIDs() ([]int, error) {
	tree, err := e.Tree()
	if err != nil {
		return nil, err
	}
	pids := make([]int, len(tree))
	for i, p := range tree {
		pids[i] = p.PID
	}
	return pids, nil
}

// Stop sends SIGTERM to every process of the engine's container, waits
// until they end, and sends SIGKILL to those still running after the grace
// period. It returns once every one has ended (or is a zombie, which holds
// no memory), or fails when ctx ends first. When nothing listens on the
// engine's port, the engine is not running and there is nothing to stop
// (an empty report); a port held by another kind of process, or by
// processes the agent cannot read, is an error.
func (e *EngineProcess) Stop(ctx context.Context) (sidecarapi.StopReport, error) {
	start := time.Now()
	tree, err := e.Tree()
	if errors.Is(err, ErrEngineNotRunning) {
		return sidecarapi.StopReport{}, nil
	}
	if err != nil {
		return sidecarapi.StopReport{}, err
	}
	rep := sidecarapi.StopReport{Cmdline: strings.Join(tree[0].Cmdline, " ")}
	for _, p := range tree {
		rep.PIDs = append(rep.PIDs, p.PID)
	}
	signal := func(sig syscall.Signal) error {
		var errs []error
		for _, p := range tree {
			if !e.alive(p) {
				continue
			}
			if err := syscall.Kill(p.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("sending %v to %d (%s): %w", sig, p.PID, p.Cmdline[0], err))
			}
		}
		return errors.Join(errs...)
	}
	if err := signal(syscall.SIGTERM); err != nil {
		return rep, err
	}
	grace := time.NewTimer(e.Grace)
	defer grace.Stop()
	t := time.NewTicker(e.Poll)
	defer t.Stop()
	for {
		if !slices.ContainsFunc(tree, e.alive) {
			rep.Seconds = time.Since(start).Seconds()
			return rep, nil
		}
		select {
		case <-ctx.Done():
			return rep, fmt.Errorf("waiting for the engine's processes %v to end: %w", rep.PIDs, ctx.Err())
		case <-grace.C:
			rep.Killed = true
			if err := signal(syscall.SIGKILL); err != nil {
				return rep, err
			}
		case <-t.C:
		}
	}
}

// alive is true while p runs: the same process (PID and start time) is
// there and is not a zombie.
func (e *EngineProcess) alive(p engineproc.Proc) bool {
	now, err := e.Proc.Proc(p.PID)
	return err == nil && now.Start == p.Start && now.State != 'Z'
}
