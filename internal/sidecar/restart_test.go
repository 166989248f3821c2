package sidecar_test

import (
	"github.com/model-orchestra/operator/api/v1alpha1"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// startProcessSidecar serves a sidecar for k's engine with --restart-process.
func startProcessSidecar(t *testing.T, k *kubelet, mut func(*agent.Config)) *sidecarEnv {
	t.Helper()
	ac := agent.Default()
	ac.Sidecar.PollInterval, ac.Sidecar.DrainTimeout = 10*time.Millisecond, 5*time.Second
	ac.Sidecar.WakeTimeout, ac.Sidecar.RestartGrace = 20*time.Second, time.Second
	ac.Sidecar.Engine = sidecar.EngineConfig{Kind: k.kind, URL: k.url(), Model: enginetest.Model}
	ac.Sidecar.RestartProcess = true
	if mut != nil {
		mut(&ac)
	}
	return &sidecarEnv{t: t, agent: serveAgent(t, ac)}
}

func TestSidecarRestartsEachEngineThroughItsProcesses(t *testing.T) {
	for _, kind := range []v1alpha1.Engine{v1alpha1.EngineVLLM, v1alpha1.EngineOllama, v1alpha1.EngineLlamaCPP} {
		t.Run(string(kind), func(t *testing.T) {
			k := runEngine(t, kind)
			other := runEngine(t, kind)
			otherPID := other.pid()
			e := startProcessSidecar(t, k, nil)
			e.waitState(sidecarapi.Awake)

			// An awake engine is not restarted: its requests would be cut.
			if code, body := e.do("POST", "/restart"); code != http.StatusConflict {
				t.Fatalf("restart while Awake: %d %s, want 409", code, body)
			}
			if code, body := e.do("POST", "/sleep?level=1"); code != http.StatusOK {
				t.Fatalf("sleep: %d %s", code, body)
			}
			oldPID := k.pid()

			// Watch the states GET /state shows while the restart runs.
			var seen []sidecarapi.State
			stop := make(chan struct{})
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				for {
					select {
					case <-stop:
						return
					default:
					}
					st := e.state().State
					if len(seen) == 0 || seen[len(seen)-1] != st {
						seen = append(seen, st)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
			code, body := e.do("POST", "/restart")
			close(stop)
			<-watched
			if code != http.StatusOK {
				t.Fatalf("restart: %d %s", code, body)
			}
			if !slices.Contains(seen, sidecarapi.Restarting) {
				t.Errorf("GET /state during the restart showed %v, never Restarting", seen)
			}
			st := e.state()
			if st.State != sidecarapi.Asleep || st.Level != 2 || st.Restarts != 1 {
				t.Errorf("after the restart: state %s level %d restarts %d, want Asleep at level 2, 1 restart", st.State, st.Level, st.Restarts)
			}
			if st.LastRestart == nil || st.LastRestart.Via != sidecarapi.RestartViaProcess || st.LastRestart.Stopped == nil || st.LastRestart.Stopped.PIDs[0] != oldPID {
				t.Errorf("lastRestart = %+v, want via process, stopping %d first", st.LastRestart, oldPID)
			}
			if k.restarts() != 1 || k.pid() == oldPID || alive(oldPID) {
				t.Errorf("the engine container: %d restarts, pid %d (was %d, alive %v); want one restart and a new process", k.restarts(), k.pid(), oldPID, alive(oldPID))
			}
			if other.restarts() != 0 || !alive(otherPID) {
				t.Errorf("the other application's engine was touched: %d restarts, alive %v", other.restarts(), alive(otherPID))
			}
			// The restarted engine sleeps, and the next wake serves.
			if code, body := e.do("POST", "/wake"); code != http.StatusOK {
				t.Fatalf("wake after the restart: %d %s", code, body)
			}
			if st := e.state(); st.State != sidecarapi.Awake {
				t.Errorf("after the wake: %s, want Awake", st.State)
			}
		})
	}
}

func TestSidecarRestartNeedsAWay(t *testing.T) {
	k := runEngine(t, v1alpha1.EngineVLLM)
	e := startProcessSidecar(t, k, func(c *agent.Config) { c.Sidecar.RestartProcess = false })
	e.waitState(sidecarapi.Awake)
	if code, body := e.do("POST", "/sleep?level=1"); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	code, body := e.do("POST", "/restart")
	if code != http.StatusNotImplemented || !strings.Contains(body, "--restart-process") {
		t.Errorf("restart of vLLM without --restart-process: %d %s, want 501 naming the flag", code, body)
	}
	if st := e.state(); st.State != sidecarapi.Asleep || k.restarts() != 0 {
		t.Errorf("after the refused restart: state %s, %d engine restarts; want Asleep, none", st.State, k.restarts())
	}
}

func TestSidecarRestartFailsWhenTheEngineDoesNotComeBack(t *testing.T) {
	k := runEngine(t, v1alpha1.EngineVLLM)
	e := startProcessSidecar(t, k, func(c *agent.Config) { c.Sidecar.WakeTimeout = 500 * time.Millisecond })
	e.waitState(sidecarapi.Awake)
	if code, body := e.do("POST", "/sleep?level=1"); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	k.stopRestarting()
	code, body := e.do("POST", "/restart")
	if code != http.StatusInternalServerError || !strings.Contains(body, "waiting for the restarted engine to answer") {
		t.Errorf("restart of an engine that does not come back: %d %s, want 500 saying so", code, body)
	}
	if st := e.state(); st.State != sidecarapi.Failed {
		t.Errorf("state %s, want Failed", st.State)
	}
}

// TestSidecarRestartsALeakingSimulatorWithoutRestartableByItsProcess: a
// simulator run without --restartable, whose sleep kept its memory, answers
// its in-place restart with a 404; a sidecar with --restart-process then
// restarts it by its process. The restarted simulator loads its weights
// awake, the sidecar puts it to sleep at level 2, and its memory reads freed.
func TestSidecarRestartsALeakingSimulatorWithoutRestartableByItsProcess(t *testing.T) {
	k := runEngine(t, v1alpha1.EngineSimulator, enginetest.HotDirEnv+"="+t.TempDir())
	e := startProcessSidecar(t, k, nil)
	e.waitState(sidecarapi.Awake)
	if code, body := e.do("POST", "/sleep?level=1"); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	st := e.state()
	if st.MemorySource != sidecar.MemorySourceEngine || st.ResidentBytes == nil || *st.ResidentBytes != 1<<20 {
		t.Fatalf("after a leaking sleep: source %q resident %v, want the engine's report of 1 MiB held", st.MemorySource, st.ResidentBytes)
	}
	oldPID := k.pid()
	if code, body := e.do("POST", "/restart"); code != http.StatusOK {
		t.Fatalf("restart: %d %s", code, body)
	}
	st = e.state()
	if st.State != sidecarapi.Asleep || st.Level != 2 || st.LastRestart == nil || st.LastRestart.Via != sidecarapi.RestartViaProcess {
		t.Errorf("after the restart: state %s level %d lastRestart %+v; want Asleep at level 2, via process", st.State, st.Level, st.LastRestart)
	}
	if st.ResidentBytes == nil || *st.ResidentBytes != 0 {
		t.Errorf("after the restart: resident %v, want 0 (the memory freed)", st.ResidentBytes)
	}
	if k.restarts() != 1 || k.pid() == oldPID || alive(oldPID) {
		t.Errorf("the simulator container: %d restarts, pid %d (was %d); want one restart and a new process", k.restarts(), k.pid(), oldPID)
	}
	if code, body := e.do("POST", "/wake"); code != http.StatusOK {
		t.Fatalf("wake after the restart: %d %s", code, body)
	}
	if st := e.state(); st.State != sidecarapi.Awake || st.ResidentBytes == nil || *st.ResidentBytes != 1<<20 {
		t.Errorf("after the wake: state %s resident %d, want Awake holding its 1 MiB", st.State, *st.ResidentBytes)
	}
}
