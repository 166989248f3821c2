package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// sleepWeights is the simulator's synthetic weights in TestSleepAndWake:
// the 1 GiB of issue #17. A level-1 sleep writes them to the hot tier (a
// tmpfs charged to the engine container) before it frees them, so the
// engine briefly holds them twice: its limit is twice the weights plus the
// process.
const (
	sleepWeights     = 1 << 30
	sleepWeightsFlag = "--weights-bytes=1Gi"
	sleepMemLimit    = "2432Mi"
	sleepMemRequest  = "1152Mi"
	sleepPolicy      = "fast-resume"
	sidecarPort      = 9300 // the sidecar's port in a root pod
	enginePort       = 8080 // the simulator's port in a root pod
)

var checkpointPolicyGVR = schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "checkpointpolicies"}

// TestSleepAndWake runs a simulator application holding 1 GiB of real
// weights with a short sleepAfter on real pods. First its CheckpointPolicy
// does not exist: the condition names it and the application runs and
// sleeps by its inline fields. Idle, its engine sleeps at level 1: status
// Asleep in the hot tier, the root pod running but not Ready and out of
// the EndpointSlice; a streamed chat through the gateway, JetStream and
// the dispatcher wakes it, the restored bytes verified, nothing sent to
// the sleeping engine and every request delivered once. Then the policy
// appears with a parkAfter: the sleeping engine is demoted out of the hot
// tier and the next chat wakes it from where the weights went.
func TestSleepAndWake(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-sleep")
	const name = "sleepy"
	logf := stepLogf(t)

	token := apiToken(ctx, t, ns)
	obj := sleepySimulator(t, ns, name, []string{sleepWeightsFlag, "--ttft=20ms", "--itl=5ms"}, sleepMemRequest, sleepMemLimit, map[string]any{
		"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "4s", "maxWait": "2m",
		"checkpointPolicy": sleepPolicy,
	})
	served, _, _ := unstructured.NestedString(obj.Object, "spec", "applications", app, "serving", "servedModelName")
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	logf("Ready")
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a missing CheckpointPolicy is a condition naming it", func(t *testing.T) {
		eventually(t, time.Minute, func() error {
			mo, err := stack.Get(ctx, env.dyn, ns, name)
			if err != nil {
				return err
			}
			c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionCheckpointPolicyResolved)
			if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, sleepPolicy) {
				return fmt.Errorf("condition %s = %+v; want False naming %s", v1alpha1.ConditionCheckpointPolicyResolved, c, sleepPolicy)
			}
			if !stack.Ready(mo) {
				return fmt.Errorf("not Ready: %s", stack.Progress(mo))
			}
			return nil
		})
	})

	var callerToken string
	t.Run("the release's caller token is generated once, for the agent, the dispatcher and the sidecars", func(t *testing.T) {
		sec, err := env.cs.CoreV1().Secrets(ns).Get(ctx, name+"-agent-caller", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the caller token Secret: %v", err)
		}
		if callerToken = string(sec.Data["token"]); len(callerToken) != 48 {
			t.Fatalf("caller token of %d bytes; want the 48 random characters the chart generates", len(callerToken))
		}
		// The parkAfter demotion below is a mutating call of the node
		// agent by the dispatcher's leader: it passes only with this token.
		// From outside the release, the agent refuses a mutating call
		// without it (the NetworkPolicy is not enforced on this cluster,
		// so the test reaches the agent's pod directly).
		agents, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=checkpoint-agent"})
		if err != nil || len(agents.Items) == 0 || agents.Items[0].Status.PodIP == "" {
			t.Fatalf("the node agent's pod: %v (%d pods)", err, len(agents.Items))
		}
		url := "http://" + net.JoinHostPort(agents.Items[0].Status.PodIP, "9301") + nodeapi.PathVerify
		for _, c := range []struct {
			token string
			want  int
		}{{"", http.StatusUnauthorized}, {"not-the-release-token", http.StatusUnauthorized}, {callerToken, http.StatusOK}} {
			eventually(t, 30*time.Second, func() error {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
				if err != nil {
					return err
				}
				if c.token != "" {
					nodeapi.Authorize(req, c.token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return err
				}
				_ = resp.Body.Close()
				if resp.StatusCode != c.want {
					return fmt.Errorf("POST %s with token %t: %d, want %d", url, c.token != "", resp.StatusCode, c.want)
				}
				return nil
			})
		}
		// The engine's sidecar refuses a sleep from outside the release
		// too, without the token or with another (401 before its handler
		// runs; TestSidecarRefusesForbiddenCalls shows the engine untouched).
		roots, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=root"})
		if err != nil || len(roots.Items) == 0 || roots.Items[0].Status.PodIP == "" {
			t.Fatalf("the root pod: %v (%d pods)", err, len(roots.Items))
		}
		sidecar := "http://" + net.JoinHostPort(roots.Items[0].Status.PodIP, "9300")
		for _, tok := range []string{"", "not-the-release-token"} {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, sidecar+"/sleep", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tok != "" {
				nodeapi.Authorize(req, tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("POST %s/sleep: %v", sidecar, err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("POST %s/sleep with token %t: %d, want 401", sidecar, tok != "", resp.StatusCode)
			}
		}
	})

	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
	root := stackPod(ctx, t, ns, name, "root", 0)
	before := failedDeliveries(ctx, t, ns)

	t.Run("asleep in the hot tier, out of the EndpointSlice", func(t *testing.T) {
		waitAsleep(ctx, t, ns, name, root.Name, func(tier v1alpha1.Tier) bool { return tier == v1alpha1.TierHot })
		logf("asleep in the hot tier")
		mem := engineMemory(ctx, t, ns, root.Name)
		logf("engine memory asleep: %s", mem)
		if mem.Shmem < sleepWeights {
			t.Errorf("the engine's memory cgroup holds %d bytes of tmpfs while asleep; want the %d bytes of the level-1 offload", mem.Shmem, sleepWeights)
		}
	})

	t.Run("a streamed chat wakes it from the hot tier", func(t *testing.T) {
		wakeByChat(ctx, t, ns, name, root.Name, base, token, served, v1alpha1.TierHot)
		logf("awake from the hot tier; engine memory: %s", engineMemory(ctx, t, ns, root.Name))
		if grew := grown(before, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
			t.Errorf("the request that woke the engine was not delivered once; the dispatcher counted:\n%s", strings.Join(grew, "\n"))
		}
	})

	// The policy appears, with a parkAfter: the engine that sleeps again
	// is demoted out of the hot tier.
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "CheckpointPolicy",
		"metadata": map[string]any{"name": sleepPolicy, "namespace": ns},
		"spec": map[string]any{
			"triggers": map[string]any{"parkSeconds": int64(5)},
			"tiers":    map[string]any{"hot": "RAM", "warm": "Disk", "cold": "ModelCache"},
		},
	}}
	if _, err := env.dyn.Resource(checkpointPolicyGVR).Namespace(ns).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CheckpointPolicy %s: %v", sleepPolicy, err)
	}
	eventually(t, time.Minute, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		if c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionCheckpointPolicyResolved); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("condition %s = %+v; want True once the policy exists", v1alpha1.ConditionCheckpointPolicyResolved, c)
		}
		return nil
	})
	logf("policy resolved")

	t.Run("demoted by parkAfter to the warm tier, woken from it", func(t *testing.T) {
		var tier v1alpha1.Tier
		waitAsleep(ctx, t, ns, name, root.Name, func(got v1alpha1.Tier) bool {
			tier = got
			return got == v1alpha1.TierWarm || got == v1alpha1.TierCold
		})
		logf("demoted: asleep in the %s tier; engine memory: %s", tier, engineMemory(ctx, t, ns, root.Name))
		if tier != v1alpha1.TierWarm {
			t.Errorf("the demoted weights are in the %s tier; want Warm (the node agent's verified copy of the hot offload)", tier)
		}
		// The dispatcher was replaced with its new configuration: its
		// counters start again.
		dispatchers := failedDeliveries(ctx, t, ns)
		wakeByChat(ctx, t, ns, name, root.Name, base, token, served, tier)
		logf("awake from the %s tier", tier)
		if grew := grown(dispatchers, failedDeliveries(ctx, t, ns)); len(grew) > 0 {
			t.Errorf("the request that woke the demoted engine was not delivered once; the dispatcher counted:\n%s", strings.Join(grew, "\n"))
		}
		// The policy's parkAfter was a Helm upgrade: the token stayed.
		if sec, err := env.cs.CoreV1().Secrets(ns).Get(ctx, name+"-agent-caller", metav1.GetOptions{}); err != nil || string(sec.Data["token"]) != callerToken {
			t.Errorf("after the upgrade the caller token Secret is %v (err %v); want the token of the install, kept", sec != nil && string(sec.Data["token"]) == callerToken, err)
		}
	})

	p, err := env.cs.CoreV1().Pods(ns).Get(ctx, root.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != root.UID {
		t.Errorf("root pod %s was replaced (uid %s, was %s): sleeping must keep the pod", root.Name, p.UID, root.UID)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("container %s of root %s restarted %d times (last: %+v): sleeping and waking must not kill it", s.Name, root.Name, s.RestartCount, s.LastTerminationState.Terminated)
		}
	}
	logf("engine memory at the end, for %d MiB of weights: %s", sleepWeights>>20, engineMemory(ctx, t, ns, root.Name))
}

