package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// TestNoEngineRunsAsRoot runs, on real pods, the engines that ran as root
// or with root's group before: a sleeping simulator (it writes its level-1
// offload into the node agent's hot directory), a seat group of sleeping
// simulators with their seats, and Ollama without model copies (containerd
// gave it group 0, containerd issue 11607). It reads every process of
// every pod of the release from /proc on the node: none but the node
// agent's runs as uid 0, with gid 0 or with group 0 among its groups, and
// the engines run as 65532 with the group the chart names. The sleeping
// simulator then sleeps at level 1: its offload lands in the namespace's
// hot directory as its own (uid 65532) file of the copies' group, mode
// 0640, in a directory of the agent's (setgid, sticky, 3770), and a chat
// wakes it from there.
func TestNoEngineRunsAsRoot(t *testing.T) {
	requireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-privileges")
	const name = "least"
	group := copyGroup(t)
	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}

	// Ollama without lifecycle (no copies), from TestOllama's resource.
	obj := ollamaResource(t, ns, name)
	ollama, _, _ := unstructured.NestedMap(obj.Object, "spec", "applications", ollamaChat)
	delete(ollama["serving"].(map[string]any), "warmupPrompts")
	// The simulators, on the simulator sample's mirrored model.
	simModel, _, _ := unstructured.NestedMap(simulatorResource(t, ns, name).Object, "spec", "applications", app, "model")
	sim := func(lifecycle map[string]any) map[string]any {
		return map[string]any{
			"model": simModel,
			"runtime": map[string]any{
				"engine": "simulator",
				"args":   []any{"--weights-bytes=16Mi", "--ttft=20ms", "--itl=5ms"},
				"resources": map[string]any{
					"requests": map[string]any{"cpu": "50m", "memory": "64Mi"},
					"limits":   map[string]any{"memory": "192Mi"},
				},
			},
			"serving":   map[string]any{"servedModelName": "", "maxConcurrency": int64(4)},
			"lifecycle": lifecycle,
		}
	}
	apps := map[string]any{
		"ollama": ollama,
		"sleepy": sim(map[string]any{"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "4s", "maxWait": "2m"}),
		"alpha":  sim(map[string]any{"seat": map[string]any{"group": "accel", "priority": int64(10), "minResidency": "5s"}}),
		"beta":   sim(map[string]any{"seat": map[string]any{"group": "accel", "minResidency": "5s"}}),
	}
	for a, spec := range apps {
		spec.(map[string]any)["serving"].(map[string]any)["servedModelName"] = a + "-model"
	}
	must(t, unstructured.SetNestedMap(obj.Object, apps, "spec", "applications"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"accel": map[string]any{"activeSeats": int64(1), "deviceMemory": "16Mi"}}, "spec", "seatGroups"))
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}

	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{} // "<component>/<process>"
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		component := p.Labels["app.kubernetes.io/component"]
		for _, pr := range podProcesses(t, string(p.UID)) {
			t.Logf("%s (%s) process %d %s: uid %d, gid %d, groups %v", p.Name, component, pr.pid, pr.name, pr.uid, pr.gid, pr.groups)
			seen[component+"/"+pr.name] = true
			if component == "checkpoint-agent" {
				continue // root without any capability (docs/checkpoint.md, "Permissions")
			}
			if pr.uid == 0 || pr.gid == 0 || slices.Contains(pr.groups, 0) {
				t.Errorf("%s: process %d (%s) runs as uid %d, gid %d, groups %v; want no root user or group", p.Name, pr.pid, pr.name, pr.uid, pr.gid, pr.groups)
			}
			want := map[string]int64{"ollama": 65532, "orchestra-sim": 65532, "orchestra-agent": 65532}
			if wantGID, ok := want[pr.name]; ok {
				if pr.name == "orchestra-sim" {
					wantGID = group // a sleeping simulator writes its offload into the hot directory
				}
				if pr.uid != 65532 || pr.gid != wantGID {
					t.Errorf("%s: process %d (%s) runs as %d:%d; want 65532:%d", p.Name, pr.pid, pr.name, pr.uid, pr.gid, wantGID)
				}
			}
		}
	}
	for _, want := range []string{"root/ollama", "root/orchestra-sim", "root/orchestra-agent", "seat-group/orchestra-sim", "seat-group/orchestra-agent"} {
		if !seen[want] {
			t.Errorf("no process %s found on the node (seen %v)", want, seen)
		}
	}
	if t.Failed() {
		return
	}

	// The sleeping simulator sleeps into the hot directory as non-root.
	root := appRoot(ctx, t, ns, name, "sleepy")
	eventually(t, time.Minute, func() error {
		st, err := sidecarState(ctx, ns, root.Name)
		if err == nil && (st.State != sidecarapi.Asleep || st.Level != 1) {
			err = fmt.Errorf("seat %s at level %d; want Asleep at level 1", st.State, st.Level)
		}
		return err
	})
	hotDir := filepath.Join(tierDirs(t)[0], ns)
	offloads, _ := filepath.Glob(filepath.Join(hotDir, ".*.level1"))
	if len(offloads) != 1 {
		t.Fatalf("level-1 offloads in %s: %v; want the sleeping simulator's one", hotDir, offloads)
	}
	for path, want := range map[string]struct {
		mode os.FileMode
		uid  uint32
	}{
		hotDir:      {os.ModeDir | os.ModeSetgid | os.ModeSticky | 0o770, 0},
		offloads[0]: {0o640, 65532},
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want.mode || st.Uid != want.uid || int64(st.Gid) != group {
			t.Errorf("%s on the node: mode %v, owner %d:%d; want %v, %d:%d", path, fi.Mode(), st.Uid, st.Gid, want.mode, want.uid, group)
		}
	}
	res := chat(ctx, t, base, token, "sleepy-model")
	if res.Content == "" {
		t.Errorf("the chat that woke the sleeping simulator answered nothing: %+v", res)
	}
	st, err := sidecarState(ctx, ns, root.Name)
	must(t, err)
	if st.State != sidecarapi.Awake || st.LastWake == nil || st.LastWake.Transfer == nil || st.LastWake.Transfer.Tier != v1alpha1.TierHot || !st.LastWake.Transfer.Verified {
		t.Errorf("after the chat: seat %s, last wake %+v; want Awake, woken from the hot tier, verified", st.State, st.LastWake)
	} else {
		t.Logf("woken from the hot tier: %d bytes, verified, in %.3f s", st.LastWake.Transfer.Bytes, st.LastWake.Seconds)
	}
}
