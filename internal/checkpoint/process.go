package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// A seat-group pod shares its process namespace (shareProcessNamespace), so
// a seat agent sees the processes of every container of the pod. To restart
// its engine in place it finds the engine's container by the one thing no
// other engine of the pod shares, the port its engine listens on, checks
// that the listening process is the kind of engine it drives, and stops
// that container's processes (SIGTERM, then SIGKILL after a grace period).
// The kubelet starts the container again (restartPolicy Always). The seat
// needs no capability: it runs as its engine's user, and the kernel lets a
// process signal, and read the open files of, processes of its own user.

// Proc is one process as /proc shows it.
type Proc struct {
	PID, PPID int
	// Start is the process's start time in clock ticks since boot, which
	// tells a process from a later one that reuses its PID.
	Start uint64
	// State is the one-letter state of /proc/<pid>/stat (Z: a zombie).
	State   byte
	Cmdline []string
}

// ProcFS reads processes from a procfs mount (normally /proc).
type ProcFS struct {
	Root string
}

func (p ProcFS) root() string {
	if p.Root == "" {
		return "/proc"
	}
	return p.Root
}

// Proc reads one process; an error wrapping os.ErrNotExist when it is gone.
func (p ProcFS) Proc(pid int) (Proc, error) {
	dir := filepath.Join(p.root(), strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return Proc{}, err
	}
	// pid (comm) state ppid ... ; comm may hold spaces and parentheses.
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return Proc{}, fmt.Errorf("reading %s/stat: no command name", dir)
	}
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 20 {
		return Proc{}, fmt.Errorf("reading %s/stat: %d fields after the command name", dir, len(f))
	}
	pr := Proc{PID: pid, State: f[0][0]}
	if pr.PPID, err = strconv.Atoi(f[1]); err != nil {
		return Proc{}, fmt.Errorf("reading %s/stat: ppid: %w", dir, err)
	}
	if pr.Start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return Proc{}, fmt.Errorf("reading %s/stat: start time: %w", dir, err)
	}
	cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return Proc{}, err
	}
	pr.Cmdline = strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	return pr, nil
}

// All reads every process it can see; processes that end while it reads
// are left out.
func (p ProcFS) All() ([]Proc, error) {
	ents, err := os.ReadDir(p.root())
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pr, err := p.Proc(pid)
		if err != nil {
			continue
		}
		out = append(out, pr)
	}
	return out, nil
}

// listenerInodes returns the socket inodes listening on TCP port in the
// reader's network namespace (the pod's, shared by its containers).
func (p ProcFS) listenerInodes(port int) (map[string]bool, error) {
	inodes := map[string]bool{}
	read := 0
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(p.root(), "self", "net", name))
		if err != nil {
			continue
		}
		read++
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 || fl[3] != "0A" { // 0A: LISTEN
				continue
			}
			i := strings.LastIndexByte(fl[1], ':')
			if i < 0 {
				continue
			}
			if lp, err := strconv.ParseUint(fl[1][i+1:], 16, 16); err == nil && int(lp) == port {
				inodes[fl[9]] = true
			}
		}
		_ = f.Close()
	}
	if read == 0 {
		return nil, fmt.Errorf("reading %s/self/net/tcp: no TCP socket table", p.root())
	}
	return inodes, nil
}

