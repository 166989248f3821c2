package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// watchEndpoints keeps the pools of Service-backed applications in sync with
// their EndpointSlices (label kubernetes.io/service-name). It returns once
// the informer has synced; updates continue until ctx ends.
func watchEndpoints(ctx context.Context, cs kubernetes.Interface, namespace string, apps []App, pools map[string]*pool, log *slog.Logger) error {
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
			log.Error("listing EndpointSlices", "service", svc, "err", err)
			return
		}
		for _, a := range byService[svc] {
			urls := rootURLs(slices, a)
			pools[a.Name].set(urls)
			log.Info("engine roots changed", "app", a.Name, "service", svc, "roots", urls)
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
