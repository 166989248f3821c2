package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestWakeSurvivesNATSKill kills NATS, which holds the queued requests and
// the application's paused consumer, while a sleeping engine wakes from the
// hot tier with requests waiting for it, on real pods. The simulator (64 MiB
// of weights, every wake slowed by 10 s) sleeps after 3 s idle; six chats,
// half of them streamed, wake it, and while the wake runs the NATS server's
// container is SIGKILLed. Every chat must be answered once and whole, with
// no 5xx; the engine must end Awake after a verified restore of its weights
// from the hot tier, having refused nothing while it slept; and NATS must
// have restarted. Bounded by 4 minutes. On the side, the node agent's
// ServiceAccount is granted get on nodes, as the cluster administrator does
// (docs/checkpoint.md): its report and the ModelCheckpoint carry the node's
// real container runtime version.
func TestWakeSurvivesNATSKill(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-natswake")
	const (
		name    = "natswake"
		weights = 64 << 20
		waiting = 6
	)
	start := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("[%3.0fs] "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}
	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := simulatorResource(t, ns, name)
	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedStringSlice(obj.Object, []string{"--weights-bytes=64Mi", "--fault-wake-delay=10s", "--ttft=20ms", "--itl=5ms"}, "spec", "applications", app, "runtime", "args"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"requests": map[string]any{"cpu": "50m", "memory": "192Mi"},
		"limits":   map[string]any{"memory": "512Mi"},
	}, "spec", "applications", app, "runtime", "resources"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "3s", "maxWait": "2m",
	}, "spec", "applications", app, "lifecycle"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{"maxConcurrent": int64(0), "requestsPerMinute": int64(0)}, "spec", "gateway", "limits"))
	grantNodeRead(ctx, t, ns, name+"-agent")
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	logf("Ready, first chat answered")
	root := stackPod(ctx, t, ns, name, "root", 0)
	waitAsleep(ctx, t, ns, name, root.Name, func(tier v1alpha1.Tier) bool { return tier == v1alpha1.TierHot })
	logf("asleep in the hot tier")
	t.Run("the node agent reports its node's container runtime", func(t *testing.T) {
		agent := stackPod(ctx, t, ns, name, "checkpoint-agent", 0)
		node, err := env.cs.CoreV1().Nodes().Get(ctx, agent.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := node.Status.NodeInfo.ContainerRuntimeVersion
		raw, err := env.cs.CoreV1().Pods(ns).ProxyGet("http", agent.Name, "9301", "/report", nil).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var rep nodeapi.NodeReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		if rep.Runtime.Version != want || rep.Runtime.Source != "node "+node.Name {
			t.Errorf("the agent's runtime report %+v; want %s read from node %s", rep.Runtime, want, node.Name)
		}
		logf("runtime %s (from %s): %s", rep.Runtime.Version, rep.Runtime.Source, rep.Runtime.Reason)
		eventually(t, 30*time.Second, func() error {
			mcp, err := env.dyn.Resource(modelCheckpointGVR).Namespace(ns).Get(ctx, name+"-"+app, metav1.GetOptions{})
			if err != nil {
				return err
			}
			nodes, _, _ := unstructured.NestedSlice(mcp.Object, "status", "nodes")
			for _, n := range nodes {
				m, _ := n.(map[string]any)
				if m["node"] == node.Name && m["containerRuntimeVersion"] == want {
					return nil
				}
			}
			return fmt.Errorf("ModelCheckpoint status.nodes %v; want node %s with runtime %s", nodes, node.Name, want)
		})
	})

	natsPod := stackPod(ctx, t, ns, name, "nats", 0)
	mo, err := stack.Get(ctx, env.dyn, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	wakes := mo.Status.Applications[app].Lifecycle.Wakes
	deliveries := failedDeliveries(ctx, t, ns)

	load := chaosLoad{token: token, model: served, targets: []string{base}}
	outcomes := make([]chaosOutcome, waiting)
	var wg sync.WaitGroup
	for i := range waiting {
		wg.Go(func() {
			outcomes[i] = load.one(ctx, base, fmt.Sprintf("wake through a NATS kill %d", i), i%2 == 1, func() {})
		})
	}
	eventually(t, 60*time.Second, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		if lc := mo.Status.Applications[app].Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleWaking {
			return fmt.Errorf("lifecycle %s; want state Waking", lifecycleJSON(lc))
		}
		return nil
	})
	logf("waking with %d requests waiting; killing NATS (%s)", waiting, natsPod.Name)
	killedAt := killContainer(ctx, t, ns, natsPod, "nats")
	wg.Wait()
	logf("every client has its outcome %.1fs after the kill", time.Since(killedAt).Seconds())

	rep := &chaosReport{cutBy: map[string]int{}, cutAt: map[string]int{}, serverErrorsAt: map[string]int{}}
	for _, o := range outcomes {
		rep.add(base, o)
	}
	logf("clients: %v", rep)
	if rep.completed != waiting || rep.lost != 0 || rep.duplicated != 0 || rep.incomplete != 0 || rep.serverErrors != 0 || rep.cut != 0 {
		t.Errorf("of %d requests waiting for the wake: completed %d, cut %d %v, lost %d, duplicated %d, incomplete %d, 5xx %d; want every one completed once",
			waiting, rep.completed, rep.cut, rep.cutBy, rep.lost, rep.duplicated, rep.incomplete, rep.serverErrors)
		t.Logf("gateway, dispatcher and NATS logs:\n%s", podLogs(ctx, ns, "app.kubernetes.io/instance="+name+",app.kubernetes.io/component in (gateway,dispatcher,nats)", 40))
	}

	lw := checkVerifiedWake(ctx, t, ns, name, root.Name, wakes, weights, v1alpha1.TierHot, nil).LastWake
	logf("lastWake: from %s, %d bytes in %ss", lw.FromTier, lw.Bytes, lw.Seconds)
	// A redelivery the dispatcher counts is a request handed to the engine
	// a second time: the client saw it once, the engine ran it twice.
	if grew := grown(deliveries, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
		t.Errorf("the requests that waited for the wake were not delivered once; the dispatchers counted:\n%s", strings.Join(grew, "\n"))
	}
	eventually(t, 90*time.Second, func() error {
		p, err := env.cs.CoreV1().Pods(ns).Get(ctx, natsPod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "nats" && s.RestartCount >= 1 && s.Ready {
				return nil
			}
		}
		return fmt.Errorf("container nats of %s has not restarted and become ready: %+v", natsPod.Name, p.Status.ContainerStatuses)
	})
	p, err := env.cs.CoreV1().Pods(ns).Get(ctx, root.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != root.UID {
		t.Errorf("root pod %s was replaced: a wake must keep the pod", root.Name)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("container %s of root %s restarted %d times: a NATS kill during the wake must not reach the engine", s.Name, root.Name, s.RestartCount)
		}
	}
	logf("done")
}

