package validation_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsinstall "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
)

// TestCRDIsAccepted runs the API server's own validation of a
// CustomResourceDefinition on the generated CRD: a structural schema,
// compilable CEL rules within the cost budget, valid defaults. A CRD that
// fails here cannot be installed.
func TestCRDIsAccepted(t *testing.T) {
	var v1crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(operator.ModelOrchestraCRD(), &v1crd); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	apiextensionsinstall.Install(scheme)
	var crd apiextensions.CustomResourceDefinition
	if err := scheme.Convert(&v1crd, &crd, nil); err != nil {
		t.Fatal(err)
	}
	// The API server sets the stored versions; a new CRD stores its
	// storage version.
	crd.Status.StoredVersions = []string{"v1alpha1"}
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &crd); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD:\n%v", errs.ToAggregate())
	}
}

func newValidator(t *testing.T) *validation.Validator {
	t.Helper()
	v, err := validation.New(operator.ModelOrchestraCRD(), "v1alpha1")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := u.UnmarshalJSON(js); err != nil {
		t.Fatal(err)
	}
	return u
}

func TestValidateAppliesSchemaDefaults(t *testing.T) {
	out, err := newValidator(t).Validate(context.Background(), object(t, `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: demo, namespace: ns}
spec:
  applications:
    chat:
      model: {source: "hf://org/repo", file: m.gguf}
`))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]any{
		"spec.gateway.replicas":                          int64(2),
		"spec.gateway.service.type":                      "ClusterIP",
		"spec.gateway.limits.maxBodySize":                "8Mi",
		"spec.nats.replicas":                             int64(1),
		"spec.applications.chat.runtime.engine":          "llamacpp",
		"spec.applications.chat.serving.maxConcurrency":  int64(4),
		"spec.applications.chat.scaling.replicas":        int64(1),
		"spec.applications.chat.runtime.gpu.count":       int64(0),
		"spec.applications.chat.runtime.imagePullPolicy": "IfNotPresent",
	} {
		got, found, err := unstructured.NestedFieldNoCopy(out.Object, strings.Split(path, ".")...)
		if err != nil || !found || got != want {
			t.Errorf("%s = %v (found %v), want %v", path, got, found, want)
		}
	}
}

func TestValidateRefusesWrongKind(t *testing.T) {
	_, err := newValidator(t).Validate(context.Background(), object(t, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"))
	if !errors.Is(err, validation.ErrInvalid) || !strings.Contains(err.Error(), "expected apiVersion modelorchestra.io/v1alpha1") {
		t.Fatalf("error = %v", err)
	}
}
