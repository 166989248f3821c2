// Package engineproc reads an engine's processes from procfs, for both
// roles of orchestra-agent: the sidecar (internal/sidecar) finds its
// engine's processes to restart the engine in place and to attribute
// device memory to it; the node agent (internal/nodeagent) takes a
// process snapshot only of an engine's serving process (IsEngineProcess).
// Each engine kind's serving process is told by its command line
// (Matcher); a kind's port tells one application's engine from another's.
//
// Files:
//   - procfs.go: Proc, ProcFS (processes, TCP listeners), the engine
//     matchers, IsEngineProcess.
package engineproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

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

// Dir is the procfs mount read.
func (p ProcFS) Dir() string {
	if p.Root == "" {
		return "/proc"
	}
	return p.Root
}

// Proc reads one process; an error wrapping os.ErrNotExist when it is gone.
func (p ProcFS) Proc(pid int) (Proc, error) {
	dir := filepath.Join(p.Dir(), strconv.Itoa(pid))
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
	ents, err := os.ReadDir(p.Dir())
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

// ListenerInodes returns the socket inodes listening on TCP port in the
// reader's network namespace (the pod's, shared by its containers).
func (p ProcFS) ListenerInodes(port int) (map[string]bool, error) {
	inodes := map[string]bool{}
	read := 0
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(p.Dir(), "self", "net", name))
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
		return nil, fmt.Errorf("reading %s/self/net/tcp: no TCP socket table", p.Dir())
	}
	return inodes, nil
}

// Listeners returns the processes holding a socket that listens on TCP
// port. denied counts the processes whose open files it could not read
// (another user's).
func (p ProcFS) Listeners(port int) (pids []int, denied int, err error) {
	inodes, err := p.ListenerInodes(port)
	if err != nil || len(inodes) == 0 {
		return nil, 0, err
	}
	ents, err := os.ReadDir(p.Dir())
	if err != nil {
		return nil, 0, fmt.Errorf("listing processes: %w", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join(p.Dir(), e.Name(), "fd")
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

// matchers are the command lines of each kind's serving process:
//   - vLLM: `vllm serve …` (the image's entrypoint, through python) or
//     `python -m vllm.entrypoints.openai.api_server …`;
//   - Ollama: `ollama serve` (the chart starts it from a shell that creates
//     the model first; its model runners are `ollama runner …` children);
//   - llama.cpp: `llama-server …` (the router; its model instances are
//     llama-server children);
//   - the simulator: `orchestra-sim …`.
var matchers = map[v1alpha1.Engine]EngineMatcher{
	v1alpha1.EngineVLLM: func(c []string) bool {
		for i, a := range c {
			if strings.Contains(a, "vllm.entrypoints") || (filepath.Base(a) == "vllm" && i+1 < len(c) && c[i+1] == "serve") {
				return true
			}
		}
		return false
	},
	v1alpha1.EngineOllama: func(c []string) bool {
		return len(c) >= 2 && filepath.Base(c[0]) == "ollama" && c[1] == "serve"
	},
	v1alpha1.EngineLlamaCPP: func(c []string) bool { return len(c) >= 1 && filepath.Base(c[0]) == "llama-server" },
	v1alpha1.EngineSimulator: func(c []string) bool {
		return len(c) >= 1 && filepath.Base(c[0]) == "orchestra-sim"
	},
}

// ErrNotAnEngine refuses a process snapshot of a process that is not an
// engine's serving process.
var ErrNotAnEngine = errors.New("not an engine's serving process")

// IsEngineProcess checks that pid is an engine's serving process (by the
// engine matchers of its command line): the node agent dumps no other.
func IsEngineProcess(fs ProcFS, pid int) error {
	p, err := fs.Proc(pid)
	if err != nil {
		return fmt.Errorf("process %d: %w: %w", pid, ErrNotAnEngine, err)
	}
	for _, match := range matchers {
		if match(p.Cmdline) {
			return nil
		}
	}
	return fmt.Errorf("process %d (%s): %w", pid, strings.Join(p.Cmdline, " "), ErrNotAnEngine)
}

// Matcher is the matcher of an engine kind's serving process; false for a
// kind without one.
func Matcher(kind v1alpha1.Engine) (EngineMatcher, bool) {
	m, ok := matchers[kind]
	return m, ok
}