// waitAsleep waits until the application sleeps in a tier tierOK accepts:
// phase and state Asleep, the sidecar of its root Asleep, the root pod
// running but not Ready and no EndpointSlice listing it as ready.
func waitAsleep(ctx context.Context, t *testing.T, ns, name, root string, tierOK func(v1alpha1.Tier) bool) {
	t.Helper()
	eventually(t, 90*time.Second, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		st := mo.Status.Applications[app]
		lc := st.Lifecycle
		if st.Phase != v1alpha1.PhaseAsleep || lc == nil || lc.State != v1alpha1.LifecycleAsleep || !tierOK(lc.ResidentTier) {
			return fmt.Errorf("application %s: phase %q, lifecycle %s; want phase and state Asleep in the expected tier", app, st.Phase, lifecycleJSON(lc))
		}
		sc, err := sidecarState(ctx, ns, root)
		if err != nil {
			return err
		}
		if sc.State != sidecarapi.Asleep {
			return fmt.Errorf("the sidecar of %s is %s; want Asleep", root, sc.State)
		}
		p, err := env.cs.CoreV1().Pods(ns).Get(ctx, root, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			return fmt.Errorf("root pod %s is %s; a sleeping engine keeps its pod running", root, p.Status.Phase)
		}
		if podReady(p) {
			return fmt.Errorf("root pod %s is still Ready while its engine sleeps", root)
		}
		return inEndpointSlice(ctx, ns, name+"-"+app, root)
	})
}

