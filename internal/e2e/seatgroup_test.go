package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
)

// TestSeatGroupPodServesEveryApplication runs config/samples/
// simulator-seatgroup.yaml, three simulator applications of one seat group
// with 32 MiB of weights each and one seat, on real pods: the group runs as
// one pod with an engine and a seat agent per application, each
// application's EndpointSlice leads to its own engine's port in that pod,
// and the dispatcher's lifecycle leader keeps one engine awake. Streamed
// chats to each application in turn, through the gateway, JetStream and
// the dispatcher, are all answered whole by the engine serving that model
// (a simulator refuses any other model's name), each turn swapping the
// seat: the status says who holds it and counts each application's swaps,
// no engine refused a request or a sleep (none was sent one while asleep,
// none was put to sleep with requests in flight), and every wake verified
// its weights. The sample's minResidency (10s) is shortened to 2s to bound
// the test's time.
func TestSeatGroupPodServesEveryApplication(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-seatgroup")
	start := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("[%3.0fs] "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}

	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}
	obj, err := stack.LoadResource(filepath.Join(env.root, "config", "samples", "simulator-seatgroup.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj.SetNamespace(ns)
	must(t, stack.MirrorModel(obj, env.hub))
	must(t, unstructured.SetNestedField(obj.Object, "NodePort", "spec", "gateway", "service", "type"))
	name := obj.GetName()
	apps := []string{"alpha", "beta", "gamma"} // in name order: engine i on 8080+i
	for _, app := range apps {
		must(t, unstructured.SetNestedField(obj.Object, "2s", "spec", "applications", app, "lifecycle", "seat", "minResidency"))
	}
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	logf("Ready")

	groupSel := "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=seat-group,modelorchestra.io/seat-group=accel"
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: groupSel})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods of seat group accel, want 1", len(pods.Items))
	}
	group := pods.Items[0]
	if n := len(group.Spec.Containers); n != 2*len(apps) {
		t.Errorf("group pod %s has %d containers, want an engine and a seat for each of %d applications", group.Name, n, len(apps))
	}
	roots, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=root"})
	if err != nil {
		t.Fatal(err)
	}
	if len(roots.Items) != 0 {
		t.Errorf("%d root pods run besides the group pod; want none", len(roots.Items))
	}

	for i, app := range apps {
		wantPort := int32(8080 + i)
		eventually(t, time.Minute, func() error {
			slices, err := env.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name + "-" + app})
			if err != nil {
				return err
			}
			for _, es := range slices.Items {
				for _, p := range es.Ports {
					if p.Name == nil || *p.Name != "http" || p.Port == nil || *p.Port != wantPort {
						continue
					}
					for _, ep := range es.Endpoints {
						if ep.TargetRef != nil && ep.TargetRef.Name == group.Name && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
							return nil
						}
					}
				}
			}
			return fmt.Errorf("no ready endpoint %s:%d (http) in the EndpointSlices of %s-%s: %+v", group.Name, wantPort, name, app, slices.Items)
		})
	}

	// The leader brings the group within its one seat: alpha, the
	// highest priority, keeps it.
	holders := func() ([]string, map[string]v1alpha1.ApplicationStatus, error) {
		mo, err := stack.Get(ctx, env.dyn, ns, name)
		if err != nil {
			return nil, nil, err
		}
		var h []string
		for _, app := range apps {
			if lc := mo.Status.Applications[app].Lifecycle; lc != nil && lc.Seat != nil && lc.Seat.Holding {
				h = append(h, app)
			}
		}
		return h, mo.Status.Applications, nil
	}
	wantHolder := func(app string) {
		t.Helper()
		eventually(t, time.Minute, func() error {
			h, st, err := holders()
			if err != nil {
				return err
			}
			if len(h) != 1 || h[0] != app {
				return fmt.Errorf("holders %v, want only %s; status %s", h, app, jsonOf(st))
			}
			for _, other := range apps {
				if other != app && st[other].Phase != v1alpha1.PhaseAsleep {
					return fmt.Errorf("%s has phase %s, want Asleep while %s holds the seat", other, st[other].Phase, app)
				}
			}
			return nil
		})
	}
	wantHolder("alpha")
	logf("alpha holds the seat; beta and gamma are Asleep")

	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, apps[0], chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
	// Each application in turn, three rounds: every answer whole.
	for round := range 3 {
		for _, app := range apps {
			res, err := stack.StreamChat(ctx, base, token, app, chatPrompt, 16, nil)
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, app, err)
			}
			if !res.Done || res.FinishReason == "" || res.Chunks == 0 {
				t.Errorf("round %d, %s: answer cut: %+v", round, app, res)
			}
		}
	}
	logf("%d chats answered", 3*len(apps)+1)
	wantHolder("gamma") // the last turn's

	_, st, err := holders()
	if err != nil {
		t.Fatal(err)
	}
	for i, app := range apps {
		seat := st[app].Lifecycle.Seat
		// alpha held the seat for the first turn; every later turn, and
		// each of beta's and gamma's in every round, was a swap.
		if seat == nil || seat.SwapsIn < 2 {
			t.Errorf("%s: lifecycle.seat %s, want at least 2 swaps in", app, jsonOf(seat))
			continue
		}
		if secs, err := strconv.ParseFloat(seat.LastSwapSeconds, 64); err != nil || secs <= 0 {
			t.Errorf("%s: lastSwapSeconds %q, want a positive number", app, seat.LastSwapSeconds)
		}
		m, err := scrape(ctx, ns, group.Name, strconv.Itoa(8080+i))
		if err != nil {
			t.Fatal(err)
		}
		if n := metricValue(m, "orchestra_sim_requests_refused_asleep_total"); n != 0 {
			t.Errorf("%s's engine refused %g requests: one was sent to it while it slept", app, n)
		}
		if n := metricValue(m, "orchestra_sim_sleeps_total", `result="refused"`); n != 0 {
			t.Errorf("%s's engine refused %g sleeps: one reached it with requests in flight", app, n)
		}
		if n := metricValue(m, "orchestra_sim_wakes_total", `result="mismatch"`); n != 0 {
			t.Errorf("%s's engine: %g wakes failed the hash verification", app, n)
		}
		if n := metricValue(m, "orchestra_sim_wakes_total", `result="ok"`); n < float64(seat.SwapsIn) {
			t.Errorf("%s's engine counted %g verified wakes for %d swaps in", app, n, seat.SwapsIn)
		}
		t.Logf("%s: %d swaps in, the last %ss", app, seat.SwapsIn, seat.LastSwapSeconds)
	}

	p, err := env.cs.CoreV1().Pods(ns).Get(ctx, group.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != group.UID {
		t.Errorf("group pod %s was replaced", group.Name)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			t.Errorf("container %s of the group pod restarted %d times (last: %+v)", s.Name, s.RestartCount, s.LastTerminationState.Terminated)
		}
		if !s.Ready {
			t.Errorf("container %s of the group pod is not ready", s.Name)
		}
	}
}
