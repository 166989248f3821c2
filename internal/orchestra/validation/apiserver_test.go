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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	res := servedResource(t)
	ctx := context.Background()

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

// servedResource starts a local API server (skipping the test without
// one), installs the ModelOrchestra CRD and returns its resource of the
// default namespace once it is served.
func servedResource(t *testing.T) dynamic.ResourceInterface {
	t.Helper()
	return installCRD(t, startAPIServer(t), operator.ModelOrchestraCRD(), "modelorchestras")
}

// startAPIServer starts a local API server, skipping the test without one.
func startAPIServer(t *testing.T) *localcluster.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a local API server")
	}
	opts := localcluster.Options{}.Default()
	if _, err := os.Stat(filepath.Join(opts.BinDir, "kube-apiserver")); err != nil {
		t.Skipf("no kube-apiserver in %s (build the tools first): %v", opts.BinDir, err)
	}
	return localcluster.StartForTest(t, localcluster.Options{})
}

// installCRD installs a CRD (the API server checks its schema and the cost
// of its CEL rules) and returns its resource of the default namespace once
// it is served.
func installCRD(t *testing.T, cluster *localcluster.Cluster, crdYAML []byte, resource string) dynamic.ResourceInterface {
	t.Helper()
	ctx := context.Background()
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &crd); err != nil {
		t.Fatal(err)
	}
	ext := apiextensionsclient.NewForConfigOrDie(cluster.Config())
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server refused the CRD %s: %v", crd.Name, err)
	}
	res := dynamic.NewForConfigOrDie(cluster.Config()).Resource(v1alpha1.GroupVersion.WithResource(resource)).Namespace("default")
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := res.List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the CRD %s is not served: %v", crd.Name, err)
	}
	return res
}

// TestImmutableStorageOnAPIServer checks the transition rules on a real API
// server: volume settings that the chart renders into objects Kubernetes
// cannot change (the NATS StatefulSet's volumeClaimTemplates, the model
// cache claim) are refused on update with a message naming the field,
// while restating a default or an equal quantity is accepted.
func TestImmutableStorageOnAPIServer(t *testing.T) {
	res := servedResource(t)
	ctx := context.Background()
	obj := object(t, `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: immutable, namespace: default}
spec:
  applications:
    chat:
      model: {source: "hf://org/repo", file: m.gguf}
`)
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name      string
		set       map[string]any // spec paths (dot-separated) to values; nil removes
		wantField string         // empty: accepted
		wantMsg   string
	}{
		{name: "restating the default NATS size", set: map[string]any{"nats.storage": map[string]any{"size": "10Gi"}}},
		{name: "the same NATS size spelled differently", set: map[string]any{"nats.storage.size": "10240Mi"}},
		{name: "a larger NATS volume", set: map[string]any{"nats.storage.size": "20Gi"}, wantField: "spec.nats.storage.size", wantMsg: "nats.storage.size cannot be changed in place"},
		{name: "a smaller NATS volume", set: map[string]any{"nats.storage.size": "5Gi"}, wantField: "spec.nats.storage.size", wantMsg: "cannot be changed in place"},
		{name: "removing NATS storage that was the default", set: map[string]any{"nats.storage": nil}},
		{name: "another NATS storage class", set: map[string]any{"nats.storage": map[string]any{"storageClassName": "fast"}}, wantField: "spec.nats.storage.storageClassName", wantMsg: "cannot be changed in place"},
		{name: "restating the default cache access mode", set: map[string]any{"applications.chat.model.cache": map[string]any{"accessMode": "ReadWriteOnce"}}},
		{name: "another cache access mode", set: map[string]any{"applications.chat.model.cache.accessMode": "ReadWriteMany"}, wantField: "spec.applications[chat].model.cache.accessMode", wantMsg: "cache.accessMode cannot be changed in place"},
		{name: "another cache storage class", set: map[string]any{"applications.chat.model.cache.storageClassName": "fast"}, wantField: "spec.applications[chat].model.cache.storageClassName", wantMsg: "cache.storageClassName cannot be changed in place"},
		{name: "moving the cache to an existing claim", set: map[string]any{"applications.chat.model.cache": map[string]any{"existingClaim": "mine"}}},
		{name: "an external NATS drops the in-cluster volume", set: map[string]any{"nats.url": "nats://nats.messaging:4222"}},
	}
	for _, st := range steps {
		live, err := res.Get(ctx, "immutable", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for path, v := range st.set {
			fields := append([]string{"spec"}, strings.Split(path, ".")...)
			if v == nil {
				unstructured.RemoveNestedField(live.Object, fields...)
				continue
			}
			if err := unstructured.SetNestedField(live.Object, v, fields...); err != nil {
				t.Fatal(err)
			}
		}
		_, err = res.Update(ctx, live, metav1.UpdateOptions{})
		switch {
		case st.wantField == "" && err != nil:
			t.Errorf("%s: refused: %v", st.name, err)
		case st.wantField != "" && err == nil:
			t.Errorf("%s: accepted; want it refused naming %s", st.name, st.wantField)
		case st.wantField != "":
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), st.wantField) || !strings.Contains(err.Error(), st.wantMsg) {
				t.Errorf("%s: error = %v; want Invalid naming %s with %q", st.name, err, st.wantField, st.wantMsg)
			}
		}
	}
}