// inEndpointSlice is an error while an EndpointSlice of the Service lists
// the pod as a ready endpoint. The service is the application's root
// Service, whose ready endpoints the dispatchers send requests to (not the
// headless one, which publishes pods that are not ready for their DNS
// names).
func inEndpointSlice(ctx context.Context, ns, service, pod string) error {
	slices, err := env.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		return err
	}
	if len(slices.Items) == 0 {
		return fmt.Errorf("service %s has no EndpointSlice", service)
	}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && e.TargetRef.Name == pod && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				return fmt.Errorf("EndpointSlice %s still lists %s as ready", s.Name, pod)
			}
		}
	}
	return nil
}

// wakeByChat sends one streamed chat through the gateway to the sleeping
// application and checks the wake: the answer complete, the state Awake,
// lastWake from the tier with every byte restored and verified (by the
// sidecar and the simulator), and no request ever refused by the sleeping
// engine.
func wakeByChat(ctx context.Context, t *testing.T, ns, name, root, base, token, model string, from v1alpha1.Tier) {
	t.Helper()
	mo, err := stack.Get(ctx, env.dyn, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	wakes := int64(0)
	if lc := mo.Status.Applications[app].Lifecycle; lc != nil {
		wakes = lc.Wakes
	}
	sent := time.Now()
	res, err := stack.StreamChat(ctx, base, token, model, "wake up", 8, nil)
	if err == nil && (!res.Done || res.FinishReason == "") {
		err = fmt.Errorf("stream cut: done %v, finish_reason %q after %d chunks", res.Done, res.FinishReason, res.Chunks)
	}
	if err != nil {
		t.Fatalf("the chat sent to the sleeping application was not answered completely: %v", err)
	}
	t.Logf("the chat that woke the engine was answered in %.2fs", time.Since(sent).Seconds())

	lc := checkVerifiedWake(ctx, t, ns, name, root, wakes, sleepWeights, from, func(lc *v1alpha1.LifecycleStatus) error {
		if lc.Wakes != wakes+1 || lc.LastWake.FirstTokenSeconds == "" {
			return fmt.Errorf("wake %d of %d, first token after %q; want wake %d with its first-token seconds", lc.Wakes, wakes+1, lc.LastWake.FirstTokenSeconds, wakes+1)
		}
		return nil
	})
	lw := lc.LastWake
	t.Logf("lastWake: from %s, %d bytes in %ss (%d B/s), first token after %ss", lw.FromTier, lw.Bytes, lw.Seconds, lw.BytesPerSecond, lw.FirstTokenSeconds)
	// Awake, the engine holds the weights once: a wake that leaves a
	// second copy behind (an arena, the offload) would be OOM-killed by
	// the next level-1 sleep.
	if mem := engineMemory(ctx, t, ns, root); mem.RSS+mem.Shmem > sleepWeights*5/4 {
		t.Errorf("awake after a wake from the %s tier, the engine holds %d MiB of anonymous memory and tmpfs for %d MiB of weights (%s): a copy was left behind",
			from, (mem.RSS+mem.Shmem)>>20, sleepWeights>>20, mem)
	}
}

// checkVerifiedWake waits for the application to be Awake after a wake
// later than wake number after (and for also, when not nil), then checks
// what every wake from a tier must leave: lastWake from that tier with all
// the weights' bytes, the sidecar Awake after a verified restore of them, and
// an engine that refused nothing while it slept and verified the wake.
func checkVerifiedWake(ctx context.Context, t *testing.T, ns, name, root string, after, weights int64, from v1alpha1.Tier, also func(*v1alpha1.LifecycleStatus) error) *v1alpha1.LifecycleStatus {
	t.Helper()
	var lc *v1alpha1.LifecycleStatus
	eventually(t, 60*time.Second, func() error {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return err
		}
		st := mo.Status.Applications[app]
		lc = st.Lifecycle
		if lc == nil || lc.State != v1alpha1.LifecycleAwake || lc.Wakes <= after || lc.LastWake == nil || lc.LastWake.Seconds == "" {
			return fmt.Errorf("application %s: phase %q, lifecycle %s; want Awake after wake %d", app, st.Phase, lifecycleJSON(lc), after+1)
		}
		if also != nil {
			return also(lc)
		}
		return nil
	})
	if lw := lc.LastWake; lw.FromTier != from || lw.Bytes != weights {
		t.Errorf("lastWake = %+v; want fromTier %s and bytes %d (the weights)", lw, from, weights)
	}
	sc, err := sidecarState(ctx, ns, root)
	if err != nil {
		t.Fatal(err)
	}
	if sc.State != sidecarapi.Awake || sc.LastWake == nil || sc.LastWake.Transfer == nil ||
		!sc.LastWake.Transfer.Verified || sc.LastWake.Transfer.Bytes != weights ||
		sc.LastWake.Transfer.Tier != from {
		t.Errorf("sidecar of %s: state %s, last wake %s; want Awake after a verified restore of %d bytes from the %s tier",
			root, sc.State, jsonOf(sc.LastWake), weights, from)
	}
	m, err := scrape(ctx, ns, root, strconv.Itoa(enginePort))
	if err != nil {
		t.Fatal(err)
	}
	if n := metricValue(m, "orchestra_sim_requests_refused_asleep_total"); n != 0 {
		t.Errorf("the sleeping engine refused %g requests: one was sent to it while it slept", n)
	}
	if n := metricValue(m, "orchestra_sim_wakes_total", `result="mismatch"`); n != 0 {
		t.Errorf("%g wakes failed the hash verification", n)
	}
	if n := metricValue(m, "orchestra_sim_wakes_total", `tier="`+string(from)+`"`, `result="ok"`); n < 1 {
		t.Errorf("the simulator counted no verified wake from the %s tier", from)
	}
	return lc
}