// Listeners returns the processes holding a socket that listens on TCP
// port. denied counts the processes whose open files it could not read
// (another user's).
func (p ProcFS) Listeners(port int) (pids []int, denied int, err error) {
	inodes, err := p.listenerInodes(port)
	if err != nil || len(inodes) == 0 {
		return nil, 0, err
	}
	ents, err := os.ReadDir(p.root())
	if err != nil {
		return nil, 0, fmt.Errorf("listing processes: %w", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join(p.root(), e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				denied++
			}
			continue
		}
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, denied, nil
}

// EngineMatcher reports whether a process's command line is the engine
// kind's server. It checks the kind; the port tells one application's
// engine from another's.
type EngineMatcher func(cmdline []string) bool

// engineMatchers are the command lines of each kind's serving process:
//   - vLLM: `vllm serve …` (the image's entrypoint, through python) or
//     `python -m vllm.entrypoints.openai.api_server …`;
//   - Ollama: `ollama serve` (the chart starts it from a shell that creates
//     the model first; its model runners are `ollama runner …` children);
//   - llama.cpp: `llama-server …` (the router; its model instances are
//     llama-server children);
//   - the simulator: `orchestra-sim …`.
var engineMatchers = map[string]EngineMatcher{
	EngineVLLM: func(c []string) bool {
		for i, a := range c {
			if strings.Contains(a, "vllm.entrypoints") || (filepath.Base(a) == "vllm" && i+1 < len(c) && c[i+1] == "serve") {
				return true
			}
		}
		return false
	},
	EngineOllama: func(c []string) bool {
		return len(c) >= 2 && filepath.Base(c[0]) == "ollama" && c[1] == "serve"
	},
	EngineLlamaCPP: func(c []string) bool { return len(c) >= 1 && filepath.Base(c[0]) == "llama-server" },
	EngineSimulator: func(c []string) bool {
		return len(c) >= 1 && filepath.Base(c[0]) == "orchestra-sim"
	},
}

// ErrNotAnEngine refuses a process snapshot of a process that is not an
// engine's serving process.
var ErrNotAnEngine = errors.New("not an engine's serving process")

// isEngineProcess checks that pid is an engine's serving process (by the
// engine matchers of its command line): the node agent dumps no other.
func isEngineProcess(fs ProcFS, pid int) error {
	p, err := fs.Proc(pid)
	if err != nil {
		return fmt.Errorf("process %d: %w: %w", pid, ErrNotAnEngine, err)
	}
	for _, match := range engineMatchers {
		if match(p.Cmdline) {
			return nil
		}
	}
	return fmt.Errorf("process %d (%s): %w", pid, strings.Join(p.Cmdline, " "), ErrNotAnEngine)
}

// ErrEngineProcessNotFound is returned when no process of the seat's
// engine kind listens on the engine's port.
var ErrEngineProcessNotFound = errors.New("the engine's process was not found")

// ErrEngineNotRunning is returned when nothing listens on the engine's
// port: its container is not running (it ended, or is starting again).
var ErrEngineNotRunning = fmt.Errorf("%w: nothing listens on the engine's port", ErrEngineProcessNotFound)

// EngineProcess finds one engine's processes in a shared process namespace
// and stops them.
type EngineProcess struct {
	Kind string
	// Port is the engine's TCP port, which only its process listens on.
	Port  int
	Proc  ProcFS
	Match EngineMatcher
	// Grace is the wait between SIGTERM and SIGKILL.
	Grace time.Duration
	// Poll paces the checks that the processes ended.
	Poll time.Duration
	// self is the agent's own PID; it and its ancestors are never stopped.
	self int
}

// NewEngineProcess returns the finder of kind's process listening on port.
func NewEngineProcess(kind string, port int, grace time.Duration) (*EngineProcess, error) {
	m, ok := engineMatchers[kind]
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
func (e *EngineProcess) Tree() ([]Proc, error) {
	pids, denied, err := e.Proc.Listeners(e.Port)
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 && denied == 0 {
		if inodes, err := e.Proc.listenerInodes(e.Port); err == nil && len(inodes) == 0 {
			return nil, fmt.Errorf("%w (%d)", ErrEngineNotRunning, e.Port)
		}
	}
	procs, err := e.Proc.All()
	if err != nil {
		return nil, err
	}
	byPID := make(map[int]Proc, len(procs))
	for _, p := range procs {
		byPID[p.PID] = p
	}
	var listener *Proc
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
			detail += fmt.Sprintf("; %d processes of another user could not be read: the seat must run as its engine's user, in a pod with shareProcessNamespace", denied)
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
	tree := []Proc{main}
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
func (e *EngineProcess) alive(p Proc) bool {
	now, err := e.Proc.Proc(p.PID)
	return err == nil && now.Start == p.Start && now.State != 'Z'
}
