package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/engineproc"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// The tests below run fake engines as real processes (enginetest.RunFakeEngine)
// under a fake kubelet, which starts a fake again when it ends, as
// restartPolicy Always does for a container.

func TestMain(m *testing.M) {
	enginetest.MainIfFakeEngine()
	os.Exit(m.Run())
}

// kubelet runs one fake engine "container" and starts it again whenever it
// ends, until the test ends.
type kubelet struct {
	t    *testing.T
	kind v1alpha1.Engine
	port int
	env  []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	starts int
	// stopped: the engine is not started again when it ends.
	stopped bool
}

// runEngine starts a fake engine of kind on a free port under a kubelet
// and waits until it answers.
func runEngine(t *testing.T, kind v1alpha1.Engine, env ...string) *kubelet {
	t.Helper()
	k := &kubelet{t: t, kind: kind, port: enginetest.FreePort(t), env: env}
	k.start(true)
	go k.supervise()
	t.Cleanup(func() {
		k.stopRestarting()
		pid := k.pid()
		for _, c := range children(t, pid) {
			_ = syscall.Kill(c, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	})
	k.waitAnswers()
	return k
}

func (k *kubelet) start(first bool) {
	cmd := exec.Command(enginetest.SelfExe())
	cmd.Args = enginetest.Args(k.kind, k.port)
	cmd.Env = append(os.Environ(), enginetest.EngineEnv+"="+string(k.kind), enginetest.PortEnv+"="+strconv.Itoa(k.port))
	if k.kind == v1alpha1.EngineOllama {
		cmd.Env = append(cmd.Env, "OLLAMA_HOST=127.0.0.1:"+strconv.Itoa(k.port))
	}
	// A first start loads the model; a restarted Ollama has none loaded, and
	// llama.cpp's router loads it again (load-on-startup).
	if first || k.kind != v1alpha1.EngineOllama {
		cmd.Env = append(cmd.Env, enginetest.LoadedEnv+"=1")
	}
	if first {
		cmd.Env = append(cmd.Env, enginetest.FirstEnv+"=1")
	}
	cmd.Env = append(cmd.Env, k.env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		k.t.Error(err)
		return
	}
	k.mu.Lock()
	k.cmd = cmd
	k.starts++
	k.mu.Unlock()
}

// supervise reaps the engine and starts it again, as restartPolicy Always.
func (k *kubelet) supervise() {
	for {
		k.mu.Lock()
		cmd := k.cmd
		k.mu.Unlock()
		_ = cmd.Wait()
		k.mu.Lock()
		stopped := k.stopped
		k.mu.Unlock()
		if stopped {
			return
		}
		k.start(false)
	}
}

func (k *kubelet) stopRestarting() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
}

func (k *kubelet) pid() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cmd.Process.Pid
}

func (k *kubelet) restarts() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.starts - 1
}

func (k *kubelet) url() string { return "http://127.0.0.1:" + strconv.Itoa(k.port) }

func (k *kubelet) waitAnswers() {
	k.t.Helper()
	path := map[v1alpha1.Engine]string{v1alpha1.EngineVLLM: "/is_sleeping", v1alpha1.EngineSimulator: "/is_sleeping", v1alpha1.EngineOllama: "/api/ps", v1alpha1.EngineLlamaCPP: "/models"}[k.kind]
	eventually(k.t, 10*time.Second, func() error {
		resp, err := http.Get(k.url() + path)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		return nil
	})
}

// children are the PIDs whose parent is pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	all, err := engineproc.ProcFS{}.All()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range all {
		if p.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out
}

func alive(pid int) bool {
	p, err := engineproc.ProcFS{}.Proc(pid)
	return err == nil && p.State != 'Z'
}

