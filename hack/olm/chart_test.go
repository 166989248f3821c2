package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

const chartDir = "../../charts/orchestra-operator"

// renderChart renders the install chart in namespace ops, offline.
func renderChart(t *testing.T, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading chart: %v", err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = "orchestra", "ops"
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}
	rel, err := install.Run(ch, values)
	if err != nil {
		t.Fatalf("rendering chart: %v", err)
	}
	objs, err := manifest.Objects([]byte(rel.Manifest))
	if err != nil {
		t.Fatalf("parsing rendered manifest: %v", err)
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind, namespace string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == namespace {
			out = append(out, o)
		}
	}
	return out
}

func deployment(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	ds := find(objs, "Deployment", "ops")
	if len(ds) != 1 {
		t.Fatalf("want one Deployment in ops, got %d", len(ds))
	}
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ds[0].Object, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func env(d *appsv1.Deployment) map[string]string {
	out := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		out[e.Name] = e.Value
	}
	return out
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestChartAllNamespaces(t *testing.T) {
	objs := renderChart(t, nil)
	if n := len(find(objs, "ClusterRole", "")); n != 1 {
		t.Errorf("want one ClusterRole for all namespaces, got %d", n)
	}
	if n := len(find(objs, "Role", "ops")); n != 0 {
		t.Errorf("want no Role when watching all namespaces, got %d", n)
	}
	d := deployment(t, objs)
	e := env(d)
	if w, ok := e["WATCH_NAMESPACE"]; !ok || w != "" {
		t.Errorf("WATCH_NAMESPACE = %q (set %v), want empty", w, ok)
	}
	var images map[string]string
	readYAML(t, filepath.Join(chartDir, "files", "related-images.yaml"), &images)
	if len(images) == 0 {
		t.Fatal("files/related-images.yaml is empty")
	}
	for k, v := range images {
		if e[k] != v {
			t.Errorf("%s = %q, want %q", k, e[k], v)
		}
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Spec.Template.Spec.Containers[0].Image, "ghcr.io/model-orchestra/orchestra-operator:v"+ch.Metadata.AppVersion; got != want {
		t.Errorf("image = %q, want %q", got, want)
	}
	crds := find(objs, "CustomResourceDefinition", "")
	var names []string
	for _, crd := range crds {
		names = append(names, crd.GetName())
		if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("the CRD %s is not kept on uninstall: %v", crd.GetName(), crd.GetAnnotations())
		}
	}
	slices.Sort(names)
	if want := []string{"checkpointpolicies.modelorchestra.io", "modelcheckpoints.modelorchestra.io", "modelorchestras.modelorchestra.io"}; !slices.Equal(names, want) {
		t.Fatalf("CRDs = %v, want %v", names, want)
	}
}

func TestChartWatchNamespaces(t *testing.T) {
	objs := renderChart(t, map[string]any{
		"watchNamespaces": []any{"team-a", "team-b"},
		"installCRDs":     false,
		"relatedImages":   map[string]any{"RELATED_IMAGE_VLLM": "mirror.example/vllm:v1"},
	})
	for _, ns := range []string{"team-a", "team-b", "ops"} {
		if len(find(objs, "Role", ns)) != 1 || len(find(objs, "RoleBinding", ns)) != 1 {
			t.Errorf("want a Role and RoleBinding in %s", ns)
		}
	}
	if n := len(find(objs, "ClusterRole", "")); n != 0 {
		t.Errorf("watching namespaces must not grant a ClusterRole, got %d", n)
	}
	if n := len(find(objs, "CustomResourceDefinition", "")); n != 0 {
		t.Errorf("installCRDs=false still renders %d CRDs", n)
	}
	e := env(deployment(t, objs))
	if e["WATCH_NAMESPACE"] != "team-a,team-b" {
		t.Errorf("WATCH_NAMESPACE = %q", e["WATCH_NAMESPACE"])
	}
	if e["RELATED_IMAGE_VLLM"] != "mirror.example/vllm:v1" {
		t.Errorf("RELATED_IMAGE_VLLM override ignored: %q", e["RELATED_IMAGE_VLLM"])
	}

	// The Role grants what the OLM bundle grants.
	var role rbacv1.Role
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find(objs, "Role", "team-a")[0].Object, &role); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Load("../../bundle")
	if err != nil {
		t.Fatalf("loading bundle/: %v", err)
	}
	csvRules := b.CSV.Spec.InstallStrategy.StrategySpec.Permissions[0].Rules
	if d := cmp.Diff(bundle.MergeRules(csvRules), bundle.MergeRules(role.Rules)); d != "" {
		t.Errorf("chart Role and CSV permissions differ (-csv +chart):\n%s", d)
	}
	if !bundle.Allows(role.Rules, "modelorchestra.io", "modelorchestras/status", "update") {
		t.Errorf("the chart's Role does not let the operator update status")
	}
	if !strings.Contains(b.CSV.Name, "orchestra-operator.v") {
		t.Errorf("unexpected CSV %s", b.CSV.Name)
	}
}

// The proxy values reach the operator, which passes them on (proxy-env).
func TestChartProxy(t *testing.T) {
	e := env(deployment(t, renderChart(t, nil)))
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if _, ok := e[k]; ok {
			t.Errorf("%s set without a proxy configured", k)
		}
	}
	e = env(deployment(t, renderChart(t, map[string]any{"proxy": map[string]any{
		"httpsProxy": "http://proxy.corp:3128", "noProxy": ".svc,.cluster.local",
	}})))
	if e["HTTPS_PROXY"] != "http://proxy.corp:3128" || e["NO_PROXY"] != ".svc,.cluster.local" {
		t.Errorf("proxy values not passed on: %v", e)
	}
	if _, ok := e["HTTP_PROXY"]; ok {
		t.Errorf("HTTP_PROXY set though httpProxy is empty")
	}
}
