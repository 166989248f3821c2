package helmreconciler

import (
	"fmt"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/kube"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// capabilitiesTTL is how long the cluster's version and API list are reused
// for rendering before they are discovered again.
const capabilitiesTTL = time.Minute

// actionConfigs builds Helm action configurations for custom resources. The
// REST plumbing, kube clients and capabilities are shared; the release
// storage is per resource (it carries the owner reference).
type actionConfigs struct {
	getter    *restClientGetter
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
	return &actionConfigs{
		getter:      &restClientGetter{cfg: cfg, mapper: mapper, discovery: memory.NewMemCacheClient(dc)},
		clientset:   cs,
		chunkSize:   chunkSize,
		labels:      secretLabels,
		kubeClients: map[string]reachableClient{},
	}, nil
}

// forResource returns the configuration for obj's release.
func (a *actionConfigs) forResource(obj *unstructured.Unstructured, log action.DebugLog) (*action.Configuration, error) {
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
	d := driver.NewSecrets(secrets)
	d.Log = log
	store := storage.Init(d)
	store.Log = log
	return &action.Configuration{
		RESTClientGetter: a.getter,
		KubeClient:       a.kubeClient(ns, log),
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
