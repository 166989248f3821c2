package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestOllamaIsParkedAndWakesFromZeroOntoItsHotCopy (issue 27 §2, §3 and
// §4) runs a sleeping Ollama application with minReplicas 0 and a short
// parkAfter on the real node, with the dispatcher granted patch on nodes
// as the cluster administrator does (docs/lifecycle.md, "Parking"), and
// the default ReadWriteOnce model cache, which the node agent does not
// mount: the agent copies the GGUF through the engine's sidecar, verified
// against the fetcher's manifest. It
// sleeps with a verified hot copy of its GGUF on the node, is parked (its
// root pod deleted, freeing the node, the node agent keeping the hot copy,
// the node labelled hot for it, status parked naming the copy), and a chat
// then wakes it from zero onto that node: the new root's engine loads the
// hot copy, and lastWake names the Hot tier with the GGUF's bytes.
func TestOllamaIsParkedAndWakesFromZeroOntoItsHotCopy(t *testing.T) {
	requireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-ollama-park")
	const name, app = "park", "ollama"
	logf := stepLogf(t)
	// The administrator's grant: patch on nodes for the release's
	// dispatcher, and nothing else.
	grantOnNodes(ctx, t, "e2e-park-nodes-"+ns, "patch", ns, name+"-dispatcher")
	key := v1alpha1.WeightsNodeLabelPrefix + ns + "." + name + "-" + app
	t.Cleanup(func() {
		ctx := context.Background()
		nodes, _ := env.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		for _, n := range nodes.Items {
			if _, ok := n.Labels[key]; ok {
				_, _ = env.cs.CoreV1().Nodes().Patch(ctx, n.Name, "application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, key), metav1.PatchOptions{})
			}
		}
	})

	// Parked 20s after it fell asleep: time to see it asleep first.
	obj := ollamaTiersResource(t, ns, name, app, map[string]any{"minReplicas": int64(0), "zeroAfter": "30m", "parkAfter": "20s"})
	// The default cache: ReadWriteOnce, which the node agent cannot mount.
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"size": "1Gi"}, "spec", "applications", app, "model", "cache"))
	o := deployOllamaTiersObject(ctx, t, ns, name, app, obj, logf)
	token, base, served, sha, size, copyName, root, agentURL := o.token, o.base, o.served, o.sha, o.size, o.copyName, o.root, o.agentURL
	node := root.Spec.NodeName
	ds, err := env.cs.AppsV1().DaemonSets(ns).Get(ctx, name+"-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Fatalf("the node agent mounts the claim %s (volume %s); want no model cache in the agent with a ReadWriteOnce cache", v.PersistentVolumeClaim.ClaimName, v.Name)
		}
	}
	pvcs, err := env.cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pvc := range pvcs.Items {
		if len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
			t.Errorf("claim %s has access modes %v; want the default ReadWriteOnce", pvc.Name, pvc.Spec.AccessModes)
		}
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, "hello", 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat: %v", err)
	}

	t.Run("asleep, then parked: the pod is gone, the hot copy stays and its node is labelled", func(t *testing.T) {
		eventually(t, 90*time.Second, func() error {
			st, err := appStatus(ctx, ns, name, app)
			if err != nil {
				return err
			}
			if lc := st.Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleAsleep || lc.ResidentTier != v1alpha1.TierHot {
				return fmt.Errorf("lifecycle %s; want Asleep in the Hot tier", lifecycleJSON(st.Lifecycle))
			}
			return nil
		})
		logf("asleep in the hot tier")
		var st v1alpha1.ApplicationStatus
		eventually(t, 90*time.Second, func() error {
			var err error
			st, err = appStatus(ctx, ns, name, app)
			if err != nil {
				return err
			}
			lc := st.Lifecycle
			if lc == nil || lc.State != v1alpha1.LifecycleZero || lc.Parked == nil {
				return fmt.Errorf("lifecycle %s; want Zero, parked", lifecycleJSON(lc))
			}
			return nil
		})
		logf("parked: %s", st.Message)
		lc := st.Lifecycle
		if len(lc.Parked.Copies) != 1 || lc.Parked.Copies[0] != (v1alpha1.NodeCopy{Node: node, Tier: v1alpha1.TierHot}) || lc.ResidentTier != v1alpha1.TierHot || lc.Parked.NodeLabel != key {
			t.Errorf("parked %s, resident tier %s; want the hot copy on %s, the node label %s", jsonOf(lc.Parked), lc.ResidentTier, node, key)
		}
		if st.Phase != v1alpha1.PhaseIdle || !strings.Contains(st.Message, "parked") || !strings.Contains(st.Message, "Hot on "+node) {
			t.Errorf("phase %s, message %q; want Idle, saying it is parked with the hot copy on %s", st.Phase, st.Message, node)
		}
		eventually(t, time.Minute, func() error {
			pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=root"})
			if err != nil {
				return err
			}
			if len(pods.Items) != 0 {
				return fmt.Errorf("%d root pods after parking, want none", len(pods.Items))
			}
			return nil
		})
		if e, ok := agentCopy(ctx, t, agentURL, ns, copyName, v1alpha1.TierHot); !ok || e.SHA256 != sha || e.Bytes != size {
			t.Fatalf("the node agent's hot copy after parking %+v (%v); want %d bytes with the manifest's sha256", e, ok, size)
		}
		eventually(t, 30*time.Second, func() error {
			n, err := env.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if v := n.Labels[key]; v != v1alpha1.WeightsOnNodeHot {
				return fmt.Errorf("node %s has %s=%q, want hot", node, key, v)
			}
			return nil
		})
	})

	t.Run("a chat wakes it from zero onto the node, loading the hot copy", func(t *testing.T) {
		// On failure, the start of the woken root's containers (which copy
		// the sidecar pointed the engine at, and why: its passedOver) and
		// the node agent's log, read right after the chat: the application
		// may be parked again, its pod gone, by the time a check fails.
		var woke strings.Builder
		capture := func() {
			pods, _ := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
			for _, p := range pods.Items {
				containers := map[string][]string{"root": {"sidecar", "engine"}, "checkpoint-agent": {"agent"}}[p.Labels["app.kubernetes.io/component"]]
				for _, c := range containers {
					logs, lerr := env.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c, LimitBytes: new(int64(16 << 10))}).DoRaw(ctx)
					fmt.Fprintf(&woke, "pod %s container %s (%v), first lines:\n%s\n", p.Name, c, lerr, logs)
				}
			}
			var tiers nodeapi.TiersStatus
			err := (nodeapi.Client{URL: agentURL, HTTP: http.DefaultClient}).Call(ctx, http.MethodGet, nodeapi.PathTiers, nil, &tiers)
			fmt.Fprintf(&woke, "the node agent's copies (%v): %+v\n", err, tiers.Entries)
		}
		defer func() {
			if t.Failed() {
				t.Logf("right after the chat that woke it:\n%s", woke.String())
			}
		}()
		sent := time.Now()
		res, err := stack.StreamChat(ctx, base, token, served, "wake up", 8, nil)
		capture()
		if err != nil || !res.Answered() {
			t.Fatalf("the chat sent to the parked application: %+v, %v", res, err)
		}
		logf("the chat that woke it from zero was answered in %s", time.Since(sent).Round(time.Millisecond))
		eventually(t, 30*time.Second, func() error {
			st, err := appStatus(ctx, ns, name, app)
			if err != nil {
				return err
			}
			lc := st.Lifecycle
			if lc == nil || lc.State != v1alpha1.LifecycleAwake || lc.Parked != nil || lc.LastWake == nil {
				return fmt.Errorf("lifecycle %s; want Awake, no longer parked", lifecycleJSON(lc))
			}
			if lc.LastWake.FromTier != v1alpha1.TierHot || lc.LastWake.Bytes != size {
				return fmt.Errorf("lastWake %s; want fromTier Hot with the GGUF's %d bytes", jsonOf(lc.LastWake), size)
			}
			return nil
		})
		woken := appRoot(ctx, t, ns, name, app)
		if woken.UID == root.UID || woken.Spec.NodeName != node {
			t.Errorf("the woken root %s (uid %s) on %s; want a new pod on %s", woken.Name, woken.UID, woken.Spec.NodeName, node)
		}
		sc, err := sidecarState(ctx, ns, woken.Name)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Model == nil || sc.Model.Path != "/var/run/model-orchestra/hot/"+copyName || sc.Model.Bytes != size {
			t.Errorf("the new root's sidecar points Ollama at %+v; want the hot copy %s", sc.Model, copyName)
		}
		if loaded, err := ollamaLoaded(ctx, woken); err != nil || len(loaded) != 1 {
			t.Errorf("awake, Ollama has %q loaded (%v); want the model", loaded, err)
		}
		events, _ := env.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		var parked, landed bool
		for _, e := range events.Items {
			switch e.Reason {
			case "Parked":
				parked = true
			case "WokeFromPark":
				landed = landed || strings.Contains(e.Message, "which holds a Hot copy")
			}
		}
		if !parked || !landed {
			t.Errorf("events Parked %v, WokeFromPark on the node holding the hot copy %v; want both", parked, landed)
		}
	})
}