var modelCheckpointGVR = schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "modelcheckpoints"}

// grantNodeRead gives the ServiceAccount sa of namespace ns get on nodes, as
// docs/checkpoint.md tells the cluster administrator to, until the test
// ends.
func grantNodeRead(ctx context.Context, t *testing.T, ns, sa string) {
	t.Helper()
	name := "e2e-agent-nodes-" + ns
	rbac := env.cs.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rbac.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rbac.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// TestProcessSnapshotsAreRefusedWhereTheNodeCannot turns
// tiers.processSnapshots on for a sleeping simulator on real pods: no pod
// gains criu's privileges (the agent image holds no criu, so the chart
// grants nothing for a feature that cannot work), the agent runs (no
// crash), and since this node cannot take process snapshots the
// ModelOrchestra's
// ProcessSnapshotsSupported condition is False, naming the node, its
// container runtime and the reason, while the application still sleeps and
// wakes through its weights. Bounded by 3 minutes.
func TestProcessSnapshotsAreRefusedWhereTheNodeCannot(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-snapshots")
	const name = "snap"
	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := simulatorResource(t, ns, name)
	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedStringSlice(obj.Object, []string{"--weights-bytes=16Mi", "--ttft=20ms", "--itl=5ms"}, "spec", "applications", app, "runtime", "args"))
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "3s", "maxWait": "2m",
		"tiers": map[string]any{"processSnapshots": true},
	}, "spec", "applications", app, "lifecycle"))
	grantNodeRead(ctx, t, ns, name+"-agent")
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	root := stackPod(ctx, t, ns, name, "root", 0)
	waitAsleep(ctx, t, ns, name, root.Name, func(tier v1alpha1.Tier) bool { return tier == v1alpha1.TierHot })

	agent := stackPod(ctx, t, ns, name, "checkpoint-agent", 0)
	for _, p := range []string{agent.Name, root.Name, stackPod(ctx, t, ns, name, "dispatcher", 0).Name} {
		pod, err := env.cs.CoreV1().Pods(ns).Get(ctx, p, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.HostPID || slices.ContainsFunc(pod.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--snapshot-dir") }) {
			t.Errorf("pod %s: hostPID %v, args %v; want no snapshot wiring while the agent image holds no criu", p, pod.Spec.HostPID, pod.Spec.Containers[0].Args)
		}
	}
	var cond *metav1.Condition
	eventually(t, 60*time.Second, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		cond = meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionProcessSnapshotsSupported)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonProcessSnapshotsUnsupported ||
			!strings.Contains(cond.Message, "node "+agent.Spec.NodeName) || !strings.Contains(cond.Message, "container runtime containerd://") {
			return fmt.Errorf("condition %s = %+v; want False naming node %s and its container runtime", v1alpha1.ConditionProcessSnapshotsSupported, cond, agent.Spec.NodeName)
		}
		return nil
	})
	t.Logf("%s: %s", cond.Reason, cond.Message)
	for _, s := range agent.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("node agent container %s restarted %d times", s.Name, s.RestartCount)
		}
	}
	res, err := stack.StreamChat(ctx, base, token, served, "wake up", 8, nil)
	if err == nil && (!res.Done || res.FinishReason == "") {
		err = fmt.Errorf("stream cut: done %v, finish_reason %q after %d chunks", res.Done, res.FinishReason, res.Chunks)
	}
	if err != nil {
		t.Fatalf("the chat sent to the sleeping application was not answered completely: %v", err)
	}
	eventually(t, 30*time.Second, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		if lc := mo.Status.Applications[app].Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleAwake || lc.LastWake == nil || lc.LastWake.FromTier != v1alpha1.TierHot {
			return fmt.Errorf("lifecycle %s; want Awake after a wake from the hot tier", lifecycleJSON(lc))
		}
		return nil
	})
}
