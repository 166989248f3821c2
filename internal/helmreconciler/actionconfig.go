package helmreconciler

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/kube"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/resource"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
)

// capabilitiesTTL is how long the cluster's version and API list are reused
// for rendering before they are discovered again.
const capabilitiesTTL = time.Minute

// actionConfigs builds Helm action configurations for custom resources. The
// REST plumbing, kube clients and capabilities are shared; the release
// storage is per resource (it carries the owner reference).
type actionConfigs struct {
	getter    *restClientGetter
	prefetch  *prefetcher
	clientset kubernetes.Interface
	chunkSize int
	labels    map[string]string

	chunks sync.Map // release Secret -> number of chunks written

	mu          sync.Mutex
	kubeClients map[string]reachableClient
	caps        *chartutil.Capabilities
	capsAt      time.Time
}

func newActionConfigs(cfg *rest.Config, mapper meta.RESTMapper, chunkSize int, secretLabels map[string]string) (*actionConfigs, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building clientset: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building discovery client: %w", err)
	}
	pf, err := newPrefetcher(cfg)
	if err != nil {
		return nil, err
	}
	helmCfg := rest.CopyConfig(cfg)
	helmCfg.Wrap(pf.wrap)
	return &actionConfigs{
		prefetch:    pf,
		getter:      &restClientGetter{cfg: helmCfg, mapper: mapper, discovery: memory.NewMemCacheClient(dc)},
		clientset:   cs,
		chunkSize:   chunkSize,
		labels:      secretLabels,
		kubeClients: map[string]reachableClient{},
	}, nil
}

// forResource returns the configuration for obj's release.
func (a *actionConfigs) forResource(obj *unstructured.Unstructured, log action.DebugLog) (*action.Configuration, error) {
	return a.forReconcile(obj, log, actionOptions{})
}

// actionOptions adjust the configuration of one reconcile's Helm actions.
type actionOptions struct {
	// beforeWrite, when set, is waited for before the first object is
	// created or updated (the finalizer patch): it runs while Helm reads
	// the history, renders and stores the pending release.
	beforeWrite func() error
	// noHistory says the cache holds no release Secret of the resource and
	// this process wrote none: the history is empty, and it is not listed
	// from the API server. Should it be wrong (a stale cache, another
	// writer), storing revision 1 fails with driver.ErrReleaseExists before
	// any object is written, and the next reconcile lists the history.
	noHistory bool
	// stored, when set, is told of each release record Helm creates,
	// before it is written.
	stored func(*release.Release)
	// background, when set, receives the update that records a release
	// deployed (see releaseSecrets.background).
	background *backgroundWrites
	// forms, when set, receives the API server's answers to the objects
	// the action creates.
	forms *serverForms
}

// forReconcile returns the configuration for obj's release, adjusted by o.
func (a *actionConfigs) forReconcile(obj *unstructured.Unstructured, log action.DebugLog, o actionOptions) (*action.Configuration, error) {
	caps, err := a.capabilities()
	if err != nil {
		return nil, err
	}
	ns := obj.GetNamespace()
	secrets := &releaseSecrets{
		SecretInterface: a.clientset.CoreV1().Secrets(ns),
		labels:          a.labels,
		chunkSize:       a.chunkSize,
		chunks:          &a.chunks,
		owner: &metav1.OwnerReference{
			APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Name: obj.GetName(), UID: obj.GetUID(),
			Controller: ptr(true), BlockOwnerDeletion: ptr(false),
		},
	}
	secrets.background = o.background
	if o.noHistory {
		secrets.lists.put(metav1.ListOptions{LabelSelector: releaseSelector(obj.GetName()).String()}, &corev1.SecretList{})
	}
	d := newReleaseDriver(secrets, log)
	d.stored = o.stored
	store := storage.Init(d)
	store.Log = log
	rc := a.kubeClient(ns, log)
	var kc kube.Interface = rc
	if o.beforeWrite != nil || o.forms != nil {
		kc = gatedClient{reachableClient: rc, gate: o.beforeWrite, forms: o.forms}
	}
	return &action.Configuration{
		RESTClientGetter: a.getter,
		KubeClient:       kc,
		Releases:         store,
		Capabilities:     caps,
		Log:              log,
	}, nil
}

