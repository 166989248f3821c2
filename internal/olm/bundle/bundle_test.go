package bundle

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/olm/check"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

func fixtureConfig() Config {
	c := Default()
	c.Root = "testdata/repo"
	c.Version = "1.2.0"
	c.PackageName = "widget-operator"
	c.ImageRepository = "registry.example.io/widgets"
	c.OperatorImageName = "widget-operator"
	c.CSVBase = "config/manifests/bases/widget-operator.clusterserviceversion.yaml"
	c.ChartTemplates = "charts/widget/templates"
	c.PreviousVersions = []semver.Version{semver.MustParse("1.1.0"), semver.MustParse("1.0.0"), semver.MustParse("2.0.0")}
	c.ImageDefaults = map[string]string{
		"RELATED_IMAGE_WIDGET_SERVER": "registry.example.io/widgets/widget-server:v0.0.1",
		"RELATED_IMAGE_PROXY":         "docker.io/library/envoy:1.30",
	}
	return c
}

func obj(apiVersion, kind, name string, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{"name": name}}}
	for k, v := range fields {
		u.Object[k] = v
	}
	return u
}

// fakeChart renders what a small product chart would: a Deployment running
// the image the operator's RELATED_IMAGE_WIDGET_SERVER names, a Service, a
// Role (whose rules the operator must hold), a cluster-scoped PriorityClass
// and a Job with an image no variable names.
var fakeChart = RenderFunc(func(_ context.Context, cr *unstructured.Unstructured, env map[string]string) ([]*unstructured.Unstructured, error) {
	pod := func(image string) map[string]any {
		return map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": image}}}}}
	}
	return []*unstructured.Unstructured{
		obj("apps/v1", "Deployment", cr.GetName(), map[string]any{"spec": pod(env["RELATED_IMAGE_WIDGET_SERVER"])}),
		obj("v1", "Service", cr.GetName(), nil),
		obj("rbac.authorization.k8s.io/v1", "Role", cr.GetName(), map[string]any{"rules": []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"configmaps"}, "resourceNames": []any{cr.GetName() + "-progress"}, "verbs": []any{"get"}}}}),
		obj("scheduling.k8s.io/v1", "PriorityClass", cr.GetName(), nil),
		obj("batch/v1", "Job", cr.GetName(), map[string]any{"spec": pod("docker.io/library/busybox:1")}),
	}, nil
})

func generate(t *testing.T) *Result {
	t.Helper()
	res, err := Generate(context.Background(), fixtureConfig(), fakeChart)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return res
}

