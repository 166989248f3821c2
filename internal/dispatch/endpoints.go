package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

// watchEndpoints keeps the pools of Service-backed applications in sync with
// their EndpointSlices (label kubernetes.io/service-name). It returns once
// the informer has synced; updates continue until ctx ends.
func watchEndpoints(ctx context.Context, cs kubernetes.Interface, namespace string, apps []App, views map[string]*rootView) error {
	byService := map[string][]App{}
	var services []string
	for _, a := range apps {
		if len(a.Endpoints) > 0 || a.Service == "" {
			continue
		}
		if _, ok := byService[a.Service]; !ok {
			services = append(services, a.Service)
		}
		byService[a.Service] = append(byService[a.Service], a)
	}
	if len(services) == 0 {
		return nil
	}
	req, err := labels.NewRequirement(discoveryv1.LabelServiceName, selection.In, services)
	if err != nil {
		return fmt.Errorf("building EndpointSlice selector: %w", err)
	}
	selector := labels.NewSelector().Add(*req)
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector.String() }))
	inf := factory.Discovery().V1().EndpointSlices()
	lister := inf.Lister()

	sync := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		es, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		svc := es.Labels[discoveryv1.LabelServiceName]
		slices, err := lister.EndpointSlices(namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc}))
		if err != nil {
			return // the lister reads the informer's cache: it does not fail
		}
		for _, a := range byService[svc] {
			views[a.Name].setSlice(rootURLs(slices, a))
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sync,
		UpdateFunc: func(_, obj any) { sync(obj) },
		DeleteFunc: sync,
	}); err != nil {
		return fmt.Errorf("watching EndpointSlices: %w", err)
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("syncing %v informer: %w", typ, ctx.Err())
		}
	}
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	return nil
}

// rootURLs returns the base URLs of the ready endpoints in slices.
func rootURLs(slices []*discoveryv1.EndpointSlice, a App) []string {
	seen := map[string]bool{}
	var out []string
	for _, es := range slices {
		port := a.Port
		for _, p := range es.Ports {
			if a.PortName != "" && p.Name != nil && *p.Name == a.PortName && p.Port != nil {
				port = *p.Port
			}
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
				continue
			}
			for _, addr := range ep.Addresses {
				u := "http://" + net.JoinHostPort(strings.TrimSpace(addr), strconv.Itoa(int(port)))
				if !seen[u] {
					seen[u] = true
					out = append(out, u)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// rootView is an application's roots from its two sources: the ready,
// non-terminating endpoints of its Service's EndpointSlices, and, for an
// application with a lifecycle, its root pods as the lifecycle's cache
// shows them. A pod's Ready condition and its deletion reach the
// dispatcher a controller hop (tens of milliseconds) before the
// EndpointSlice follows them: the first request of a wake goes to the new
// root that much sooner, and a terminating root gets no request after its
// pod says so.
type rootView struct {
	app  App
	pool *pool
	log  *slog.Logger
	// warm, when set, opens a connection to a root that joined (a health
	// check whose connection stays in the engines' idle pool), so that
	// the first request to a woken root does not dial.
	warm func(url string)

	// seat: the application is a member of a seat group, whose pods run
	// its engine awake or asleep: its roots are the EndpointSlices' roots
	// on the pods that serve it (seatIPs, from the lifecycle's SeatPods),
	// and none until the lifecycle told which.
	seat bool

	mu      sync.Mutex
	slice   []string
	pods    map[string]bool // nil: no pod view
	seatIPs map[string]bool // the addresses of the seat pods serving it
	last    []string
}

// setSlice takes the roots the EndpointSlices list.
func (v *rootView) setSlice(urls []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.slice = urls
	v.applyLocked("endpointslice")
}

// setPods takes the application's root pods.
func (v *rootView) setPods(pods []lifecycle.RootPod) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pods = podRoots(pods, v.app)
	v.applyLocked("pods")
}

// setSeatPods takes the pods of the application's seat group.
func (v *rootView) setSeatPods(pods []lifecycle.SeatPod) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seatIPs = map[string]bool{}
	for _, p := range pods {
		if p.Serves && p.Pod.Status.PodIP != "" {
			v.seatIPs[p.Pod.Status.PodIP] = true
		}
	}
	v.applyLocked("seat pods")
}

func (v *rootView) applyLocked(source string) {
	urls := mergeRoots(v.slice, v.pods)
	if v.seat {
		urls = seatRoots(v.slice, v.seatIPs)
	}
	if slices.Equal(urls, v.last) {
		return
	}
	if v.warm != nil {
		for _, u := range urls {
			if !slices.Contains(v.last, u) {
				go v.warm(u)
			}
		}
	}
	v.last = urls
	v.pool.set(urls)
	v.log.Info("engine roots changed", "app", v.app.Name, "roots", urls, "source", source)
}

// podRoots maps the URL of every root pod with an address (its IP and the
// container port named app.PortName, else app.Port: what the Service
// targets) to whether it serves (as the lifecycle judged it).
func podRoots(pods []lifecycle.RootPod, app App) map[string]bool {
	out := make(map[string]bool, len(pods))
	for _, r := range pods {
		p := r.Pod
		if p.Status.PodIP == "" {
			continue
		}
		port := app.Port
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if app.PortName != "" && cp.Name == app.PortName {
					port = cp.ContainerPort
				}
			}
		}
		out["http://"+net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))] = r.Serves
	}
	return out
}

// mergeRoots is an application's roots: the serving pods, and the
// EndpointSlices' roots that are no known pod's (without a pod view, nil
// pods, the EndpointSlices' alone). A pod the view knows is judged by the
// pod alone, which the EndpointSlice only follows.
func mergeRoots(slice []string, pods map[string]bool) []string {
	if pods == nil {
		return slice
	}
	var out []string
	for u, serves := range pods {
		if serves {
			out = append(out, u)
		}
	}
	for _, u := range slice {
		if _, known := pods[u]; !known {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// seatRoots is a seat group member's roots: the EndpointSlices' roots
// whose address is one of a pod that serves it (ips). The EndpointSlice
// lists every group pod whatever its engines do; the lifecycle leader
// says where the application is awake.
func seatRoots(slice []string, ips map[string]bool) []string {
	var out []string
	for _, u := range slice {
		host, _, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
		if err == nil && ips[host] {
			out = append(out, u)
		}
	}
	return out
}