// sidecarState reads GET /state of the sidecar of a root pod through
// the API server's pod proxy.
func sidecarState(ctx context.Context, ns, pod string) (*sidecarapi.Status, error) {
	raw, err := env.cs.CoreV1().Pods(ns).ProxyGet("http", pod, strconv.Itoa(sidecarPort), "/state", nil).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the sidecar state of %s: %w", pod, err)
	}
	st := &sidecarapi.Status{}
	if err := json.Unmarshal(raw, st); err != nil {
		return nil, fmt.Errorf("decoding the sidecar state of %s: %w (%s)", pod, err, raw)
	}
	return st, nil
}

// scrape reads /metrics of a pod's port through the API server's pod proxy.
func scrape(ctx context.Context, ns, pod, port string) (string, error) {
	raw, err := env.cs.CoreV1().Pods(ns).ProxyGet("http", pod, port, "/metrics", nil).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the metrics of %s: %w", pod, err)
	}
	return string(raw), nil
}

// metricValue sums the samples of a metric whose labels contain every one
// of labels (`name="value"`); 0 when there are none.
func metricValue(text, name string, labels ...string) float64 {
	var sum float64
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); ok && err == nil {
			sum += v
		}
	}
	return sum
}

// engineMemory reads the memory cgroup of the root's engine container.
func engineMemory(ctx context.Context, t *testing.T, ns, pod string) stack.Memory {
	t.Helper()
	m, err := stack.ContainerMemory(ctx, env.cs, ns, pod, "engine")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func lifecycleJSON(lc *v1alpha1.LifecycleStatus) string {
	if lc == nil {
		return "(none)"
	}
	return jsonOf(lc)
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// TestColdWakeSurvivesKills wakes a sleeping engine from the cold tier on
// real pods while the components around the wake are killed. The
// simulator (256 MiB of weights, every wake slowed by 15 s) sleeps and is
// demoted to the warm tier; the node agent's warm copy is then removed
// (DELETE /tiers/warm/…), so the resident tier is Cold. A streamed chat
// wakes it, and while the wake runs the node agent's and the dispatcher's
// (the lifecycle leader's) containers are SIGKILLed. The chat must still
// be answered completely, the wake must come from the cold tier with every
// byte verified, the sleeping engine must have refused nothing, and both
// killed containers must have restarted. Bounded by 7 minutes.
func TestColdWakeSurvivesKills(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-coldwake")
	const (
		name    = "coldwake"
		weights = 256 << 20
	)
	logf := stepLogf(t)
	token := apiToken(ctx, t, ns)
	obj := sleepySimulator(t, ns, name, []string{"--weights-bytes=256Mi", "--fault-wake-delay=15s", "--ttft=20ms", "--itl=5ms"}, "384Mi", "1Gi", map[string]any{
		"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "3s", "parkAfter": "4s", "maxWait": "4m",
	})
	base, served := deployAndChat(ctx, t, ns, name, token, obj)
	logf("Ready, first chat answered")
	root := stackPod(ctx, t, ns, name, "root", 0)
	waitAsleep(ctx, t, ns, name, root.Name, func(tier v1alpha1.Tier) bool { return tier == v1alpha1.TierWarm })
	logf("asleep, demoted to the warm tier")

	// The warm copy goes away (as an eviction or a failed re-verification
	// would take it): the next wake can only read the cold tier.
	// A mutating call of the node agent needs the release's caller token
	// (the API server's pod proxy would not pass it on: it takes the
	// Authorization header for itself), so the test calls the agent's pod
	// directly, as the dispatcher's leader does.
	agent := stackPod(ctx, t, ns, name, "checkpoint-agent", 0)
	artifact := name + "-" + app
	sec, err := env.cs.CoreV1().Secrets(ns).Get(ctx, name+"-agent-caller", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the caller token Secret: %v", err)
	}
	del, err := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+net.JoinHostPort(agent.Status.PodIP, "9301")+"/tiers/warm/"+ns+"/"+artifact, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodeapi.Authorize(del, string(sec.Data["token"]))
	resp, err := http.DefaultClient.Do(del)
	if err != nil {
		t.Fatalf("removing the warm copy %s/%s from node agent %s: %v", ns, artifact, agent.Name, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("removing the warm copy %s/%s from node agent %s: HTTP %d", ns, artifact, agent.Name, resp.StatusCode)
	}
	waitAsleep(ctx, t, ns, name, root.Name, func(tier v1alpha1.Tier) bool { return tier == v1alpha1.TierCold })
	logf("resident tier Cold")

	dispatcher := stackPod(ctx, t, ns, name, "dispatcher", 0)
	mo, err := stack.Get(ctx, env.dyn, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	wakes := mo.Status.Applications[app].Lifecycle.Wakes
	type answer struct {
		res *stack.ChatResult
		err error
	}
	done := make(chan answer, 1)
	sent := time.Now()
	go func() {
		res, err := stack.StreamChat(ctx, base, token, served, "wake up from the cold tier", 8, nil)
		done <- answer{res, err}
	}()
	// Kill both while the (15 s) wake runs.
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
	logf("waking; killing the node agent %s and the dispatcher %s", agent.Name, dispatcher.Name)
	killContainer(ctx, t, ns, agent, "agent")
	killContainer(ctx, t, ns, dispatcher, "dispatcher")

	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		t.Fatal("the chat sent to the sleeping engine was not answered before the test's deadline")
	}
	if a.err == nil && (!a.res.Done || a.res.FinishReason == "") {
		a.err = fmt.Errorf("stream cut: done %v, finish_reason %q after %d chunks", a.res.Done, a.res.FinishReason, a.res.Chunks)
	}
	if a.err != nil {
		t.Fatalf("the chat that woke the engine through the kills was not answered completely: %v", a.err)
	}
	logf("the chat was answered completely after %.1fs", time.Since(sent).Seconds())

	lw := checkVerifiedWake(ctx, t, ns, name, root.Name, wakes, weights, v1alpha1.TierCold, nil).LastWake
	logf("lastWake: from %s, %d bytes in %ss", lw.FromTier, lw.Bytes, lw.Seconds)
	// The kills happened and the killed components came back.
	for _, k := range []struct{ pod, container string }{{agent.Name, "agent"}, {dispatcher.Name, "dispatcher"}} {
		eventually(t, 90*time.Second, func() error {
			p, err := env.cs.CoreV1().Pods(ns).Get(ctx, k.pod, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == k.container && s.RestartCount >= 1 && s.Ready {
					return nil
				}
			}
			return fmt.Errorf("container %s of %s has not restarted and become ready: %+v", k.container, k.pod, p.Status.ContainerStatuses)
		})
	}
	wantRootKept(ctx, t, ns, root, "the kills around the wake must not reach the engine")
	logf("done")
}

// wantRootKept checks that the root pod is still root (a wake keeps the
// pod) and that none of its containers restarted; why says what must not
// have reached the engine.
func wantRootKept(ctx context.Context, t *testing.T, ns string, root *corev1.Pod, why string) {
	t.Helper()
	p, err := env.cs.CoreV1().Pods(ns).Get(ctx, root.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != root.UID {
		t.Errorf("root pod %s was replaced: a wake must keep the pod", root.Name)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("container %s of root %s restarted %d times: %s", s.Name, root.Name, s.RestartCount, why)
		}
	}
}

// sleepySimulator is simulatorResource with a lifecycle instead of a fixed
// replica count, the simulator's args (its weights, faults and timings)
// and, when memRequest is set, 50m of CPU and memRequest (limit memLimit)
// of memory.
func sleepySimulator(t *testing.T, ns, name string, args []string, memRequest, memLimit string, lifecycle map[string]any) *unstructured.Unstructured {
	t.Helper()
	obj := simulatorResource(t, ns, name)
	unstructured.RemoveNestedField(obj.Object, "spec", "applications", app, "scaling")
	must(t, unstructured.SetNestedStringSlice(obj.Object, args, "spec", "applications", app, "runtime", "args"))
	if memRequest != "" {
		must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
			"requests": map[string]any{"cpu": "50m", "memory": memRequest},
			"limits":   map[string]any{"memory": memLimit},
		}, "spec", "applications", app, "runtime", "resources"))
	}
	must(t, unstructured.SetNestedMap(obj.Object, lifecycle, "spec", "applications", app, "lifecycle"))
	return obj
}
