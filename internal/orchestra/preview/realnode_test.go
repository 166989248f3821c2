package preview

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/ociimage"
)

// TestSleepingSimulatorOnARealNode runs what the chart renders for a
// sleeping simulator on the real-node cluster: the node agent DaemonSet and
// the root StatefulSet with its sidecar, from the images of this tree. It
// proves what only a kubelet can: the non-root seat and engine (uid 65532,
// the engine with the copies' group) and the capability-less root agent
// can use the tier directories the kubelet creates,
// the root is Ready only while the seat says Awake (so a sleeping root
// leaves the EndpointSlice), a level-1 sleep offloads the weights into the
// node's hot tier under the namespace's directory, and the node agent
// reports that tier as a tmpfs. The agent mounts the application's
// ReadWriteMany model cache read-only as its cold tier and copies the
// model file from it into the warm tier, verified.
func TestSleepingSimulatorOnARealNode(t *testing.T) {
	localcluster.SkipUnderShort(t)
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("real-node mode needs Linux and root (it runs containerd, kubelet and iptables)")
	}
	const (
		agentRef = "localhost/preview/orchestra-agent:test"
		simRef   = "localhost/preview/orchestra-sim:test"
	)
	dir := t.TempDir()
	var tarballs []string
	for bin, ref := range map[string]string{binary(t, "orchestra-agent"): agentRef, binary(t, "orchestra-sim"): simRef} {
		out := filepath.Join(dir, filepath.Base(bin)+".tar")
		if _, err := ociimage.Pack(ociimage.Options{Binary: bin, Ref: ref, Out: out}); err != nil {
			t.Fatal(err)
		}
		tarballs = append(tarballs, out)
	}
	// Tier roots of this test only; the kubelet creates them.
	hotPath, err := os.MkdirTemp("/dev/shm", "mo-preview-hot-")
	if err != nil {
		t.Fatal(err)
	}
	warmPath := filepath.Join(dir, "warm")
	_ = os.Remove(hotPath) // the kubelet creates it
	t.Cleanup(func() { _ = os.RemoveAll(hotPath) })

	values := fmt.Sprintf(`
global:
  images: {agent: %q, sim: %q}
  nats: {url: "nats://x-nats.ns.svc:4222", replicas: 1}
  agent: {enabled: true, hotPath: %q, warmPath: %q}
  applications:
    sim:
      model: {source: "https://example.com/models/tiny.gguf", format: gguf, file: tiny.gguf, cache: {size: 64Mi, accessMode: ReadWriteMany}}
      runtime: {engine: simulator, workers: 0, gpu: {count: 0}, args: ["--weights-bytes=16MiB"]}
      serving: {maxConcurrency: 4}
      scaling: {replicas: 1}
      lifecycle:
        minReplicas: 1
        maxReplicas: 1
        zeroAfter: 0s
        targetQueuePerReplica: 4
        maxWait: 5m0s
        scaler: Builtin
        sleep:
          after: 5m0s
          level: 1
          parkAfter: ""
          verifyInterval: 15m0s
          preemption: true
          tiers: {hot: RAM, warm: Disk, cold: ModelCache}
          slo: {resumeRamSeconds: 1, resumeNvmeSeconds: 5}
          coldPath: sim/tiny.gguf
agent: {hotMaxBytes: 64MiB, warmMaxBytes: 64MiB, measureBytes: 0}
gateway: {auth: {anonymous: true}}
`, agentRef, simRef, hotPath, warmPath)
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	objs := renderObjects(t, vals)

	cluster := localcluster.StartForTest(t, localcluster.Options{RealNode: true, Images: tarballs})
	ctx := context.Background()
	c := newDryRunClient(cluster)
	// The offline render leaves the caller token Secret empty (the
	// operator's render generates the token): the test stands in for it.
	const callerToken = "preview-test-caller-token"
	if sec, ok := objs["Secret/x-agent-caller"]; ok {
		_ = unstructured.SetNestedField(sec.Object, map[string]any{"token": base64.StdEncoding.EncodeToString([]byte(callerToken))}, "data")
	}
	// The parts a sleeping root needs; no queue, gateway or dispatcher.
	for _, key := range []string{"PersistentVolumeClaim/x-sim-model", "StatefulSet/x-sim", "ServiceAccount/x-agent", "Secret/x-agent-caller", "DaemonSet/x-agent"} {
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s rendered", key)
		}
		create(ctx, t, c, o)
	}

	// The model cache as orchestra-fetch leaves it: the model file in the
	// claim's volume, which the agent mounts read-only as its cold tier.
	model := make([]byte, 1<<20)
	arena.Synthesize(model, 11)
	volumeOf := func() string { // the claim's directory on the node, once bound
		pvc, err := c.cs.CoreV1().PersistentVolumeClaims(sleepNS).Get(ctx, "x-sim-model", metav1.GetOptions{})
		if err != nil || pvc.Spec.VolumeName == "" {
			return ""
		}
		pv, err := c.cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.HostPath == nil {
			return ""
		}
		return pv.Spec.HostPath.Path
	}
	var volume string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		volume = volumeOf()
		return volume != "", nil
	}); err != nil {
		t.Fatalf("waiting for the model cache's volume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(volume, "tiny.gguf"), model, 0o644); err != nil {
		t.Fatal(err)
	}

	podReady := func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status == corev1.ConditionTrue
			}
		}
		return false
	}
	pod := func(name string) *corev1.Pod {
		p, err := c.cs.CoreV1().Pods(sleepNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return p
	}
	waitFor := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("waiting for %s: %v\n%s", what, err, podReport(ctx, c, sleepNS))
		}
	}
	var root *corev1.Pod
	waitFor("the sleeping simulator's root to be Ready (its sidecar says Awake)", 3*time.Minute, func() bool {
		root = pod("x-sim-0")
		return root != nil && podReady(root)
	})
	var agentIP string
	waitFor("the node agent to be Ready", 2*time.Minute, func() bool {
		list, err := c.cs.CoreV1().Pods(sleepNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=checkpoint-agent"})
		if err != nil || len(list.Items) != 1 || !podReady(&list.Items[0]) {
			return false
		}
		agentIP = list.Items[0].Status.PodIP
		return true
	})

	seat := fmt.Sprintf("http://%s:%d", root.Status.PodIP, sidecarPort)
	call := func(method, url string) []byte {
		t.Helper()
		reqCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(reqCtx, method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The sidecar's sleep and wake take the release's caller token, as
		// the leader sends it.
		nodeapi.Authorize(req, callerToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, body)
		}
		return body
	}

	call(http.MethodPost, seat+"/sleep?level=1")
	waitFor("the sleeping root to be unready", 30*time.Second, func() bool {
		p := pod("x-sim-0")
		return p != nil && !podReady(p)
	})
	offload := filepath.Join(hotPath, sleepNS, ".x-sim.level1")
	fi, err := os.Stat(offload)
	if err != nil {
		t.Fatalf("the level-1 offload is not in the node's hot tier: %v", err)
	}
	if fi.Size() != 16<<20 || fi.Mode().Perm() != 0o640 {
		t.Errorf("offload %s: %d bytes, mode %v; want %d bytes, 0640", offload, fi.Size(), fi.Mode().Perm(), 16<<20)
	}
	// The simulator's own file, of the copies' group (the chart's default
	// global.agent.copyGroup), in the agent's setgid, sticky directory.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Uid != 65532 || st.Gid != 64000) {
		t.Errorf("offload owned by %d:%d, want 65532:64000 (the simulator, as a member of the copies' group)", st.Uid, st.Gid)
	}
	if di, err := os.Stat(filepath.Dir(offload)); err != nil || di.Mode() != os.ModeDir|os.ModeSetgid|os.ModeSticky|0o770 {
		t.Errorf("the namespace's hot directory: %v (%v); want the agent's 3770 (setgid, sticky)", di, err)
	}

	call(http.MethodPost, seat+"/wake")
	waitFor("the woken root to be Ready again", 30*time.Second, func() bool {
		p := pod("x-sim-0")
		return p != nil && podReady(p)
	})
	if _, err := os.Stat(offload); !os.IsNotExist(err) {
		t.Errorf("the level-1 offload is still there after the wake: %v", err)
	}

	var report struct {
		Hot, Warm struct {
			Dir, Filesystem string
			BudgetBytes     int64
		}
	}
	if err := json.Unmarshal(call(http.MethodGet, fmt.Sprintf("http://%s:%d/report", agentIP, agentPort)), &report); err != nil {
		t.Fatal(err)
	}
	if report.Hot.Filesystem != "tmpfs" || report.Hot.BudgetBytes != 64<<20 || report.Warm.BudgetBytes != 64<<20 {
		t.Errorf("node report %+v: want a tmpfs hot tier and 64MiB budgets", report)
	}

	// Cold → warm through the agent's mount of the model cache, verified.
	body := fmt.Sprintf(`{"namespace":%q,"name":"x-sim","to":"Warm","coldPath":"sim/tiny.gguf","digest":%q}`, sleepNS, arena.Sum(model).String())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s:%d/promote", agentIP, agentPort), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	nodeapi.Authorize(req, callerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("promoting the cold copy to the warm tier: %d %s", resp.StatusCode, out)
	}
	if got, err := os.ReadFile(filepath.Join(warmPath, sleepNS, "x-sim")); err != nil || !bytes.Equal(got, model) {
		t.Errorf("the warm copy on the node is not the model cache's file (%d bytes, %v)", len(got), err)
	}
}

// create creates one rendered object for real (namespace first).
func create(ctx context.Context, t *testing.T, c dryRunClient, o *unstructured.Unstructured) {
	t.Helper()
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.GetNamespace()}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.dyn.Resource(m.Resource).Namespace(o.GetNamespace()).Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s %s: %v", gvk.Kind, o.GetName(), err)
	}
}

// podReport lists the namespace's pods with their container states and
// recent events, for a failed wait.
func podReport(ctx context.Context, c dryRunClient, ns string) string {
	out := ""
	pods, _ := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		out += fmt.Sprintf("pod %s: %s\n", p.Name, p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			out += fmt.Sprintf("  %s ready=%v state=%+v\n", s.Name, s.Ready, s.State)
			if logs, err := c.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name, TailLines: new(int64(20))}).DoRaw(ctx); err == nil {
				out += string(logs) + "\n"
			}
		}
	}
	events, _ := c.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	for _, e := range events.Items {
		out += fmt.Sprintf("event %s %s: %s\n", e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return out
}
