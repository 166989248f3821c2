package validation_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/localcluster"
)

// TestParityWithAPIServer installs the CRD into a real API server and
// checks that it accepts and refuses the same resources as the offline
// validator, with the same field paths, and applies the same defaults.
func TestParityWithAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local API server")
	}
	opts := localcluster.Options{}.Default()
	if _, err := os.Stat(filepath.Join(opts.BinDir, "kube-apiserver")); err != nil {
		t.Skipf("no kube-apiserver in %s (build the tools first): %v", opts.BinDir, err)
	}
	cluster := localcluster.StartForTest(t, localcluster.Options{})
	ctx := context.Background()

	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(operator.ModelOrchestraCRD(), &crd); err != nil {
		t.Fatal(err)
	}
	ext := apiextensionsclient.NewForConfigOrDie(cluster.Config())
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server refused the CRD: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(cluster.Config())
	res := dyn.Resource(v1alpha1.GroupVersion.WithResource("modelorchestras")).Namespace("default")
	// Wait until the CRD is served.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := res.List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the CRD is not served: %v", err)
	}

	v := newValidator(t)
	valid := `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: NAME, namespace: default}
spec:
  applications:
    chat:
      model: {source: "hf://org/repo", file: m.gguf}
      runtime: {engine: ENGINE, workers: WORKERS, gpu: {product: PRODUCT}}
`
	cases := []struct {
		name, engine, workers, product string
		wantField                      string // empty: valid
	}{
		{name: "valid", engine: "llamacpp", workers: "2", product: "null"},
		{name: "dllama-three", engine: "dllama", workers: "2", product: "null", wantField: "spec.applications[chat].runtime.workers"},
		{name: "product-without-count", engine: "llamacpp", workers: "0", product: "NVIDIA-L4", wantField: "spec.applications[chat].runtime.gpu.count"},
		{name: "unknown-engine", engine: "tgi", workers: "0", product: "null", wantField: "spec.applications.chat.runtime.engine"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.NewReplacer("NAME", tc.name, "ENGINE", tc.engine, "WORKERS", tc.workers, "PRODUCT", tc.product).Replace(valid)
			obj := object(t, doc)
			offline, offErr := v.Validate(ctx, obj)
			created, srvErr := res.Create(ctx, obj, metav1.CreateOptions{})
			if tc.wantField == "" {
				if offErr != nil || srvErr != nil {
					t.Fatalf("valid resource refused: offline %v, API server %v", offErr, srvErr)
				}
				if diff := cmp.Diff(created.Object["spec"], offline.Object["spec"]); diff != "" {
					t.Errorf("defaults differ (-API server +offline):\n%s", diff)
				}
				return
			}
			if offErr == nil || srvErr == nil {
				t.Fatalf("invalid resource accepted: offline %v, API server %v", offErr, srvErr)
			}
			if !apierrors.IsInvalid(srvErr) {
				t.Errorf("API server error is not Invalid: %v", srvErr)
			}
			for _, err := range []error{offErr, srvErr} {
				if !strings.Contains(err.Error(), tc.wantField) {
					t.Errorf("error does not name %s: %v", tc.wantField, err)
				}
			}
		})
	}
}
