package lifecycle

// The sidecars: the one place the leader calls the per-engine sidecars
// (orchestra-agent --role=sidecar; wire types and client in
// internal/sidecarapi), for an application's roots (sleepAfter: sleep.go,
// sleep_park.go, step.go) and for the members of a seat group in each
// group pod (podSidecar, seatgroup_pod.go). Every call goes through
// callSidecar: one HTTP client, the release's caller token, the pod named
// in its error; onSidecars fans one call out to several sidecars at once.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// sidecarHTTP is the sidecars' client; every call carries its own
// deadline. A seat group's executor calls the same few sidecars every
// tick, so it keeps a few idle connections per sidecar.
var sidecarHTTP = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 4
	return &http.Client{Transport: t}
}()

// sidecarRef is one pod's sidecar (of an application's root, or of one
// member in a seat group's pod).
type sidecarRef struct {
	pod *corev1.Pod
	url string
}

// sidecarOf is the sidecar listening on port in pod, which has an address.
func sidecarOf(pod *corev1.Pod, port int32) sidecarRef {
	return sidecarRef{pod: pod, url: "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port)))}
}

// sidecarResult is one sidecar's answer.
type sidecarResult struct {
	sidecarRef
	st  sidecarapi.Status
	err error
}

// sidecarCall is one call of the sidecar's client that answers its status.
type sidecarCall func(ctx context.Context, c sidecarapi.Client) (sidecarapi.Status, error)

// getState, sleepAt, wake and restart are the calls the leader makes.
func getState(ctx context.Context, c sidecarapi.Client) (sidecarapi.Status, error) {
	return c.State(ctx)
}

func sleepAt(level int) sidecarCall {
	return func(ctx context.Context, c sidecarapi.Client) (sidecarapi.Status, error) {
		return c.SleepStatus(ctx, level)
	}
}

func wake(ctx context.Context, c sidecarapi.Client) (sidecarapi.Status, error) {
	return c.WakeStatus(ctx)
}

// restart answers no status: the sidecar answers asleep once the engine
// restarted.
func restart(ctx context.Context, c sidecarapi.Client) (sidecarapi.Status, error) {
	return sidecarapi.Status{}, c.Restart(ctx)
}

// callSidecar makes one call on one sidecar, within ctx.
func (c *Controller) callSidecar(ctx context.Context, s sidecarRef, call sidecarCall) (sidecarapi.Status, error) {
	st, err := call(ctx, sidecarapi.Client{URL: s.url, HTTP: sidecarHTTP, Token: nodeapi.TokenFile(c.cfg.AgentTokenFile)})
	if err != nil {
		return st, fmt.Errorf("sidecar of pod %s: %w", s.pod.Name, err)
	}
	return st, nil
}

// onSidecars makes the same call on every sidecar at once, each within
// timeout, and keeps each status.
func (c *Controller) onSidecars(ctx context.Context, sidecars []sidecarRef, call sidecarCall, timeout time.Duration) []sidecarResult {
	out := make([]sidecarResult, len(sidecars))
	var wg sync.WaitGroup
	for i, s := range sidecars {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i] = sidecarResult{sidecarRef: s}
			out[i].st, out[i].err = c.callSidecar(cctx, s, call)
		})
	}
	wg.Wait()
	return out
}

// readStates reads every sidecar's state (GET /state), each within
// v1alpha1.StateCallTimeout.
func (c *Controller) readStates(ctx context.Context, sidecars []sidecarRef) []sidecarResult {
	return c.onSidecars(ctx, sidecars, getState, v1alpha1.StateCallTimeout)
}

// rootSidecars finds the sidecars of the application's root pods: the pods of
// the root StatefulSet's selector that have an address and are not going
// away.
func (c *Controller) rootSidecars(a *appState, root *appsv1.StatefulSet) ([]sidecarRef, error) {
	if root.Spec.Selector == nil {
		return nil, fmt.Errorf("root StatefulSet %s has no selector", root.Name)
	}
	sel, err := metav1.LabelSelectorAsSelector(root.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("root StatefulSet %s selector: %w", root.Name, err)
	}
	pods, err := c.podLister.Pods(c.deps.Namespace).List(sel)
	if err != nil {
		return nil, fmt.Errorf("listing the pods of %s: %w", root.Name, err)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	var out []sidecarRef
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, sidecarOf(p, a.Sleep.SidecarPort))
	}
	return out, nil
}

func failures(res []sidecarResult) []error {
	var errs []error
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	return errs
}

func failedRefs(res []sidecarResult) []sidecarRef {
	var out []sidecarRef
	for _, r := range res {
		if r.err != nil {
			out = append(out, r.sidecarRef)
		}
	}
	return out
}

func refsOf(res []sidecarResult) []sidecarRef {
	out := make([]sidecarRef, len(res))
	for i, r := range res {
		out[i] = r.sidecarRef
	}
	return out
}

// sidecarsNamed returns the sidecars of res whose pods are named in pods.
func sidecarsNamed(res []sidecarResult, pods []string) []sidecarRef {
	var out []sidecarRef
	for _, r := range res {
		for _, p := range pods {
			if r.pod.Name == p {
				out = append(out, r.sidecarRef)
			}
		}
	}
	return out
}

func joinErrs(errs []error) string {
	s := make([]string, len(errs))
	for i, e := range errs {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

// holdsAccelerator reports whether an engine whose sidecar reports s may
// hold its accelerator memory: awake, waking, or on its way to sleep.
func holdsAccelerator(s sidecarapi.State) bool {
	return s == sidecarapi.Awake || s == sidecarapi.Waking || s == sidecarapi.Draining || s == sidecarapi.FallingAsleep
}