func TestEngineMatchersKnowEachEnginesServingProcess(t *testing.T) {
	lines := map[string][]string{
		"vllm serve":       {"/usr/bin/python3", "/usr/local/bin/vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8080"},
		"vllm module":      {"python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"},
		"vllm engine core": {"VLLM::EngineCore"},
		"ollama serve":     {"/bin/ollama", "serve"},
		"ollama runner":    {"/usr/bin/ollama", "runner", "--model", "/models/blobs/sha256-x", "--port", "40001"},
		"ollama shell":     {"sh", "-c", "set -e\nollama serve &\n"},
		"llama-server":     {"/app/llama-server", "--port", "8081"},
		"simulator":        {"/orchestra-sim", "--addr=:8082", "--restartable"},
		"the sidecar":      {"/orchestra-agent", "--role=sidecar", "--engine=vllm", "--engine-url=http://127.0.0.1:8080"},
	}
	want := map[v1alpha1.Engine][]string{
		v1alpha1.EngineVLLM:      {"vllm module", "vllm serve"},
		v1alpha1.EngineOllama:    {"ollama serve"},
		v1alpha1.EngineLlamaCPP:  {"llama-server"},
		v1alpha1.EngineSimulator: {"simulator"},
	}
	for kind, w := range want {
		p, err := sidecar.NewEngineProcess(kind, 8080, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for name, c := range lines {
			if p.Match(c) {
				got = append(got, name)
			}
		}
		slices.Sort(got)
		if d := cmp.Diff(w, got); d != "" {
			t.Errorf("%s matches (-want +got):\n%s", kind, d)
		}
	}
	if _, err := sidecar.NewEngineProcess(v1alpha1.EngineDllama, 8080, time.Second); err == nil {
		t.Error("distributed-llama has no process matcher, want an error")
	}
}

func TestEngineProcessFindsOnlyItsApplicationsEngine(t *testing.T) {
	a := runEngine(t, v1alpha1.EngineVLLM)
	b := runEngine(t, v1alpha1.EngineVLLM)
	o := runEngine(t, v1alpha1.EngineOllama)
	l := runEngine(t, v1alpha1.EngineLlamaCPP)

	for _, k := range []*kubelet{a, b, o, l} {
		t.Run(string(k.kind), func(t *testing.T) {
			p, err := sidecar.NewEngineProcess(k.kind, k.port, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			eventually(t, 5*time.Second, func() error {
				got, err = p.PIDs()
				if err != nil {
					return err
				}
				want := append([]int{k.pid()}, children(t, k.pid())...)
				if d := cmp.Diff(want, got); d != "" {
					return fmt.Errorf("the engine's processes (-want +got):\n%s", d)
				}
				return nil
			})
			if k.kind != v1alpha1.EngineLlamaCPP && len(got) != 2 {
				t.Errorf("%s: want the server and its child (engine core, model runner), got %v", k.kind, got)
			}
		})
	}

	// Another kind's matcher on vLLM's port finds nothing, and says what
	// listens there.
	p, _ := sidecar.NewEngineProcess(v1alpha1.EngineOllama, a.port, time.Second)
	_, err := p.PIDs()
	if !errors.Is(err, sidecar.ErrEngineProcessNotFound) || !strings.Contains(err.Error(), "vllm serve") {
		t.Errorf("an ollama matcher on vLLM's port: want ErrEngineProcessNotFound naming vllm serve, got %v", err)
	}
	// A port where nothing listens: the engine is not running, and there
	// is nothing to stop.
	p, _ = sidecar.NewEngineProcess(v1alpha1.EngineVLLM, enginetest.FreePort(t), time.Second)
	if _, err := p.PIDs(); !errors.Is(err, sidecar.ErrEngineNotRunning) {
		t.Errorf("a free port: want ErrEngineNotRunning, got %v", err)
	}
	if rep, err := p.Stop(context.Background()); err != nil || len(rep.PIDs) != 0 {
		t.Errorf("stopping on a free port: %+v, %v; want nothing stopped and no error", rep, err)
	}
	// Another kind listening on the port is not stopped.
	p, _ = sidecar.NewEngineProcess(v1alpha1.EngineLlamaCPP, a.port, time.Second)
	if _, err := p.Stop(context.Background()); !errors.Is(err, sidecar.ErrEngineProcessNotFound) || errors.Is(err, sidecar.ErrEngineNotRunning) || !alive(a.pid()) {
		t.Errorf("stopping llama.cpp on vLLM's port: %v (vLLM alive: %v); want ErrEngineProcessNotFound and vLLM untouched", err, alive(a.pid()))
	}
	// The agent never takes itself for the engine: the test process
	// listens on this port, and its command line is made to match.
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	port, _ := strconv.Atoi(srv.URL[strings.LastIndexByte(srv.URL, ':')+1:])
	p, _ = sidecar.NewEngineProcess(v1alpha1.EngineVLLM, port, time.Second)
	p.Match = func([]string) bool { return true }
	if _, err := p.PIDs(); err == nil || !strings.Contains(err.Error(), "the agent itself") {
		t.Errorf("a port the agent listens on: want a refusal, got %v", err)
	}
}

func TestEngineProcessStopTermsThenKillsTheWholeTree(t *testing.T) {
	for _, tc := range []struct {
		name       string
		env        []string
		wantKilled bool
	}{
		{"ends on SIGTERM", nil, false},
		{"ignores SIGTERM", []string{enginetest.NoTermEnv + "=1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := runEngine(t, v1alpha1.EngineVLLM, tc.env...)
			bystander := runEngine(t, v1alpha1.EngineVLLM)
			bystanderPIDs := append([]int{bystander.pid()}, children(t, bystander.pid())...)
			p, err := sidecar.NewEngineProcess(v1alpha1.EngineVLLM, k.port, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			var before []int
			eventually(t, 5*time.Second, func() error {
				before, err = p.PIDs()
				if err == nil && len(before) != 2 {
					err = fmt.Errorf("want the API server and its engine core, got %v", before)
				}
				return err
			})
			rep, err := p.Stop(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(before, rep.PIDs); d != "" {
				t.Errorf("stopped processes (-want +got):\n%s", d)
			}
			if rep.Killed != tc.wantKilled {
				t.Errorf("killed = %v, want %v", rep.Killed, tc.wantKilled)
			}
			if tc.wantKilled && rep.Seconds < 0.3 {
				t.Errorf("SIGKILL came after %.3fs, before the 0.3s grace", rep.Seconds)
			}
			for _, pid := range before {
				if alive(pid) {
					t.Errorf("process %d still runs after Stop", pid)
				}
			}
			for _, pid := range bystanderPIDs {
				if !alive(pid) {
					t.Errorf("the other application's engine process %d was stopped", pid)
				}
			}
			eventually(t, 10*time.Second, func() error {
				if k.restarts() != 1 {
					return fmt.Errorf("the kubelet restarted the engine %d times, want 1", k.restarts())
				}
				return nil
			})
		})
	}
}
