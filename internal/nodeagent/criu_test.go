package nodeagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
	"github.com/model-orchestra/operator/internal/sim"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// fakeCRIU writes a criu stand-in that prints out and exits with code on
// `criu check`.
func fakeCRIU(t *testing.T, out string, code int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "criu")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Version: 3.17.1'; exit 0; fi\ncat <<'END'\n%s\nEND\nexit %d\n", out, code)
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return path
}

const vdsoFailure = `Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds
Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable
Error (criu/kerndat.c:1615): kerndat_vdso_fill_symtable failed when initializing kerndat.`

func TestProbeCRIU(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		bin        string
		present    bool
		passed     bool
		wantReason string
	}{
		"disabled": {"", false, false, "no criu binary configured"},
		"absent":   {filepath.Join(t.TempDir(), "no-criu"), false, false, "criu not found"},
		"passes":   {fakeCRIU(t, "Looks good.", 0), true, true, ""},
		"vdso":     {fakeCRIU(t, vdsoFailure, 1), true, false, "Unexpected rt vDSO area bounds: this criu cannot parse the kernel's vDSO layout"},
		"eperm":    {fakeCRIU(t, "Error (criu/cr-check.c:10): Operation not permitted", 1), true, false, "needs root"},
		"other":    {fakeCRIU(t, "Error (criu/x.c:1): something new", 1), true, false, "exit status 1): Error (criu/x.c:1): something new"},
	} {
		t.Run(name, func(t *testing.T) {
			r := nodeagent.ProbeCRIU(ctx, c.bin)
			if r.Present != c.present || r.CheckPassed != c.passed || !strings.Contains(r.Reason, c.wantReason) || (c.wantReason == "" && r.Reason != "") {
				t.Fatalf("report %+v, want present=%v passed=%v reason containing %q", r, c.present, c.passed, c.wantReason)
			}
			if c.present && r.Version != "3.17.1" {
				t.Errorf("version %q", r.Version)
			}
		})
	}
}

// A node that cannot snapshot answers 501 with the reason, and the report
// carries it; nothing crashes.
func TestNodeRefusesSnapshotsWithReason(t *testing.T) {
	for name, c := range map[string]struct {
		criu, snapshotDir, want string
	}{
		"criu broken": {fakeCRIU(t, vdsoFailure, 1), t.TempDir(), "criu: criu check failed"},
		"no dir":      {fakeCRIU(t, "Looks good.", 0), "", "no --snapshot-dir"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := nodeagent.NodeConfig{
				Store: nodeagent.StoreConfig{
					HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
					Budgets: nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20},
				},
				RuntimeVersion: "containerd://1.6.20", CRIU: c.criu, SnapshotDir: c.snapshotDir,
			}
			reg := prometheus.NewRegistry()
			n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			rep := n.Measure(context.Background())
			if rep.ProcessSnapshots || rep.ProcessSnapshotsReason == "" {
				t.Fatalf("report %+v: process snapshots should be refused with a reason", rep)
			}
			srv := httptest.NewServer(n.Handler(reg))
			defer srv.Close()
			for _, path := range []string{"/snapshots/team-a/m?pid=4242", "/snapshots/team-a/m/restore"} {
				resp, err := http.Post(srv.URL+path, "", nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(b), c.want) || !strings.Contains(string(b), "not supported on this node") {
					t.Errorf("POST %s: %d %s, want 501 naming %q", path, resp.StatusCode, b, c.want)
				}
			}
		})
	}
}

const helperEnv = "MO_CRIU_HELPER_DIR"

// heldLock is the helper process's locked file.
var heldLock *os.File

