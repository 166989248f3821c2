package preview

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

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
	cs := kubernetes.NewForConfigOrDie(cluster.Config())
	dyn := dynamic.NewForConfigOrDie(cluster.Config())
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cluster.Config())))

	samples, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples (%v)", err)
	}
	p := newRenderer(t)
	for _, sample := range samples {
		t.Run(filepath.Base(sample), func(t *testing.T) {
			res := renderSample(t, p, sample)
			for _, o := range res.Objects {
				ns := o.GetNamespace()
				if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatal(err)
				}
				gvk := o.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
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
				_, err = dyn.Resource(m.Resource).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if err != nil {
					t.Errorf("%s %s/%s refused: %v", gvk.Kind, ns, o.GetName(), err)
				}
			}
		})
	}
}