func (a *actionConfigs) kubeClient(ns string, log action.DebugLog) reachableClient {
	a.mu.Lock()
	defer a.mu.Unlock()
	if kc, ok := a.kubeClients[ns]; ok {
		return kc
	}
	kc := kube.New(a.getter)
	kc.Namespace = ns
	kc.Log = log
	a.kubeClients[ns] = reachableClient{kc}
	return a.kubeClients[ns]
}

// reachableClient is Helm's kube client without the reachability probe
// (a GET /version) that Helm makes before every action: the operator's
// watches already tell that the API server answers, and the action's own
// requests report any error. It keeps every other method of kube.Client.
type reachableClient struct{ *kube.Client }

func (reachableClient) IsReachable() error { return nil }

// Create creates resources as Helm does, but without waiting for one kind
// to be created before starting the next: a ConfigMap and a Deployment are
// one round trip, not two. Kinds that others may need at admission
// (namespaces, CRDs, quotas, ...) are still created first, in Helm's order.
// Objects that others reference at admission are created in a wave before
// the rest: a RoleBinding is checked against its Role (the API server
// refuses a binding to a Role it cannot find unless the writer may bind
// anything) and a bare Pod against its ServiceAccount.
func (c reachableClient) Create(resources kube.ResourceList) (*kube.Result, error) {
	var referenced, rest kube.ResourceList
	helmOrder := len(resources) <= 1
	for _, info := range resources {
		switch kind := info.Mapping.GroupVersionKind.Kind; {
		case createFirst[kind]:
			helmOrder = true
		case createReferenced[kind]:
			referenced = append(referenced, info)
		default:
			rest = append(rest, info)
		}
	}
	if helmOrder {
		if _, err := c.Client.Create(resources); err != nil {
			return nil, err
		}
		return &kube.Result{Created: resources}, nil
	}
	for _, wave := range []kube.ResourceList{referenced, rest} {
		if err := createAtOnce(wave); err != nil {
			return nil, err
		}
	}
	return &kube.Result{Created: resources}, nil
}

// createAtOnce creates every object of wave concurrently.
func createAtOnce(wave kube.ResourceList) error {
	errs := make([]error, len(wave))
	var wg sync.WaitGroup
	for i, info := range wave {
		wg.Go(func() { errs[i] = createResource(info) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// createFirst are kinds whose objects may change how the API server admits
// the others; a release that has any is created in Helm's order.
var createFirst = map[string]bool{
	"Namespace": true, "CustomResourceDefinition": true, "APIService": true,
	"ResourceQuota": true, "LimitRange": true, "PriorityClass": true,
	"MutatingWebhookConfiguration": true, "ValidatingWebhookConfiguration": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true,
}

// createReferenced are kinds that other objects of a release name and that
// the API server looks up when it admits them: Roles and ClusterRoles
// (bindings, escalation check) and ServiceAccounts (Pods). They are created
// in a wave before everything else.
var createReferenced = map[string]bool{
	"ServiceAccount": true, "Role": true, "ClusterRole": true,
}

// createResource is Helm's: create, and refresh info from the answer.
func createResource(info *resource.Info) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := resource.NewHelper(info.Client, info.Mapping).WithFieldManager(managedFieldsManager()).Create(info.Namespace, true, info.Object)
		if err != nil {
			return fmt.Errorf("failed to create resource: %w", err)
		}
		return info.Refresh(obj, true)
	})
}

// managedFieldsManager is the field manager Helm writes with.
func managedFieldsManager() string {
	if kube.ManagedFieldsManager != "" {
		return kube.ManagedFieldsManager
	}
	if len(os.Args[0]) == 0 {
		return "unknown"
	}
	return filepath.Base(os.Args[0])
}

// gatedClient waits for gate (when set) before Helm creates or changes any
// object, and keeps the server's answers in forms (when set).
type gatedClient struct {
	reachableClient
	gate  func() error
	forms *serverForms
}

func (c gatedClient) Create(resources kube.ResourceList) (*kube.Result, error) {
	if c.gate != nil {
		if err := c.gate(); err != nil {
			return nil, err
		}
	}
	res, err := c.reachableClient.Create(resources)
	// Also after an error: the objects created before it are the
	// action's, for its purge (record keeps only created ones).
	c.forms.record(resources)
	return res, err
}

func (c gatedClient) Delete(resources kube.ResourceList) (*kube.Result, []error) {
	return c.reachableClient.Delete(c.forms.deletable(resources))
}

func (c gatedClient) DeleteWithPropagationPolicy(resources kube.ResourceList, policy metav1.DeletionPropagation) (*kube.Result, []error) {
	return c.reachableClient.DeleteWithPropagationPolicy(c.forms.deletable(resources), policy)
}

func (c gatedClient) Update(original, target kube.ResourceList, force bool) (*kube.Result, error) {
	if c.gate != nil {
		if err := c.gate(); err != nil {
			return nil, err
		}
	}
	// The answers to an update are not kept: Helm's three-way patch
	// leaves alone a field another writer changed while the chart did
	// not, so an answer may hold drift.
	return c.reachableClient.Update(original, target, force)
}

// serverForms are the API server's answers to the objects one Helm action
// created: the objects as the server stored them, before any
// other writer changed them. Comparing later reads with the server's form
// of the manifest, not the manifest itself, keeps zero values the server
// leaves out and defaults it fills in from looking like drift, without the
// apply that would otherwise be needed to learn that form.
type serverForms struct {
	mu   sync.Mutex
	objs map[objectKey]*unstructured.Unstructured
	// onlyCreated limits the action's deletes to the objects it created
	// (the purge of a failed install).
	onlyCreated bool
}

// deleteOnlyCreated limits the action's later deletes to the objects it
// created.
func (s *serverForms) deleteOnlyCreated() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onlyCreated = true
}