// TestCRIUHelperProcess is not a test: it is the process TestCRIUDumpRestore
// snapshots. It holds a lock on "engine.lock" and synthetic weights in
// memory and, whenever the file "ask" appears, writes the digest of the
// weights it holds to "answer".
func TestCRIUHelperProcess(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("helper process for TestCRIUDumpRestore")
	}
	// It holds a lock on a file, as engines do (a model download's lock
	// file): the snapshot keeps it (--file-locks).
	lock, err := os.OpenFile(filepath.Join(dir, "engine.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil || syscall.Flock(int(lock.Fd()), syscall.LOCK_EX) != nil {
		os.Exit(2)
	}
	heldLock = lock // kept from the finalizer, which would close it
	w := make([]byte, 64<<20)
	arena.Synthesize(w, 42)
	for {
		if _, err := os.Stat(filepath.Join(dir, "ask")); err == nil {
			_ = os.Remove(filepath.Join(dir, "ask"))
			_ = os.WriteFile(filepath.Join(dir, "answer.tmp"), []byte(arena.Sum(w).String()), 0o600)
			_ = os.Rename(filepath.Join(dir, "answer.tmp"), filepath.Join(dir, "answer"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// weightsProcess is a process holding 64 MiB of synthetic weights
// (TestCRIUHelperProcess); ask has it (or the process restored from its
// snapshot) write the digest of the weights it holds.
type weightsProcess struct {
	t    *testing.T
	ctx  context.Context
	work string
	pid  int
	cmd  *exec.Cmd
}

// ownSession starts a process as the leader of its own session. criu refuses a process whose
// session leader is outside its pid namespace, which is where the test binary's session is when
// the tests run inside a pid namespace (CI does); an engine in a container leads its own session.
func ownSession() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

func startWeightsProcess(ctx context.Context, t *testing.T) *weightsProcess {
	t.Helper()
	work := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCRIUHelperProcess$")
	cmd.Args[0] = "/orchestra-sim" // the agent dumps only an engine's serving process
	cmd.Env = append(os.Environ(), helperEnv+"="+work)
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = devnull.Close() })
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	cmd.SysProcAttr = ownSession()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return &weightsProcess{t: t, ctx: ctx, work: work, pid: cmd.Process.Pid, cmd: cmd}
}

// dumped reaps the process after criu dump ended it.
func (w *weightsProcess) dumped() { _ = w.cmd.Wait() }

// restored takes the process criu restored as pid: it is killed at the end.
func (w *weightsProcess) restored(pid int) {
	w.t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	})
}

func (w *weightsProcess) ask(pid int) string {
	w.t.Helper()
	_ = os.Remove(filepath.Join(w.work, "answer"))
	if err := os.WriteFile(filepath.Join(w.work, "ask"), nil, 0o600); err != nil {
		w.t.Fatal(err)
	}
	for w.ctx.Err() == nil {
		if b, err := os.ReadFile(filepath.Join(w.work, "answer")); err == nil {
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.t.Fatalf("process %d never answered", pid)
	return ""
}

// workingCRIU returns the node's criu when `criu check` passes. Where criu
// is missing it skips; where the check fails it proves that dump and restore
// refuse with the reason, then skips, saying why.
func workingCRIU(ctx context.Context, t *testing.T) nodeagent.CRIU {
	t.Helper()
	if _, err := exec.LookPath("criu"); err != nil {
		t.Skip("criu is not installed (hack/setup-criu.sh installs one that works on this kernel)")
	}
	c := nodeagent.CRIU{Bin: "criu", Report: nodeagent.ProbeCRIU(ctx, "criu")}
	if !c.Report.CheckPassed {
		images := t.TempDir()
		_, err := c.Dump(ctx, os.Getpid(), images)
		if !errors.Is(err, nodeagent.ErrSnapshotsUnsupported) || !strings.Contains(err.Error(), c.Report.Reason) || c.Report.Reason == "" {
			t.Fatalf("dump on a node whose criu check fails: %v, want ErrSnapshotsUnsupported with the reason", err)
		}
		if _, err := c.Restore(ctx, images); !errors.Is(err, nodeagent.ErrSnapshotsUnsupported) {
			t.Fatalf("restore on a node whose criu check fails: %v", err)
		}
		t.Skipf("criu %s is installed but `criu check` fails here, so the round trip cannot run (hack/setup-criu.sh installs one that works): %s", c.Report.Version, c.Report.Reason)
	}
	return c
}

// TestCRIUDumpRestore dumps a process holding 64 MiB of weights and a file
// lock and restores it: the restored process holds the same bytes and the
// lock.
func TestCRIUDumpRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := workingCRIU(ctx, t)
	p := startWeightsProcess(ctx, t)
	want := p.ask(p.pid)

	images := t.TempDir()
	dump, err := c.Dump(ctx, p.pid, images)
	if err != nil {
		t.Fatal(err)
	}
	p.dumped()
	if dump.Bytes < 64<<20 {
		t.Errorf("the images hold %d bytes, less than the weights", dump.Bytes)
	}
	rest, err := c.Restore(ctx, images)
	if err != nil {
		t.Fatal(err)
	}
	p.restored(rest.PID)
	if got := p.ask(rest.PID); got != want {
		t.Fatalf("restored process holds weights %s, want %s", got, want)
	}
	lock, err := os.Open(filepath.Join(p.work, "engine.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("taking the restored process's file lock: %v, want EWOULDBLOCK: the restored process holds it again", err)
	}
	t.Logf("dump %.3fs, restore %.3fs, %.1f MiB of images (pid %d)", dump.Seconds, rest.Seconds, float64(dump.Bytes)/(1<<20), rest.PID)
}

// snapshotAgent is a node agent whose snapshots use c and land under the
// returned directory; post calls its API and wants 200.
func snapshotAgent(ctx context.Context, t *testing.T, c nodeagent.CRIU) (snapshots string, post func(path string) nodeagent.SnapshotStats) {
	t.Helper()
	snapshots = t.TempDir()
	cfg := nodeagent.NodeConfig{
		Store: nodeagent.StoreConfig{
			HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"),
			Budgets: nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20},
		},
		RuntimeVersion: "containerd://1.6.20", CRIU: c.Bin, SnapshotDir: snapshots,
	}
	reg := prometheus.NewRegistry()
	n, err := nodeagent.NewNode(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// The snapshotted process runs in no pod here: the release check
	// (releaseproc.go) is TestNodeAgentRefusesForbiddenCalls's.
	n.SetProcessOwner(nodeagent.ProcessOwnerFunc(func(context.Context, int) error { return nil }))
	// The agent's own snapshots need criu only; the report's
	// processSnapshots (container checkpoints) also needs the runtime.
	n.Measure(ctx)
	if ok, why := n.SnapshotSupport(); !ok {
		t.Fatalf("criu check passes, but the agent refuses snapshots: %s", why)
	}
	srv := httptest.NewServer(n.Handler(reg))
	t.Cleanup(srv.Close)
	return snapshots, func(path string) nodeagent.SnapshotStats {
		t.Helper()
		var st nodeagent.SnapshotStats
		if code, b := postJSON(t, srv.URL+path, &st); code != http.StatusOK {
			t.Fatalf("POST %s: %d %s", path, code, b)
		}
		return st
	}
}

// postJSON posts nothing to url and decodes a 200 answer into out.
func postJSON(t *testing.T, url string, out any) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("POST %s: %v: %s", url, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// TestNodeSnapshotsAProcess drives the node agent's snapshot API with the
// node's criu: the dump lands under --snapshot-dir/<namespace>/<name>, mode
// 0700, and the restored process holds the same weights.
func TestNodeSnapshotsAProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	snapshots, post := snapshotAgent(ctx, t, workingCRIU(ctx, t))
	p := startWeightsProcess(ctx, t)
	want := p.ask(p.pid)
	dump := post(fmt.Sprintf("/snapshots/team-a/m?pid=%d", p.pid))
	p.dumped()
	dir := filepath.Join(snapshots, "team-a", "m")
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 || dump.Dir != dir || dump.Bytes < 64<<20 {
		t.Fatalf("dump %+v into %s (%v, %v): want the images of the 64 MiB of weights there, mode 0700", dump, dir, fi.Mode(), err)
	}
	rest := post("/snapshots/team-a/m/restore")
	p.restored(rest.PID)
	if rest.PID <= 1 {
		t.Fatalf("restore %+v: no pid", rest)
	}
	if got := p.ask(rest.PID); got != want {
		t.Fatalf("restored process holds weights %s, want %s", got, want)
	}
}

// TestNodeSnapshotsASimulator snapshots a running simulator, weights and
// listening socket included, through the agent: after the restore the same
// port answers, and a level-1 sleep and wake, which hashes the weights the
// restored process holds against the digest taken at its load, verifies.
func TestNodeSnapshotsASimulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, post := snapshotAgent(ctx, t, workingCRIU(ctx, t))
	port := enginetest.FreePort(t)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(enginetest.SelfExe())
	cmd.Args = enginetest.Args(v1alpha1.EngineSimulator, port)
	cmd.Env = append(os.Environ(), enginetest.EngineEnv+"="+string(v1alpha1.EngineSimulator), enginetest.PortEnv+"="+strconv.Itoa(port),
		enginetest.HotDirEnv+"="+t.TempDir(), enginetest.LoadedEnv+"=1")
	cmd.SysProcAttr = ownSession()
	if err := cmd.Start(); err != nil { // stdio: /dev/null, nothing criu must reconnect
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	weights := func() sim.WeightsStatus {
		t.Helper()
		var st sim.WeightsStatus
		eventually(t, 10*time.Second, func() error {
			resp, err := http.Get(url + "/orchestra/weights")
			if err != nil {
				return err
			}
			defer func() { _ = resp.Body.Close() }()
			return json.NewDecoder(resp.Body).Decode(&st)
		})
		return st
	}
	before := weights()
	if before.Digest == "" || before.Bytes == 0 {
		t.Fatalf("the simulator reports %+v, want its loaded weights", before)
	}

	post(fmt.Sprintf("/snapshots/team-a/sim?pid=%d", cmd.Process.Pid))
	_ = cmd.Wait() // criu dump ends the process
	if resp, err := http.Get(url + "/health"); err == nil {
		_ = resp.Body.Close()
		t.Fatal("the simulator still answers after its dump")
	}
	rest := post("/snapshots/team-a/sim/restore")
	t.Cleanup(func() { _ = syscall.Kill(rest.PID, syscall.SIGKILL) })
	if after := weights(); after.Digest != before.Digest || after.Sleeping {
		t.Fatalf("restored simulator reports %+v, want awake with digest %s", after, before.Digest)
	}
	if code, b := postJSON(t, url+"/sleep?level=1", nil); code != http.StatusOK {
		t.Fatalf("sleep of the restored simulator: %d %s", code, b)
	}
	var wake sim.StageReport
	if code, b := postJSON(t, url+"/wake_up", &wake); code != http.StatusOK || !wake.Verified || wake.Bytes != before.Bytes {
		t.Fatalf("wake of the restored simulator: %d %s, want its %d bytes verified", code, b, before.Bytes)
	}
}
