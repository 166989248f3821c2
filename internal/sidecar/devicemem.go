package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/model-orchestra/operator/internal/engineproc"
)

// Memory sources reported in GET /state (sidecarapi.Status.MemorySource).
const (
	// MemorySourceNvidiaSMI: residentBytes is the device memory nvidia-smi
	// attributes to the engine container's processes.
	MemorySourceNvidiaSMI = "nvidia-smi"
	// MemorySourceEngine: residentBytes is the engine's own report (the
	// simulator's GET /orchestra/weights).
	MemorySourceEngine = "engine"
)

// nvidiaSMIQuery lists the device memory of every compute process, one
// "pid, MiB" line each, with no header and no unit.
var nvidiaSMIQuery = []string{"--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"}

// ErrDevicePIDsElsewhere is returned when nvidia-smi lists processes of
// which none is visible in this PID namespace: it then reports another
// namespace's PIDs (the host's), and no usage can be attributed; reading 0
// would claim the engine freed memory it may hold.
var ErrDevicePIDsElsewhere = errors.New("nvidia-smi lists compute processes whose PIDs are not in this PID namespace")

// NvidiaSMI reads the device memory of processes with nvidia-smi (no cgo,
// no NVML binding: the binary the NVIDIA container toolkit or DRA driver
// puts in the container).
type NvidiaSMI struct {
	// Path is the nvidia-smi binary, looked up in PATH without a slash.
	Path string
	// Proc tells which PIDs exist in this namespace.
	Proc engineproc.ProcFS
}

// Usage runs the query and returns each listed process's device memory in
// bytes. A process whose memory reads "[N/A]" (or any other bracketed
// reason) is an error naming it, unless it is not one of want.
func (n NvidiaSMI) Usage(ctx context.Context, want map[int]bool) (map[int]int64, error) {
	out, err := exec.CommandContext(ctx, n.Path, nvidiaSMIQuery...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("running %s %s: %w", n.Path, strings.Join(nvidiaSMIQuery, " "), err)
	}
	return parseComputeApps(out, want)
}

func parseComputeApps(out []byte, want map[int]bool) (map[int]int64, error) {
	usage := map[int]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "No running processes") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 2 {
			return nil, fmt.Errorf("nvidia-smi line %q: want \"pid, used_memory\"", line)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(f[0]))
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi line %q: pid: %w", line, err)
		}
		mem := strings.TrimSpace(f[1])
		mib, err := strconv.ParseInt(mem, 10, 64)
		if err != nil {
			if want[pid] {
				return nil, fmt.Errorf("nvidia-smi reports %s for the memory of process %d", mem, pid)
			}
			mib = 0
		}
		usage[pid] += mib << 20
	}
	return usage, sc.Err()
}

// Bytes is the device memory of the processes pids, summed over every GPU
// nvidia-smi lists them on.
func (n NvidiaSMI) Bytes(ctx context.Context, pids []int) (int64, error) {
	want := make(map[int]bool, len(pids))
	for _, p := range pids {
		want[p] = true
	}
	usage, err := n.Usage(ctx, want)
	if err != nil {
		return 0, err
	}
	var sum int64
	visible := 0
	for pid, b := range usage {
		if want[pid] {
			sum += b
		}
		if _, err := n.Proc.Proc(pid); err == nil {
			visible++
		}
	}
	if len(usage) > 0 && visible == 0 {
		listed := make([]string, 0, len(usage))
		for pid := range usage {
			listed = append(listed, strconv.Itoa(pid))
		}
		return 0, fmt.Errorf("%w (%s)", ErrDevicePIDsElsewhere, strings.Join(listed, ", "))
	}
	return sum, nil
}