// deletable returns the objects of list the action may delete: all of
// them, unless deleteOnlyCreated was called; then those it created. A nil
// receiver allows all.
func (s *serverForms) deletable(list kube.ResourceList) kube.ResourceList {
	if s == nil {
		return list
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.onlyCreated {
		return list
	}
	out := make(kube.ResourceList, 0, len(list))
	for _, info := range list {
		key := objectKey{GVK: info.Mapping.GroupVersionKind, Namespace: info.Namespace, Name: info.Name}
		if _, ok := s.objs[key]; ok {
			out = append(out, info)
		}
	}
	return out
}

// record keeps the answers in list; a nil receiver keeps nothing.
func (s *serverForms) record(list kube.ResourceList) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objs == nil {
		s.objs = map[objectKey]*unstructured.Unstructured{}
	}
	for _, info := range list {
		if u, ok := info.Object.(*unstructured.Unstructured); ok && u.GetResourceVersion() != "" {
			s.objs[keyOf(u)] = u
		}
	}
}

// get returns the server's answer for key, if the action wrote it.
func (s *serverForms) get(key objectKey) (*unstructured.Unstructured, bool) {
	if s == nil {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.objs[key]
	return u, ok
}

// capabilities returns the cluster's capabilities, rediscovered at most
// once per capabilitiesTTL.
func (a *actionConfigs) capabilities() (*chartutil.Capabilities, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.caps != nil && time.Since(a.capsAt) < capabilitiesTTL {
		return a.caps, nil
	}
	dc := a.getter.discovery
	dc.Invalidate()
	sv, err := dc.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("discovering the Kubernetes version: %w", err)
	}
	apiVersions, err := action.GetVersionSet(dc)
	if err != nil {
		return nil, fmt.Errorf("discovering the cluster's API versions: %w", err)
	}
	a.caps = &chartutil.Capabilities{
		KubeVersion: chartutil.KubeVersion{Version: sv.GitVersion, Major: sv.Major, Minor: sv.Minor},
		APIVersions: apiVersions,
		HelmVersion: chartutil.DefaultCapabilities.HelmVersion,
	}
	a.capsAt = time.Now()
	return a.caps, nil
}

// restClientGetter gives Helm the operator's REST config, its REST mapper
// and a cached discovery client.
type restClientGetter struct {
	cfg       *rest.Config
	mapper    meta.RESTMapper
	discovery discovery.CachedDiscoveryInterface
}

var _ genericclioptions.RESTClientGetter = (*restClientGetter)(nil)

func (g *restClientGetter) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(g.cfg), nil }

func (g *restClientGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return g.discovery, nil
}

func (g *restClientGetter) ToRESTMapper() (meta.RESTMapper, error) { return g.mapper, nil }

func (g *restClientGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return clientcmd.NewDefaultClientConfig(*clientcmdapi.NewConfig(), &clientcmd.ConfigOverrides{})
}

func ptr[T any](v T) *T { return &v }
