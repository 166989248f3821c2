package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"golang.org/x/sys/unix"
)

var versionRE = regexp.MustCompile(`v?(\d+)\.(\d+)(?:\.(\d+))?`)

// CRICheckpointSupport says whether a container runtime implements the CRI
// CheckpointContainer call the kubelet checkpoint API needs. runtime is the
// node's status.nodeInfo.containerRuntimeVersion (containerd://1.6.20) or
// the output of `containerd --version`.
func CRICheckpointSupport(runtime string) (bool, string) {
	r := strings.TrimSpace(runtime)
	if r == "" {
		return false, "container runtime version unknown: the agent reads it from its node (NODE_NAME and a ServiceAccount that may get nodes, as the agent chart renders them), or set --runtime-version (the agent chart's runtimeVersion) to the node's status.nodeInfo.containerRuntimeVersion; the kubelet checkpoint API needs containerd 2.0 or CRI-O 1.25"
	}
	m := versionRE.FindStringSubmatch(r)
	if m == nil {
		return false, fmt.Sprintf("cannot read a version in %q", r)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	ver := strings.TrimPrefix(m[0], "v")
	switch {
	case strings.Contains(r, "containerd"):
		if major < 2 {
			return false, fmt.Sprintf("containerd %s does not implement CRI CheckpointContainer (containerd 2.0 does): the kubelet checkpoint API answers 500 \"method CheckpointContainer not implemented\"", ver)
		}
		return true, fmt.Sprintf("containerd %s implements CRI CheckpointContainer (checkpoint archives only; restore through CreateContainer is deprecated and not used)", ver)
	case strings.Contains(r, "cri-o"):
		if major == 1 && minor < 25 {
			return false, fmt.Sprintf("CRI-O %s predates checkpoint support (1.25)", ver)
		}
		return true, fmt.Sprintf("CRI-O %s implements CRI CheckpointContainer when enable_criu_support is set", ver)
	default:
		return false, fmt.Sprintf("runtime %q is not known to implement CRI CheckpointContainer", r)
	}
}

// ProbeRuntime finds the runtime version: the configured one (an
// override), else the node's status.nodeInfo.containerRuntimeVersion read
// through nodes (when node names the agent's node and nodes is not nil),
// else `containerd --version`. When none answers, the reason says why the
// node could not be read.
func ProbeRuntime(ctx context.Context, configured, node string, nodes NodeRuntimeReader, nodesErr error) nodeapi.RuntimeReport {
	r := nodeapi.RuntimeReport{Version: configured, Source: "--runtime-version"}
	var readErr error
	if r.Version == "" && node != "" {
		readErr = nodesErr
		if nodes != nil {
			r.Version, readErr = nodes.ContainerRuntimeVersion(ctx, node)
			r.Source = "node " + node
		}
	}
	if r.Version == "" {
		r.Source = ""
		if out, err := run(ctx, "containerd", "--version"); err == nil {
			r.Version, r.Source = strings.TrimSpace(out), "containerd --version"
		}
	}
	r.CheckpointSupported, r.Reason = CRICheckpointSupport(r.Version)
	if r.Version == "" && readErr != nil {
		r.Reason += " (" + readErr.Error() + ")"
	}
	return r
}

// ProbeCRIU runs `criu --version` and `criu check`. criu check needs root
// (or CAP_CHECKPOINT_RESTORE and CAP_SYS_ADMIN); without them it fails and
// the report says so.
func ProbeCRIU(ctx context.Context, bin string) nodeapi.CRIUReport {
	if bin == "" {
		return nodeapi.CRIUReport{Reason: "no criu binary configured (--criu): the agent image holds none, so process snapshots stay off"}
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nodeapi.CRIUReport{Reason: fmt.Sprintf("criu not found (%v): process snapshots need the criu package on the node", err)}
	}
	r := nodeapi.CRIUReport{Present: true}
	if out, err := run(ctx, path, "--version"); err == nil {
		if m := versionRE.FindString(out); m != "" {
			r.Version = m
		}
	}
	out, err := run(ctx, path, "check")
	r.Output = tail(out, 2000)
	if err != nil {
		r.Reason = criuCheckReason(out, err)
		return r
	}
	r.CheckPassed = true
	return r
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// tierReport stats a tier directory.
func tierReport(dir string, t v1alpha1.Tier, budget, used int64, entries int) nodeapi.TierReport {
	r := nodeapi.TierReport{Dir: dir, BudgetBytes: budget, UsedBytes: used, Entries: entries}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		r.Warning = err.Error()
		return r
	}
	r.SizeBytes = int64(st.Blocks) * int64(st.Bsize) //nolint:unconvert // Bsize is int32 on 386
	r.FreeBytes = int64(st.Bavail) * int64(st.Bsize) //nolint:unconvert // Bsize is int32 on 386
	if st.Type == unix.TMPFS_MAGIC {
		r.Filesystem = "tmpfs"
		r.HugePages = HugePagesOf(dir)
	} else {
		r.Filesystem = fmt.Sprintf("0x%x", st.Type)
	}
	switch {
	case t == v1alpha1.TierHot && r.Filesystem != "tmpfs":
		r.Warning = "the hot tier is not on a tmpfs: restores read from disk or page cache, not RAM"
	case t == v1alpha1.TierWarm && r.Filesystem == "tmpfs":
		r.Warning = "the warm tier is on a tmpfs: it costs RAM and does not survive a reboot"
	case t == v1alpha1.TierHot && r.HugePages == "never":
		r.Warning = "the hot tier's tmpfs has 4 KiB pages: restores walk 512 times more pages than with huge=within_size (--mount-hot-tier, or mount it so on the node)"
	case budget > r.SizeBytes:
		r.Warning = fmt.Sprintf("the budget (%d bytes) exceeds the filesystem (%d bytes)", budget, r.SizeBytes)
	}
	return r
}

func transparentHugePages(file string) string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/" + file)
	if err != nil {
		return ""
	}
	s := string(b)
	if i, j := strings.Index(s, "["), strings.Index(s, "]"); i >= 0 && j > i {
		return s[i+1 : j]
	}
	return strings.TrimSpace(s)
}
