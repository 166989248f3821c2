package preview

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/ociimage"
)

// TestAWokenRootLandsWhereItsWeightsAre (issue 27 §3) runs the rendered
// root StatefulSet of a parked (scaled to zero) sleeping simulator on a
// cluster of one real node and two kwok nodes, with the real scheduler.
// The node labels are written as the lifecycle leader writes them
// (lifecycle.PlanNodeLabels and PatchNodeLabels, a JSON merge patch of the
// real API server). A wake from zero (0 -> 1 replicas) lands on the kwok
// node labelled warm when no other node has a copy; with the label moved
// (the warm kwok copy gone, a hot copy on the real node) the next wake
// lands on the real node and its real containers start and turn Ready;
// with a hot copy on the real node and a warm one on a kwok node, hot
// wins.
func TestAWokenRootLandsWhereItsWeightsAre(t *testing.T) {
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
	hotPath, err := os.MkdirTemp("/dev/shm", "mo-preview-hot-")
	if err != nil {
		t.Fatal(err)
	}
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
      runtime: {engine: simulator, workers: 0, gpu: {count: 0}, args: ["--weights-bytes=4MiB"], resources: {requests: {cpu: 10m, memory: 32Mi}}}
      serving: {maxConcurrency: 4}
      scaling: {replicas: 1}
      lifecycle:
        minReplicas: 0
        maxReplicas: 1
        zeroAfter: 1h
        targetQueuePerReplica: 4
        maxWait: 5m0s
        scaler: Builtin
        sleep:
          after: 5m0s
          level: 1
          parkAfter: 10m0s
          verifyInterval: 15m0s
          preemption: true
          tiers: {hot: RAM, warm: Disk, cold: ModelCache}
          slo: {resumeRamSeconds: 1, resumeNvmeSeconds: 5}
agent: {hotMaxBytes: 64MiB, warmMaxBytes: 64MiB, measureBytes: 0}
gateway: {auth: {anonymous: true}}
`, agentRef, simRef, hotPath, filepath.Join(dir, "warm"))
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	objs := renderObjects(t, vals)
	key := dispatcherNodeLabels(t, objs)["sim"]
	if key == "" {
		t.Fatal("the dispatcher's configuration names no node label for sim")
	}

	cluster := localcluster.StartForTest(t, localcluster.Options{RealNode: true, Images: tarballs,
		KwokNodes: []localcluster.KwokNode{{Name: "kwok-a"}, {Name: "kwok-b"}}})
	ctx := context.Background()
	c := newDryRunClient(cluster)
	realNode := localcluster.DefaultNodeName

	sts := objs["StatefulSet/x-sim"]
	if sts == nil {
		t.Fatal("no StatefulSet x-sim rendered")
	}
	// Parked: the lifecycle left it at zero replicas (the chart renders
	// none, so that the API server's default of 1 would start it).
	sts.Object["spec"].(map[string]any)["replicas"] = int64(0)
	// A parked application's model cache exists, bound, and reachable from
	// every node (ReadWriteMany: NFS, a CSI file system): here a volume on
	// this machine's disk without the node affinity the local provisioner
	// gives its volumes (they pin a pod to the real node), bound to the
	// claim before the claim exists. The kwok nodes never mount it.
	hostPath := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "x-sim-model-everywhere"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName:              "", // no class: no provisioner races the binding
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: sleepNS, Name: "x-sim-model"},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(dir, "model-cache"), Type: &hostPath}},
		}}
	if _, err := c.cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := objs["PersistentVolumeClaim/x-sim-model"]
	_ = unstructured.SetNestedField(pvc.Object, "", "spec", "storageClassName")
	create(ctx, t, c, pvc)
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		pvc, err := c.cs.CoreV1().PersistentVolumeClaims(sleepNS).Get(ctx, "x-sim-model", metav1.GetOptions{})
		return err == nil && pvc.Status.Phase == corev1.ClaimBound && pvc.Spec.VolumeName == pv.Name, nil
	}); err != nil {
		t.Fatalf("binding the model cache to a volume every node reaches: %v", err)
	}
	// The seat mounts the release's caller token Secret (the offline
	// render's, without a token: nothing here calls the seat).
	create(ctx, t, c, objs["Secret/x-agent-caller"])
	create(ctx, t, c, sts)

	// label moves the weights labels as the leader does: the plan from
	// what the node agents report, applied with merge patches.
	written := map[string]map[string]string{}
	label := func(copies map[string]v1alpha1.Tier) {
		t.Helper()
		var nodes []lifecycle.NodeCopies
		for _, n := range []string{realNode, "kwok-a", "kwok-b"} {
			nc := lifecycle.NodeCopies{Node: n, OK: true, Copies: map[string]v1alpha1.Tier{}}
			if tier, ok := copies[n]; ok {
				nc.Copies["x-sim"] = tier
			}
			nodes = append(nodes, nc)
		}
		for _, p := range lifecycle.PlanNodeLabels(nodes, map[string]string{"x-sim": key}, written) {
			if err := lifecycle.PatchNodeLabels(ctx, c.cs, p); err != nil {
				t.Fatalf("patching node %s: %v", p.Node, err)
			}
			if written[p.Node] == nil {
				written[p.Node] = map[string]string{}
			}
			for k, v := range p.Labels {
				written[p.Node][k] = ""
				if v != nil {
					written[p.Node][k] = *v
				}
			}
		}
		for _, n := range []string{realNode, "kwok-a", "kwok-b"} {
			node, err := c.cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			switch copies[n] {
			case v1alpha1.TierHot:
				want = v1alpha1.WeightsOnNodeHot
			case v1alpha1.TierWarm:
				want = v1alpha1.WeightsOnNodeWarm
			}
			if got := node.Labels[key]; got != want {
				t.Fatalf("node %s has %s=%q, want %q", n, key, got, want)
			}
			if node.Labels["kubernetes.io/hostname"] != n {
				t.Fatalf("node %s lost its other labels: %v", n, node.Labels)
			}
		}
	}
	scale := func(n int) {
		t.Helper()
		if _, err := c.cs.AppsV1().StatefulSets(sleepNS).Patch(ctx, "x-sim", types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, timeout time.Duration, cond func() (bool, error)) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond() }); err != nil {
			t.Fatalf("waiting for %s: %v\n%s", what, err, podReport(ctx, c, sleepNS))
		}
	}
	ready := func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status == corev1.ConditionTrue
			}
		}
		return false
	}
	// wake scales 0 -> 1 and returns the node the root lands on, once it
	// is Ready; then parks it again (1 -> 0, the pod gone).
	wake := func() string {
		t.Helper()
		scale(1)
		var node string
		waitFor("the woken root to be scheduled and Ready", 3*time.Minute, func() (bool, error) {
			p, err := c.cs.CoreV1().Pods(sleepNS).Get(ctx, "x-sim-0", metav1.GetOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // not created yet: keep waiting
			}
			node = p.Spec.NodeName
			return node != "" && ready(p), nil
		})
		scale(0)
		waitFor("the parked root to be gone", 2*time.Minute, func() (bool, error) {
			_, err := c.cs.CoreV1().Pods(sleepNS).Get(ctx, "x-sim-0", metav1.GetOptions{})
			return err != nil, nil
		})
		return node
	}

	t.Run("a warm copy on a kwok node", func(t *testing.T) {
		label(map[string]v1alpha1.Tier{"kwok-b": v1alpha1.TierWarm})
		if n := wake(); n != "kwok-b" {
			t.Errorf("the woken root landed on %s, want kwok-b, the node labelled %s=warm", n, key)
		}
	})
	t.Run("a hot copy on the real node, where the pod's containers run", func(t *testing.T) {
		label(map[string]v1alpha1.Tier{realNode: v1alpha1.TierHot})
		if n := wake(); n != realNode {
			t.Errorf("the woken root landed on %s, want %s, the node labelled %s=hot", n, realNode, key)
		}
	})
	t.Run("hot wins over warm", func(t *testing.T) {
		label(map[string]v1alpha1.Tier{realNode: v1alpha1.TierHot, "kwok-a": v1alpha1.TierWarm})
		if n := wake(); n != realNode {
			t.Errorf("the woken root landed on %s, want %s (hot) over kwok-a (warm)", n, realNode)
		}
	})
	t.Run("the labels removed, a wake falls back to any node", func(t *testing.T) {
		label(nil)
		if n := wake(); n == "" {
			t.Error("the woken root was not scheduled")
		}
	})
}
