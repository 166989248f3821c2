package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/agent"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecarapi"
	"github.com/model-orchestra/operator/internal/sim"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// fakeNvidiaSMI installs an nvidia-smi on PATH that answers the sidecar's
// query, and only it, with out (the real tool's csv,noheader,nounits
// format: "pid, MiB" per compute process), or fails with exit code and
// message when code is not 0.
func fakeNvidiaSMI(t *testing.T, out string, code int, msg string) string {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
if [ "$*" != "--query-compute-apps=pid,used_memory --format=csv,noheader,nounits" ]; then
  echo "Invalid combination of input arguments: $*" >&2; exit 2
fi
if [ %d -ne 0 ]; then echo %q >&2; exit %d; fi
cat <<'EOF'
%sEOF
`, code, msg, code, out)
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return "nvidia-smi"
}

func TestNvidiaSMIAttributesDeviceMemoryToTheEnginesProcesses(t *testing.T) {
	k := runEngine(t, v1alpha1.EngineVLLM)
	other := runEngine(t, v1alpha1.EngineVLLM)
	p, _ := sidecar.NewEngineProcess(v1alpha1.EngineVLLM, k.port, time.Second)
	var pids []int
	eventually(t, 5*time.Second, func() error {
		var err error
		pids, err = p.PIDs()
		if err == nil && len(pids) != 2 {
			err = fmt.Errorf("want the API server and its engine core, got %v", pids)
		}
		return err
	})
	server, core, otherPID := pids[0], pids[1], other.pid()

	for _, tc := range []struct {
		name    string
		out     string
		code    int
		msg     string
		want    int64
		wantErr string
		is      error
	}{
		{
			name: "the engine's processes on two GPUs, another application's beside them",
			out:  fmt.Sprintf("%d, 412\n%d, 15360\n%d, 2048\n%d, 1024\n", server, core, otherPID, core),
			want: (412 + 15360 + 1024) << 20,
		},
		{
			name: "a sleeping engine keeps its CUDA context",
			out:  fmt.Sprintf("%d, 412\n%d, 9000\n", core, otherPID),
			want: 412 << 20,
		},
		{name: "no compute process", out: "", want: 0},
		{name: "no compute process, said in words", out: "No running processes found\n", want: 0},
		{
			name:    "[N/A] for the engine's process",
			out:     fmt.Sprintf("%d, [N/A]\n%d, 2048\n", core, otherPID),
			wantErr: fmt.Sprintf("nvidia-smi reports [N/A] for the memory of process %d", core),
		},
		{
			name: "[N/A] for another process only",
			out:  fmt.Sprintf("%d, 100\n%d, [N/A]\n", core, otherPID),
			want: 100 << 20,
		},
		{
			name:    "PIDs of another namespace (the host's)",
			out:     "4194000, 15360\n4194001, 2048\n",
			is:      sidecar.ErrDevicePIDsElsewhere,
			wantErr: "4194000",
		},
		{
			name:    "no driver",
			code:    9,
			msg:     "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
			wantErr: "couldn't communicate with the NVIDIA driver",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := sidecar.NvidiaSMI{Path: fakeNvidiaSMI(t, tc.out, tc.code, tc.msg)}
			got, err := n.Bytes(context.Background(), pids)
			if tc.wantErr != "" || tc.is != nil {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || (tc.is != nil && !errors.Is(err, tc.is)) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("bytes = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSidecarStateSaysWhichMemorySourceItUsed(t *testing.T) {
	t.Run("nvidia-smi, then the engine's silence", func(t *testing.T) {
		k := runEngine(t, v1alpha1.EngineVLLM)
		var core int
		eventually(t, 5*time.Second, func() error {
			c := children(t, k.pid())
			if len(c) != 1 {
				return fmt.Errorf("engine core not started: %v", c)
			}
			core = c[0]
			return nil
		})
		smi := fakeNvidiaSMI(t, fmt.Sprintf("%d, 512\n", core), 0, "")
		e := startProcessSidecar(t, k, func(c *agent.Config) { c.Sidecar.NvidiaSMI = smi })
		e.waitState(sidecarapi.Awake)
		st := e.state()
		if st.MemorySource != sidecar.MemorySourceNvidiaSMI || st.ResidentBytes == nil || *st.ResidentBytes != 512<<20 || st.DeviceMemoryError != "" {
			t.Errorf("GET /state: source %q resident %v error %q; want nvidia-smi, 512 MiB", st.MemorySource, st.ResidentBytes, st.DeviceMemoryError)
		}
		// nvidia-smi fails: vLLM reports no memory of its own, so none is
		// reported, and the error says why.
		fakeNvidiaSMI(t, "", 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
		st = e.state()
		if st.MemorySource != "" || st.ResidentBytes != nil || !strings.Contains(st.DeviceMemoryError, "NVIDIA driver") {
			t.Errorf("GET /state with nvidia-smi failing: source %q resident %v error %q; want none, and the driver's error", st.MemorySource, st.ResidentBytes, st.DeviceMemoryError)
		}
	})
	t.Run("the engine's report when its processes are not visible", func(t *testing.T) {
		smi := fakeNvidiaSMI(t, "", 0, "")
		e := startSidecar(t, func(_ *sim.Config, c *agent.Config) { c.Sidecar.NvidiaSMI = smi })
		st := e.state()
		if st.MemorySource != sidecar.MemorySourceEngine || st.ResidentBytes == nil || *st.ResidentBytes != 2<<20 || !strings.Contains(st.DeviceMemoryError, sidecar.ErrEngineProcessNotFound.Error()) {
			t.Errorf("GET /state: source %q resident %v error %q; want the engine's 2 MiB and why nvidia-smi was not used", st.MemorySource, st.ResidentBytes, st.DeviceMemoryError)
		}
	})
}