func TestGenerateFillsTheCSV(t *testing.T) {
	res := generate(t)
	csv := res.Bundle.CSV

	if got, want := csv.Name, "widget-operator.v1.2.0"; got != want {
		t.Errorf("name = %q, want %q", got, want)
	}
	if got, want := csv.Spec.Version.String(), "1.2.0"; got != want {
		t.Errorf("version = %q, want %q", got, want)
	}
	// Replaces the highest earlier release; 2.0.0 is later and ignored.
	if got, want := csv.Spec.Replaces, "widget-operator.v1.1.0"; got != want {
		t.Errorf("replaces = %q, want %q", got, want)
	}
	if got, want := csv.Annotations[manifest.AnnotationSkipRange], ">=1.0.0 <1.2.0"; got != want {
		t.Errorf("olm.skipRange = %q, want %q", got, want)
	}
	if got, want := csv.Annotations[manifest.AnnotationContainerImage], "registry.example.io/widgets/widget-operator:v1.2.0"; got != want {
		t.Errorf("containerImage = %q, want %q", got, want)
	}

	// Project images are re-tagged to the release, third-party ones kept.
	wantImages := []v1alpha1.RelatedImage{
		{Name: "cache", Image: "docker.io/library/redis:7.2"},
		{Name: "proxy", Image: "docker.io/library/envoy:1.30"},
		{Name: "widget-operator", Image: "registry.example.io/widgets/widget-operator:v1.2.0"},
		{Name: "widget-server", Image: "registry.example.io/widgets/widget-server:v1.2.0"},
	}
	if d := cmp.Diff(wantImages, csv.Spec.RelatedImages); d != "" {
		t.Errorf("relatedImages (-want +got):\n%s", d)
	}
	c := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example.io/widgets/widget-operator:v1.2.0" {
		t.Errorf("operator image = %q", c.Image)
	}
	if got := envValue(c.Env, "RELATED_IMAGE_WIDGET_SERVER"); got != "registry.example.io/widgets/widget-server:v1.2.0" {
		t.Errorf("RELATED_IMAGE_WIDGET_SERVER = %q", got)
	}

	// Permissions: the operator's own rules, Helm verbs on every rendered
	// namespaced kind, and the rules of the rendered Role.
	perms := csv.Spec.InstallStrategy.StrategySpec.Permissions
	if len(perms) != 1 || perms[0].ServiceAccountName != "widget-operator" {
		t.Fatalf("permissions = %+v", perms)
	}
	for _, want := range []struct{ group, resource, verb string }{
		{"apps", "deployments", "patch"}, {"", "services", "create"}, {"batch", "jobs", "delete"},
		{"rbac.authorization.k8s.io", "roles", "update"}, {"", "configmaps", "get"},
		{"example.io", "widgets/status", "update"}, {"", "secrets", "list"},
		// Behind a condition no sample meets: found by the template scan.
		{"gateway.networking.k8s.io", "httproutes", "create"},
	} {
		if !Allows(perms[0].Rules, want.group, want.resource, want.verb) {
			t.Errorf("permissions do not allow %s %s.%s", want.verb, want.resource, want.group)
		}
	}
	if Allows(perms[0].Rules, "scheduling.k8s.io", "priorityclasses", "create") {
		t.Errorf("a cluster-scoped kind leaked into namespaced permissions")
	}
	cperms := csv.Spec.InstallStrategy.StrategySpec.ClusterPermissions
	if len(cperms) != 1 || !Allows(cperms[0].Rules, "scheduling.k8s.io", "priorityclasses", "create") {
		t.Errorf("clusterPermissions = %+v, want priorityclasses", cperms)
	}
	if Allows(perms[0].Rules, "", "configmaps", "delete") {
		t.Errorf("permissions grant more than the rendered Role on configmaps")
	}

	// Owned CRDs keep the base's descriptors and take the description from
	// the schema.
	owned := csv.Spec.CustomResourceDefinitions.Owned
	if len(owned) != 1 || owned[0].Kind != "Widget" || len(owned[0].SpecDescriptors) != 1 || owned[0].Description != "Widget is a test fixture." {
		t.Errorf("owned = %+v", owned)
	}

	var examples []map[string]any
	if err := json.Unmarshal([]byte(csv.Annotations[manifest.AnnotationALMExamples]), &examples); err != nil {
		t.Fatalf("alm-examples: %v", err)
	}
	if len(examples) != 1 || examples[0]["kind"] != "Widget" {
		t.Errorf("alm-examples = %v, want the one Widget sample", examples)
	}
	if md := examples[0]["metadata"].(map[string]any); md["namespace"] != nil {
		t.Errorf("alm-examples keep the sample namespace %v", md["namespace"])
	}
	wantResources := []v1alpha1.APIResourceReference{
		{Kind: "Deployment", Version: "v1"}, {Kind: "Job", Version: "v1"}, {Kind: "PriorityClass", Version: "v1"},
		{Kind: "Role", Version: "v1"}, {Kind: "Service", Version: "v1"},
	}
	if d := cmp.Diff(wantResources, owned[0].Resources); d != "" {
		t.Errorf("owned resources (-want +got):\n%s", d)
	}
	if len(csv.Spec.Icon) != 1 || csv.Spec.Icon[0].MediaType != "image/svg+xml" {
		t.Errorf("icon = %+v", csv.Spec.Icon)
	}

	wantAnn := map[string]string{
		manifest.AnnotationMediaType: "registry+v1", manifest.AnnotationManifests: "manifests/", manifest.AnnotationMetadata: "metadata/",
		manifest.AnnotationPackage: "widget-operator", manifest.AnnotationChannels: "candidate-v1,fast-v1,stable-v1", manifest.AnnotationDefaultChannel: "stable-v1",
	}
	if d := cmp.Diff(wantAnn, res.Bundle.Annotations.Annotations); d != "" {
		t.Errorf("annotations (-want +got):\n%s", d)
	}
	wantNotes := []string{
		"the chart can render HTTPRoute.gateway.networking.k8s.io, which no sample renders; the operator is granted it from the template scan",
		"cannot tell the kind of route.yaml: {{ .Values.apiVersion }} Widget; make sure a sample renders it",
		`the chart renders image "docker.io/library/busybox:1" (in Job /sample), which no RELATED_IMAGE_* variable names`,
	}
	if d := cmp.Diff(wantNotes, res.Notes); d != "" {
		t.Errorf("notes (-want +got):\n%s", d)
	}
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func TestGenerateIsDeterministicAndRoundTrips(t *testing.T) {
	a, b := generate(t), generate(t)
	if d := cmp.Diff(a.Bundle.Files, b.Bundle.Files); d != "" {
		t.Fatalf("two generations differ:\n%s", d)
	}
	dir := t.TempDir()
	// A stale file from an earlier generation must not survive.
	if err := os.MkdirAll(filepath.Join(dir, "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifests", "old.yaml"), []byte("kind: X"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Bundle.Write(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if d := cmp.Diff(a.Bundle.Files, loaded.Files); d != "" {
		t.Errorf("files after write+load (-want +got):\n%s", d)
	}
	if d := cmp.Diff(a.Bundle.Annotations, loaded.Annotations); d != "" {
		t.Errorf("annotations after write+load (-want +got):\n%s", d)
	}
	if rep := Validate(loaded); rep.HasErrors() {
		t.Errorf("loaded bundle does not validate: %v", rep.Findings)
	}
}

func TestDockerfileLabelsMatchAnnotations(t *testing.T) {
	a := generate(t).Bundle.Annotations
	df := string(Dockerfile(a, "bundle"))
	for k, v := range a.Annotations {
		if !strings.Contains(df, "LABEL "+k+"="+v+"\n") {
			t.Errorf("Dockerfile lacks LABEL %s=%s", k, v)
		}
	}
	for _, want := range []string{"FROM scratch\n", "COPY bundle/manifests /manifests/\n", "COPY bundle/metadata /metadata/\n"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

func TestGenerateRefusesBadSources(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"not semver", func(c *Config) { c.Version = "v1.2" }, "not semver"},
		{"no CRDs", func(c *Config) { c.CRDDir = "config/samples" }, "expected apiextensions.k8s.io/v1 CustomResourceDefinition"},
		{"no samples", func(c *Config) { c.SamplesDir = "config/rbac" }, "not a served version of an owned CRD"},
		{"default channel not a channel", func(c *Config) { c.Channels = []string{"stable-v1"}; c.DefaultChannel = "fast-v1" }, "is not one of the channels"},
		{"image variable the operator reads is missing", func(c *Config) { c.ImageDefaults["RELATED_IMAGE_METRICS"] = "docker.io/x/y:1" }, "does not set it"},
		{"image variable without value or default", func(c *Config) { delete(c.ImageDefaults, "RELATED_IMAGE_PROXY") }, "no value and no default"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fixtureConfig()
			tc.mutate(&c)
			_, err := Generate(context.Background(), c, fakeChart)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestValidBundleHasNoFindings(t *testing.T) {
	rep := Validate(generate(t).Bundle)
	if len(rep.Findings) != 0 {
		var buf bytes.Buffer
		_ = rep.Print(&buf)
		t.Fatalf("findings on the valid fixture:\n%s", buf.String())
	}
}

// TestValidateRules breaks a valid bundle in one way per case and checks
// that the matching rule, and only rules of the expected severity, report it.
func TestValidateRules(t *testing.T) {
	dep := func(b *Bundle) *corev1.Container {
		return &b.CSV.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0]
	}
	perms := func(b *Bundle) *v1alpha1.StrategyDeploymentPermissions {
		return &b.CSV.Spec.InstallStrategy.StrategySpec.Permissions[0]
	}
	ann := func(b *Bundle) map[string]string { return b.Annotations.Annotations }
	tests := []struct {
		rule     string
		severity check.Severity
		mutate   func(b *Bundle)
	}{
		{"annotations-required", check.Error, func(b *Bundle) { delete(ann(b), manifest.AnnotationPackage) }},
		{"annotations-mediatype", check.Error, func(b *Bundle) { ann(b)[manifest.AnnotationMediaType] = "plain+v0" }},
		{"annotations-dirs", check.Error, func(b *Bundle) { ann(b)[manifest.AnnotationManifests] = "manifest/" }},
		{"annotations-package", check.Error, func(b *Bundle) { ann(b)[manifest.AnnotationPackage] = "Widget_Operator" }},
		{"annotations-channels", check.Error, func(b *Bundle) { ann(b)[manifest.AnnotationChannels] = "stable-v1,,fast-v1" }},
		{"annotations-default-channel", check.Error, func(b *Bundle) { ann(b)[manifest.AnnotationDefaultChannel] = "beta" }},
		{"annotations-default-channel", check.Error, func(b *Bundle) { ann(b)[manifest.AnnotationDefaultChannel] = "" }},
		{"bundle-supported-kinds", check.Error, func(b *Bundle) { b.Others = append(b.Others, obj("apps/v1", "Deployment", "x", nil)) }},
		{"crd-api-version", check.Error, func(b *Bundle) { b.CRDs[0].APIVersion = "apiextensions.k8s.io/v1beta1" }},
		{"bundle-csv", check.Error, func(b *Bundle) { b.CSV = nil }},
		{"related-images-env", check.Error, func(b *Bundle) { dep(b).Env[1].Value = "registry.example.io/widgets/widget-server:v9" }},
		{"related-images-env", check.Error, func(b *Bundle) {
			b.CSV.Spec.RelatedImages = append(b.CSV.Spec.RelatedImages, v1alpha1.RelatedImage{Name: "unused", Image: "docker.io/library/nginx:1"})
		}},
		{"related-images-env", check.Error, func(b *Bundle) { dep(b).Image = "registry.example.io/widgets/widget-operator:dev" }},
		{"watch-namespace", check.Error, func(b *Bundle) { dep(b).Env = dep(b).Env[1:] }},
		{"watch-namespace", check.Error, func(b *Bundle) { dep(b).Env[0].ValueFrom.FieldRef.FieldPath = "metadata.namespace" }},
		{"permissions-own-crd", check.Error, func(b *Bundle) {
			var keep []rbacv1.PolicyRule
			for _, r := range perms(b).Rules {
				if len(r.Resources) != 1 || r.Resources[0] != "widgets/status" {
					keep = append(keep, r)
				}
			}
			perms(b).Rules = keep
		}},
		{"csv-descriptors", check.Error, func(b *Bundle) { b.CSV.Spec.CustomResourceDefinitions.Owned[0].SpecDescriptors[0].Path = "colour" }},
		{"olmv1-install-mode", check.Warning, func(b *Bundle) { b.CSV.Spec.InstallModes[3].Supported = false }},
		{"olmv1-webhooks", check.Warning, func(b *Bundle) {
			b.CSV.Spec.WebhookDefinitions = []v1alpha1.WebhookDescription{{GenerateName: "vwh", Type: "ValidatingAdmissionWebhook"}}
		}},
		{"olmv1-dependencies", check.Warning, func(b *Bundle) {
			b.CSV.Spec.CustomResourceDefinitions.Required = []v1alpha1.CRDDescription{{Name: "gadgets.example.io", Version: "v1", Kind: "Gadget"}}
		}},
		{"csv-descriptors", check.Error, func(b *Bundle) { b.CSV.Spec.CustomResourceDefinitions.Owned[0].StatusDescriptors[0].Path = "size" }},
	}
	for _, tc := range tests {
		t.Run(tc.rule, func(t *testing.T) {
			b := generate(t).Bundle
			tc.mutate(b)
			rep := Validate(b)
			rules := rep.Rules(tc.severity)
			found := false
			for _, r := range rules {
				if r == tc.rule {
					found = true
				}
			}
			if !found {
				t.Fatalf("rule %s did not report a %s; findings: %v", tc.rule, tc.severity, rep.Findings)
			}
			if tc.severity == check.Warning && rep.HasErrors() {
				t.Errorf("a warning-only break also produced errors: %v", rep.Errors())
			}
		})
	}
}

func TestMergeRules(t *testing.T) {
	got := MergeRules([]rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{"apps"}, Resources: []string{"statefulsets", "deployments"}, Verbs: []string{"list", "get"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"b", "a"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{"x"}, Verbs: []string{"list"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"patch"}},
	})
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"a", "b"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("MergeRules (-want +got):\n%s", d)
	}
}

func TestValidateDockerfile(t *testing.T) {
	a := generate(t).Bundle.Annotations
	good := string(Dockerfile(a, "bundle"))
	if rep := ValidateDockerfile([]byte(good), a); len(rep.Findings) != 0 {
		t.Fatalf("generated Dockerfile has findings: %v", rep.Findings)
	}
	tests := []struct{ name, rule, dockerfile string }{
		{"label missing", "dockerfile-labels", strings.Replace(good, "LABEL "+manifest.AnnotationPackage+"=widget-operator\n", "", 1)},
		{"label differs", "dockerfile-labels", strings.Replace(good, "channels.v1=candidate-v1,fast-v1,stable-v1", "channels.v1=stable-v1", 1)},
		{"no metadata", "dockerfile-layout", strings.Replace(good, "COPY bundle/metadata /metadata/\n", "", 1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := ValidateDockerfile([]byte(tc.dockerfile), a)
			if got := rep.Rules(check.Error); len(got) != 1 || got[0] != tc.rule {
				t.Fatalf("rules = %v, want [%s]; findings %v", got, tc.rule, rep.Findings)
			}
		})
	}
}

// TestReadOnlyKindNeedsReadVerbsOnly: an owned kind without a status
// subresource is configuration the operator reads; getting, listing and
// watching it is enough, and less is refused.
func TestReadOnlyKindNeedsReadVerbsOnly(t *testing.T) {
	perms := func(b *Bundle) *v1alpha1.StrategyDeploymentPermissions {
		return &b.CSV.Spec.InstallStrategy.StrategySpec.Permissions[0]
	}
	readOnly := func(b *Bundle, verbs ...string) {
		b.CRDs[0].Spec.Versions[0].Subresources = nil
		var keep []rbacv1.PolicyRule
		for _, r := range perms(b).Rules {
			if !slices.Contains(r.APIGroups, b.CRDs[0].Spec.Group) {
				keep = append(keep, r)
			}
		}
		perms(b).Rules = append(keep, rbacv1.PolicyRule{APIGroups: []string{b.CRDs[0].Spec.Group}, Resources: []string{b.CRDs[0].Spec.Names.Plural}, Verbs: verbs})
	}
	b := generate(t).Bundle
	readOnly(b, "get", "list", "watch")
	if got := Validate(b).Rules(check.Error); slices.Contains(got, "permissions-own-crd") {
		t.Errorf("read verbs on a kind without status were refused: %v", Validate(b).Findings)
	}
	b = generate(t).Bundle
	readOnly(b, "get", "list")
	if got := Validate(b).Rules(check.Error); !slices.Contains(got, "permissions-own-crd") {
		t.Errorf("a kind the operator cannot watch was accepted: %v", Validate(b).Findings)
	}
}
