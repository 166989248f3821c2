package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// copyGroup is the chart's global.agent.copyGroup: the group of the node
// agent's copies, which the engines that load them have.
func copyGroup(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("../../charts/model-orchestra/values.yaml")
	if err != nil {
		t.Fatalf("reading the chart's values: %v", err)
	}
	var v struct {
		Global struct {
			Agent struct {
				CopyGroup int64 `json:"copyGroup"`
			} `json:"agent"`
		} `json:"global"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil || v.Global.Agent.CopyGroup <= 0 {
		t.Fatalf("the chart's global.agent.copyGroup: %+v, %v", v.Global.Agent, err)
	}
	return v.Global.Agent.CopyGroup
}

// proc is a process of a pod on the real node, as its /proc says.
type proc struct {
	pid    int
	name   string
	uid    int
	gid    int64
	groups []int64
}

// podProcesses lists the processes of the pod with uid on this machine
// (the real node): those whose cgroup path names the pod.
func podProcesses(t *testing.T, podUID string) []proc {
	t.Helper()
	ids := []string{"pod" + podUID, "pod" + strings.ReplaceAll(podUID, "-", "_")}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), ids[0]) && !strings.Contains(string(cg), ids[1]) {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // ended meanwhile
		}
		p := proc{pid: pid, uid: -1, gid: -1}
		for _, line := range strings.Split(string(status), "\n") {
			key, val, _ := strings.Cut(line, ":")
			fields := strings.Fields(val)
			switch key {
			case "Name":
				p.name = strings.TrimSpace(val)
			case "Uid":
				if len(fields) > 1 {
					p.uid, _ = strconv.Atoi(fields[1]) // effective
				}
			case "Gid":
				if len(fields) > 1 {
					p.gid, _ = strconv.ParseInt(fields[1], 10, 64) // effective
				}
			case "Groups":
				for _, f := range fields {
					g, _ := strconv.ParseInt(f, 10, 64)
					p.groups = append(p.groups, g)
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// wantCopyReadersNonRoot checks that a root pod loading the node agent's
// copies runs its engine and sidecar as non-root: the pod spec (the copies'
// group as the pod's supplementary group, the sidecar as 65532, every
// capability dropped) and the processes themselves on the node (Ollama and
// the sidecar as uid 65532 with the group and without root's group, no
// process of the pod as root);
// and that the copies on the node are the agent's, readable by the group
// only (copy 0640, of the group; the hot directory 3770: group-writable
// for a sleeping simulator's offload, sticky so that no member removes the
// agent's copies).
func wantCopyReadersNonRoot(t *testing.T, root *corev1.Pod, hotCopy string) {
	t.Helper()
	group := copyGroup(t)
	if sc := root.Spec.SecurityContext; sc == nil || !slices.Contains(sc.SupplementalGroups, group) {
		t.Errorf("root pod security context %+v; want the copies' group %d as a supplementary group", sc, group)
	}
	for _, c := range root.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || (sc.RunAsUser != nil && *sc.RunAsUser == 0) {
			t.Errorf("container %s security context %+v; want no capability and no root user", c.Name, sc)
		}
		if c.Name == "sidecar" && (sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532) {
			t.Errorf("the sidecar's security context %+v; want our image's user 65532", sc)
		}
	}
	procs := podProcesses(t, string(root.UID))
	seen := map[string]bool{}
	for _, p := range procs {
		t.Logf("root pod process %d %s: uid %d, gid %d, groups %v", p.pid, p.name, p.uid, p.gid, p.groups)
		if p.uid == 0 {
			t.Errorf("process %d (%s) of the root pod runs as root", p.pid, p.name)
		}
		if p.name == "ollama" || p.name == "orchestra-agent" {
			seen[p.name] = true
			if p.uid != 65532 || p.gid == 0 || slices.Contains(p.groups, 0) || !slices.Contains(p.groups, group) {
				t.Errorf("process %d (%s): uid %d, gid %d, groups %v; want uid 65532 with the copies' group %d and not root's group", p.pid, p.name, p.uid, p.gid, p.groups, group)
			}
		}
	}
	if !seen["ollama"] || !seen["orchestra-agent"] {
		t.Errorf("found the processes %+v of the root pod on the node; want Ollama's and the sidecar's", procs)
	}
	for path, mode := range map[string]os.FileMode{filepath.Dir(hotCopy): os.ModeDir | os.ModeSetgid | os.ModeSticky | 0o770, hotCopy: 0o640} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("on the node: %v", err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != mode || int64(st.Gid) != group || st.Uid != 0 {
			t.Errorf("%s on the node: mode %v, owner %d:%d; want %v, the agent's (0) and the copies' group %d", path, fi.Mode(), st.Uid, st.Gid, mode, group)
		}
	}
}
