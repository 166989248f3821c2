package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
)

// TestSeatGroupServesFromTwoPods runs config/samples/
// simulator-seatgroup-replicas.yaml on the real-node cluster: alpha, beta
// and gamma (simulators with 16 MiB of weights, equal priority) share a
// seat group of two pods with one seat each. The leader runs the seat
// policy per pod and the dispatchers send an application's requests only
// to the pods where it is awake. Through the gateway, JetStream and the
// dispatchers:
//
//   - start: every engine of a new pod starts awake; each pod comes down to
//     one awake engine;
//   - turns: each application asked in turn, twice; at some point two
//     different applications are awake in the two pods at once;
//   - bursts: four concurrent requests for every application at once,
//     three times.
//
// Every request is answered once and whole; the engines of both pods
// served exactly the requests sent (summed over the pods), and both pods
// served some; no engine refused a request while asleep (none was sent to
// a sleeping engine) or a sleep with requests in flight; no dispatcher
// failed or redelivered a delivery; and the status lists, per application,
// the pods where it holds a seat.
func TestSeatGroupServesFromTwoPods(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-seatreplicas")
	logf := stepLogf(t)
	apps := []string{"alpha", "beta", "gamma"} // in name order: engine i on 8080+i
	port := map[string]string{}
	name, token := applySeatSample(ctx, t, ns, "simulator-seatgroup-replicas.yaml", func(obj *unstructured.Unstructured) {
		for i, app := range apps {
			port[app] = strconv.Itoa(8080 + i)
			must(t, unstructured.SetNestedField(obj.Object, int64(0), "spec", "applications", app, "lifecycle", "seat", "priority"))
			must(t, unstructured.SetNestedField(obj.Object, "1s", "spec", "applications", app, "lifecycle", "seat", "minResidency"))
		}
	})
	logf("Ready")

	groupSel := "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=seat-group,modelorchestra.io/seat-group=accel"
	list, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: groupSel})
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, p := range list.Items {
		pods = append(pods, p.Name)
		if n := len(p.Spec.Containers); n != 2*len(apps) {
			t.Errorf("group pod %s has %d containers, want an engine and a seat for each of %d applications", p.Name, n, len(apps))
		}
	}
	slices.Sort(pods)
	if len(pods) != 2 {
		t.Fatalf("seat group accel runs pods %v, want 2", pods)
	}

	status := func() (map[string]v1alpha1.ApplicationStatus, error) { return appStatuses(ctx, ns, name) }
	// holders maps each pod to the applications holding a seat in it, as
	// the status says.
	holders := func(st map[string]v1alpha1.ApplicationStatus) map[string][]string {
		out := map[string][]string{}
		for _, app := range apps {
			if lc := st[app].Lifecycle; lc != nil && lc.Seat != nil {
				for _, p := range lc.Seat.Pods {
					out[p] = append(out[p], app)
				}
			}
		}
		return out
	}
	// Two applications awake in two pods at once, as the status showed.
	var mu sync.Mutex
	var spread string
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Go(func() {
		for watchCtx.Err() == nil {
			if st, err := status(); err == nil {
				h := holders(st)
				if len(h[pods[0]]) == 1 && len(h[pods[1]]) == 1 && h[pods[0]][0] != h[pods[1]][0] {
					mu.Lock()
					spread = fmt.Sprintf("%v", h)
					mu.Unlock()
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	defer func() { stopWatch(); watch.Wait() }()

	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	chats := newSeatChats(ctx, base, token)
	ask := func(app string) { chats.ask(app, 16) }
	wantAllAnswered, sent := chats.wantAllAnswered, chats.sent
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, "alpha", chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
	// The engines' counts from here on: the first chat may have been
	// retried before the gateway was reachable.
	served := func() map[string]map[string]float64 {
		out := map[string]map[string]float64{}
		for _, pod := range pods {
			out[pod] = map[string]float64{}
			for _, app := range apps {
				m, err := scrape(ctx, ns, pod, port[app])
				if err != nil {
					t.Fatal(err)
				}
				out[pod][app] = metricValue(m, "vllm:request_success_total")
			}
		}
		return out
	}
	baseline := served()
	failedBefore := seatDeliveryFailures(ctx, t, ns, apps)

	t.Run("start", func(t *testing.T) {
		eventually(t, time.Minute, func() error {
			st, err := status()
			if err != nil {
				return err
			}
			h := holders(st)
			for _, pod := range pods {
				if len(h[pod]) != 1 {
					return fmt.Errorf("pod %s: holders %v, want one; status %s", pod, h[pod], jsonOf(st))
				}
			}
			return nil
		})
		logf("each pod holds one seat")
	})

	t.Run("turns", func(t *testing.T) {
		began := time.Now()
		for range 2 {
			for _, app := range apps {
				ask(app)
			}
		}
		wantAllAnswered(t)
		logf("turns: %d chats in %.1fs", 2*len(apps), time.Since(began).Seconds())
	})

	t.Run("bursts", func(t *testing.T) {
		began := time.Now()
		for range 3 {
			var wg sync.WaitGroup
			for _, app := range apps {
				for range 4 {
					wg.Go(func() { ask(app) })
				}
			}
			wg.Wait()
		}
		wantAllAnswered(t)
		logf("bursts: %d chats in %.1fs", 3*4*len(apps), time.Since(began).Seconds())
	})
	stopWatch()
	watch.Wait()

	mu.Lock()
	if spread == "" {
		t.Error("the status never showed two different applications awake in the two pods at once")
	} else {
		logf("two pods served two applications at once: %s", spread)
	}
	mu.Unlock()

	after := served()
	perPod := map[string]float64{}
	for _, app := range apps {
		total := 0.0
		for _, pod := range pods {
			n := after[pod][app] - baseline[pod][app]
			total += n
			perPod[pod] += n
			m, err := scrape(ctx, ns, pod, port[app])
			if err != nil {
				t.Fatal(err)
			}
			if n := metricValue(m, "orchestra_sim_requests_refused_asleep_total"); n != 0 {
				t.Errorf("%s's engine in %s refused %g requests: one was sent to it while it slept", app, pod, n)
			}
			if n := metricValue(m, "orchestra_sim_sleeps_total", `result="refused"`); n != 0 {
				t.Errorf("%s's engine in %s refused %g sleeps: one reached it with requests in flight", app, pod, n)
			}
		}
		if total != float64(sent[app]) {
			t.Errorf("the engines of %s served %g requests in all, %d were sent: each must be served exactly once", app, total, sent[app])
		}
	}
	for _, pod := range pods {
		if perPod[pod] == 0 {
			t.Errorf("pod %s served no request; both pods must be used (per pod: %v)", pod, perPod)
		}
	}
	logf("requests served per pod: %v; sent per application: %v", perPod, sent)
	if grew := grown(failedBefore, seatDeliveryFailures(ctx, t, ns, apps)); len(grew) > 0 {
		t.Errorf("the dispatchers failed or redelivered deliveries:\n%s", strings.Join(grew, "\n"))
	}
	st, err := status()
	if err != nil {
		t.Fatal(err)
	}
	for _, app := range apps {
		seat := st[app].Lifecycle.Seat
		if seat == nil {
			t.Errorf("%s: no lifecycle.seat in its status", app)
			continue
		}
		for _, p := range seat.Pods {
			if !slices.Contains(pods, p) {
				t.Errorf("%s: lifecycle.seat.pods names %s, not a pod of the group %v", app, p, pods)
			}
		}
		if seat.Holding != (len(seat.Pods) > 0) {
			t.Errorf("%s: lifecycle.seat.holding %v but pods %v", app, seat.Holding, seat.Pods)
		}
	}
}
