package preview

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/localcluster"
)

// TestSamplesPassServerSideDryRun creates every object rendered for every
// sample with a server-side dry run against a real API server, which
// applies the built-in types' full validation (names, probes, selectors,
// security contexts, ...). Kinds the server does not serve (HTTPRoute
// without the Gateway API CRDs) are reported and skipped.
func TestSamplesPassServerSideDryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local API server")
	}
	binDir := localcluster.Options{}.Default().BinDir
	if _, err := os.Stat(filepath.Join(binDir, "kube-apiserver")); err != nil {
		t.Skipf("no kube-apiserver in %s (build the tools first): %v", binDir, err)
	}
	cluster := localcluster.StartForTest(t, localcluster.Options{})
	ctx := context.Background()
	c := newDryRunClient(cluster)

	samples, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples (%v)", err)
	}
	p := newRenderer(t)
	for _, sample := range samples {
		t.Run(filepath.Base(sample), func(t *testing.T) {
			res := renderSample(t, p, sample)
			dryRun(ctx, t, c, res.Objects)
		})
	}
}

// dryRunClient creates objects with a server-side dry run.
type dryRunClient struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newDryRunClient(cluster *localcluster.Cluster) dryRunClient {
	return dryRunClient{
		cs:     kubernetes.NewForConfigOrDie(cluster.Config()),
		dyn:    dynamic.NewForConfigOrDie(cluster.Config()),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cluster.Config()))),
	}
}

// dryRun creates every object with a server-side dry run, in its namespace
// (created for real when missing), and fails the test for each refusal.
func dryRun(ctx context.Context, t *testing.T, c dryRunClient, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		ns := o.GetNamespace()
		if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		gvk := o.GroupVersionKind()
		m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			t.Logf("%s %s: not served by this API server, skipped", gvk.Kind, o.GetName())
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		obj := o.DeepCopy()
		// The owner does not exist in this cluster; its reference is
		// the engine's business, not the chart's.
		obj.SetOwnerReferences(nil)
		_, err = c.dyn.Resource(m.Resource).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Errorf("%s %s/%s refused: %v", gvk.Kind, ns, o.GetName(), err)
		}
	}
}

// TestSleepPassesServerSideDryRun creates what the chart renders for
// sleeping applications (testdata/chart/sleep.values.yaml) with a
// server-side dry run, the ModelCheckpoint CRD installed: the seat
// sidecars, hostPath volumes, port ranges of the NetworkPolicy, the node
// agent DaemonSet and the ModelCheckpoints pass the API server's
// validation.
func TestSleepPassesServerSideDryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local API server")
	}
	binDir := localcluster.Options{}.Default().BinDir
	if _, err := os.Stat(filepath.Join(binDir, "kube-apiserver")); err != nil {
		t.Skipf("no kube-apiserver in %s (build the tools first): %v", binDir, err)
	}
	cluster := localcluster.StartForTest(t, localcluster.Options{})
	ctx := context.Background()
	raw, err := os.ReadFile("../../../config/crd/bases/modelorchestra.io_modelcheckpoints.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		t.Fatal(err)
	}
	ext := apiextensionsclient.NewForConfigOrDie(cluster.Config())
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server refused the CRD: %v", err)
	}
	c := newDryRunClient(cluster)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c.mapper.Reset()
		_, err := c.mapper.RESTMapping(schema.GroupKind{Group: "modelorchestra.io", Kind: "ModelCheckpoint"}, "v1alpha1")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the ModelCheckpoint CRD is not served: %v", err)
	}
	objs := renderObjects(t, readValues(t, sleepValues))
	list := make([]*unstructured.Unstructured, 0, len(objs))
	kinds := map[string]bool{}
	for _, o := range objs {
		list = append(list, o)
		kinds[o.GetKind()] = true
	}
	for _, k := range []string{"DaemonSet", "ModelCheckpoint", "NetworkPolicy", "StatefulSet"} {
		if !kinds[k] {
			t.Fatalf("no %s rendered", k)
		}
	}
	dryRun(ctx, t, c, list)
}
