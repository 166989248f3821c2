package catalog

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/check"
)

// fakeSource renders "reg/op-bundle:v1.2.3" into a bundle op.v1.2.3 of
// package op (the package is the image name before "-bundle").
func fakeSource(image string) (Bundle, error) {
	tag := image[strings.LastIndex(image, ":")+2:]
	name := image[strings.LastIndex(image, "/")+1 : strings.LastIndex(image, "-bundle")]
	p, _ := NewProperty(PropertyPackage, PackageProperty{PackageName: name, Version: tag})
	o, _ := NewProperty(PropertyBundleObject, BundleObjectProperty{Data: []byte(`{"kind":"ClusterServiceVersion"}`)})
	return Bundle{Schema: SchemaBundle, Name: name + ".v" + tag, Package: name, Image: image, Properties: []Property{p, o}}, nil
}

func tmpl(t *testing.T, src string) *SemverTemplate {
	t.Helper()
	st, err := ParseTemplate([]byte(src))
	if err != nil {
		t.Fatalf("ParseTemplate: %v", err)
	}
	return st
}

func images(vs ...string) string {
	var b strings.Builder
	b.WriteString("  bundles:\n")
	for _, v := range vs {
		b.WriteString("  - image: reg/op-bundle:v" + v + "\n")
	}
	return b.String()
}

func TestSemverTemplateChannels(t *testing.T) {
	tests := []struct {
		name        string
		template    string
		wantDefault string
		want        map[string][]ChannelEntry
	}{
		{
			name:        "project shape: three archetypes, major channels, a major bump",
			template:    "schema: olm.semver\ngenerateMajorChannels: true\ngenerateMinorChannels: false\ncandidate:\n" + images("0.1.0", "0.2.0", "1.0.0") + "fast:\n" + images("0.1.0", "0.2.0", "1.0.0") + "stable:\n" + images("0.1.0", "0.2.0", "1.0.0"),
			wantDefault: "stable-v1",
			want: map[string][]ChannelEntry{
				"candidate-v0": {{Name: "op.v0.1.0"}, {Name: "op.v0.2.0", Replaces: "op.v0.1.0"}},
				"candidate-v1": {{Name: "op.v1.0.0"}},
				"fast-v0":      {{Name: "op.v0.1.0"}, {Name: "op.v0.2.0", Replaces: "op.v0.1.0"}},
				"fast-v1":      {{Name: "op.v1.0.0"}},
				"stable-v0":    {{Name: "op.v0.1.0"}, {Name: "op.v0.2.0", Replaces: "op.v0.1.0"}},
				"stable-v1":    {{Name: "op.v1.0.0"}},
			},
		},
		{
			name:        "z-streams: the highest Z of each Y replaces the previous Y and skips the rest",
			template:    "schema: olm.semver\ngenerateMajorChannels: true\nstable:\n" + images("1.1.1", "1.0.0", "1.2.0", "1.0.1", "1.1.0"),
			wantDefault: "stable-v1",
			want: map[string][]ChannelEntry{
				"stable-v1": {
					{Name: "op.v1.0.0"},
					{Name: "op.v1.0.1", Skips: []string{"op.v1.0.0"}},
					{Name: "op.v1.1.0"},
					{Name: "op.v1.1.1", Replaces: "op.v1.0.1", Skips: []string{"op.v1.0.0", "op.v1.1.0"}},
					{Name: "op.v1.2.0", Replaces: "op.v1.1.1", Skips: []string{"op.v1.0.0", "op.v1.0.1", "op.v1.1.0"}},
				},
			},
		},
		{
			name:        "default: minor channels, whose heads replace across channels",
			template:    "schema: olm.semver\nstable:\n" + images("1.0.0", "1.1.0"),
			wantDefault: "stable-v1.1",
			want: map[string][]ChannelEntry{
				"stable-v1.0": {{Name: "op.v1.0.0"}},
				"stable-v1.1": {{Name: "op.v1.1.0", Replaces: "op.v1.0.0"}},
			},
		},
		{
			name:        "the most stable archetype wins the default even with older bundles",
			template:    "Schema: olm.semver\nGenerateMajorChannels: true\nCandidate:\n" + strings.ReplaceAll(images("2.0.0"), "image", "Image") + "Stable:\n" + images("1.0.0"),
			wantDefault: "stable-v1",
			want: map[string][]ChannelEntry{
				"candidate-v2": {{Name: "op.v2.0.0"}},
				"stable-v1":    {{Name: "op.v1.0.0"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Render(tmpl(t, tc.template), fakeSource)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			got := map[string][]ChannelEntry{}
			for _, ch := range cfg.Channels {
				got[ch.Name] = ch.Entries
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("channels (-want +got):\n%s", d)
			}
			if len(cfg.Packages) != 1 || cfg.Packages[0].DefaultChannel != tc.wantDefault {
				t.Errorf("packages = %+v, want default channel %s", cfg.Packages, tc.wantDefault)
			}
			if rep := Validate(cfg); rep.HasErrors() {
				t.Errorf("rendered catalog does not pass opm's rules: %v", rep.Errors())
			}
		})
	}
}

func TestSemverTemplateErrors(t *testing.T) {
	tests := []struct {
		name, template, want string
	}{
		{"wrong schema", "schema: olm.basic\n", `want "olm.semver"`},
		{"unknown key", "schema: olm.semver\ngenerateMajorChannel: true\n", "unknown field"},
		{"preference for a kind not generated", "schema: olm.semver\ngenerateMajorChannels: true\ndefaultChannelTypePreference: minor\n", "minor channels are not generated"},
		{"bad preference", "schema: olm.semver\ndefaultChannelTypePreference: patch\n", "neither major nor minor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTemplate([]byte(tc.template))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	renderErrs := []struct {
		name, template, want string
	}{
		{"no bundles", "schema: olm.semver\n", "lists no bundles"},
		{"two packages", "schema: olm.semver\nstable:\n  bundles:\n  - image: reg/op-bundle:v1.0.0\n  - image: reg/other-bundle:v1.1.0\n", "belongs to package"},
		{"build metadata only", "schema: olm.semver\nstable:\n" + images("1.0.0+a", "1.0.0+b"), "build metadata"},
	}
	for _, tc := range renderErrs {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(tmpl(t, tc.template), fakeSource)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// validCatalog is a small catalog that passes every rule.
func validCatalog(t *testing.T) *DeclarativeConfig {
	t.Helper()
	cfg, err := Render(tmpl(t, "schema: olm.semver\ngenerateMajorChannels: true\nstable:\n"+images("1.0.0", "1.1.0", "1.1.1")), fakeSource)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Packages[0].Icon = &Icon{Data: []byte(`<svg xmlns="http://www.w3.org/2000/svg"/>`), MediaType: "image/svg+xml"}
	return cfg
}

func TestValidateRules(t *testing.T) {
	entries := func(c *DeclarativeConfig) *[]ChannelEntry { return &c.Channels[0].Entries }
	tests := []struct {
		rule     string
		severity check.Severity
		mutate   func(c *DeclarativeConfig)
	}{
		{"fbc-package-name", check.Error, func(c *DeclarativeConfig) { renamePackage(c, "Op_Erator") }},
		{"fbc-duplicate", check.Error, func(c *DeclarativeConfig) { c.Packages = append(c.Packages, c.Packages[0]) }},
		{"fbc-duplicate", check.Error, func(c *DeclarativeConfig) { c.Channels = append(c.Channels, c.Channels[0]) }},
		{"fbc-duplicate", check.Error, func(c *DeclarativeConfig) { c.Bundles = append(c.Bundles, c.Bundles[0]) }},
		{"fbc-duplicate", check.Error, func(c *DeclarativeConfig) { *entries(c) = append(*entries(c), (*entries(c))[0]) }},
		{"fbc-unknown-package", check.Error, func(c *DeclarativeConfig) { c.Channels[0].Package = "other" }},
		{"fbc-unknown-package", check.Error, func(c *DeclarativeConfig) { c.Bundles[0].Package = "other" }},
		{"fbc-bundle-image", check.Error, func(c *DeclarativeConfig) { c.Bundles[0].Image = "" }},
		{"fbc-bundle-properties", check.Error, func(c *DeclarativeConfig) { c.Bundles[0].Properties = c.Bundles[0].Properties[1:] }},
		{"fbc-bundle-properties", check.Error, func(c *DeclarativeConfig) {
			c.Bundles[0].Properties = append(c.Bundles[0].Properties, c.Bundles[0].Properties[0])
		}},
		{"fbc-bundle-properties", check.Error, func(c *DeclarativeConfig) {
			c.Bundles[0].Properties[0], _ = NewProperty(PropertyPackage, PackageProperty{PackageName: "other", Version: "1.0.0"})
		}},
		{"fbc-bundle-properties", check.Error, func(c *DeclarativeConfig) {
			c.Bundles[0].Properties[0], _ = NewProperty(PropertyPackage, PackageProperty{PackageName: "op", Version: "one"})
		}},
		{"fbc-bundle-properties", check.Error, func(c *DeclarativeConfig) {
			p, _ := NewProperty(PropertyGVK, GVKProperty{Group: "example.io"})
			c.Bundles[0].Properties = append(c.Bundles[0].Properties, p)
		}},
		{"fbc-bundle-properties", check.Error, func(c *DeclarativeConfig) {
			c.Bundles[0].Properties = append(c.Bundles[0].Properties, Property{Type: PropertyBundleObject, Value: json.RawMessage(`{"data":"bm90IGpzb24="}`)})
		}},
		{"fbc-version-unique", check.Error, func(c *DeclarativeConfig) {
			c.Bundles[1].Properties[0], _ = NewProperty(PropertyPackage, PackageProperty{PackageName: "op", Version: "1.0.0"})
		}},
		{"fbc-bundle-in-channel", check.Error, func(c *DeclarativeConfig) {
			b := c.Bundles[0]
			b.Name = "op.v0.9.0"
			b.Properties = append([]Property(nil), b.Properties...)
			b.Properties[0], _ = NewProperty(PropertyPackage, PackageProperty{PackageName: "op", Version: "0.9.0"})
			c.Bundles = append(c.Bundles, b)
		}},
		{"fbc-bundle-object", check.Warning, func(c *DeclarativeConfig) { c.Bundles[0].Properties = c.Bundles[0].Properties[:1] }},
		{"fbc-channel-entries", check.Error, func(c *DeclarativeConfig) {
			c.Channels = append(c.Channels, Channel{Schema: SchemaChannel, Package: "op", Name: "fast-v1"})
		}},
		{"fbc-entry-bundle", check.Error, func(c *DeclarativeConfig) {
			(*entries(c))[2].Replaces = "op.v1.0.5"
			*entries(c) = append(*entries(c), ChannelEntry{Name: "op.v1.0.5", Replaces: "op.v1.0.0"})
		}},
		{"fbc-empty-skip", check.Error, func(c *DeclarativeConfig) { (*entries(c))[2].Skips = append((*entries(c))[2].Skips, "") }},
		{"fbc-skip-range", check.Error, func(c *DeclarativeConfig) { (*entries(c))[2].SkipRange = "below 1.1" }},
		{"fbc-channel-head", check.Error, func(c *DeclarativeConfig) { (*entries(c))[2].Skips = nil }},
		{"fbc-channel-head", check.Error, func(c *DeclarativeConfig) {
			*entries(c) = []ChannelEntry{{Name: "op.v1.0.0", Replaces: "op.v1.1.0"}, {Name: "op.v1.1.0", Replaces: "op.v1.0.0"}}
		}},
		{"fbc-cycle", check.Error, func(c *DeclarativeConfig) {
			*entries(c) = []ChannelEntry{{Name: "op.v1.1.1", Replaces: "op.v1.1.0"}, {Name: "op.v1.1.0", Replaces: "op.v1.0.0"}, {Name: "op.v1.0.0", Replaces: "op.v1.1.0"}}
		}},
		{"fbc-stranded", check.Error, func(c *DeclarativeConfig) {
			// 1.1.1 -> 1.1.0 is the chain; 1.0.0 only replaces a bundle
			// that does not exist and nothing reaches it... except itself:
			// make 1.0.0 and a 0.9.0 replace each other off the chain.
			b := c.Bundles[0]
			b.Name = "op.v0.9.0"
			b.Properties = append([]Property(nil), b.Properties...)
			b.Properties[0], _ = NewProperty(PropertyPackage, PackageProperty{PackageName: "op", Version: "0.9.0"})
			c.Bundles = append(c.Bundles, b)
			*entries(c) = []ChannelEntry{{Name: "op.v1.1.1", Replaces: "op.v1.1.0"}, {Name: "op.v1.1.0"}, {Name: "op.v1.0.0", Replaces: "op.v0.9.0"}, {Name: "op.v0.9.0", Replaces: "op.v1.0.0"}}
		}},
		{"fbc-package-channels", check.Error, func(c *DeclarativeConfig) { c.Channels[0].Package = "other" }},
		{"fbc-default-channel", check.Error, func(c *DeclarativeConfig) { c.Packages[0].DefaultChannel = "" }},
		{"fbc-default-channel", check.Error, func(c *DeclarativeConfig) { c.Packages[0].DefaultChannel = "stable-v2" }},
		{"fbc-icon", check.Error, func(c *DeclarativeConfig) { c.Packages[0].Icon.MediaType = "image/png" }},
		{"fbc-icon", check.Error, func(c *DeclarativeConfig) { c.Packages[0].Icon.Data = nil }},
	}
	if rep := Validate(validCatalog(t)); len(rep.Findings) != 0 {
		t.Fatalf("the valid catalog has findings: %v", rep.Findings)
	}
	for _, tc := range tests {
		t.Run(tc.rule, func(t *testing.T) {
			c := validCatalog(t)
			tc.mutate(c)
			rep := Validate(c)
			found := false
			for _, r := range rep.Rules(tc.severity) {
				if r == tc.rule {
					found = true
				}
			}
			if !found {
				t.Fatalf("rule %s did not report a %s; findings: %v", tc.rule, tc.severity, rep.Findings)
			}
		})
	}
}

func renamePackage(c *DeclarativeConfig, name string) {
	c.Packages[0].Name = name
	for i := range c.Channels {
		c.Channels[i].Package = name
	}
	for i := range c.Bundles {
		c.Bundles[i].Package = name
		c.Bundles[i].Properties[0], _ = NewProperty(PropertyPackage, PackageProperty{PackageName: name, Version: c.Bundles[i].Name[strings.Index(c.Bundles[i].Name, ".v")+2:]})
	}
}

func TestYAMLRoundTripAndLoader(t *testing.T) {
	cfg := validCatalog(t)
	cfg.Others = []Meta{{Schema: SchemaDeprecations, Package: "op", Blob: json.RawMessage(`{"schema":"olm.deprecations","package":"op","entries":[]}`)}}
	a, err := cfg.YAML()
	if err != nil {
		t.Fatal(err)
	}
	b, err := validCatalog(t).YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(a), string(b)) {
		t.Fatalf("YAML is not deterministic")
	}
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("op/catalog.yaml", string(a))
	write("op/README.md", "not a catalog file")
	write(".indexignore", "op/ignored.yaml\n")
	write("op/ignored.yaml", "not: fbc\n")
	got, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if d := cmp.Diff(cfg.Packages, got.Packages); d != "" {
		t.Errorf("packages (-want +got):\n%s", d)
	}
	if d := cmp.Diff(cfg.Channels, got.Channels); d != "" {
		t.Errorf("channels (-want +got):\n%s", d)
	}
	if len(got.Bundles) != 3 || len(got.Others) != 1 || got.Others[0].Schema != SchemaDeprecations {
		t.Errorf("loaded %d bundles and others %+v", len(got.Bundles), got.Others)
	}

	write("op/broken.yaml", "name: no-schema\n")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "no schema") {
		t.Errorf("Load of a document without schema: err = %v", err)
	}
}

func TestFromRegistryV1(t *testing.T) {
	c := bundle.Default()
	c.Root = "../bundle/testdata/repo"
	c.Version = "1.2.0"
	c.PackageName = "widget-operator"
	c.ImageRepository = "registry.example.io/widgets"
	c.OperatorImageName = "widget-operator"
	c.CSVBase = "config/manifests/bases/widget-operator.clusterserviceversion.yaml"
	c.PreviousVersions = []semver.Version{semver.MustParse("1.1.0")}
	c.ChartTemplates = "charts/widget/templates"
	c.ImageDefaults = map[string]string{"RELATED_IMAGE_PROXY": "docker.io/library/envoy:1.30"}
	res, err := bundle.Generate(context.Background(), c, bundle.RenderFunc(func(context.Context, *unstructured.Unstructured, map[string]string) ([]*unstructured.Unstructured, error) {
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	img := c.BundleImage("1.2.0")
	fb, err := FromRegistryV1(res.Bundle, img)
	if err != nil {
		t.Fatal(err)
	}
	if fb.Name != "widget-operator.v1.2.0" || fb.Package != "widget-operator" || fb.Image != "registry.example.io/widgets/widget-operator-bundle:v1.2.0" {
		t.Errorf("bundle = %s %s %s", fb.Name, fb.Package, fb.Image)
	}
	var types []string
	var objects []map[string]any
	for _, p := range fb.Properties {
		types = append(types, p.Type+" "+string(p.Value)[:min(len(p.Value), 60)])
		if p.Type == PropertyBundleObject {
			var o BundleObjectProperty
			if err := json.Unmarshal(p.Value, &o); err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(o.Data, &m); err != nil {
				t.Fatalf("bundle object is not JSON: %v", err)
			}
			objects = append(objects, m)
		}
	}
	if fb.Properties[0].Type != PropertyPackage || string(fb.Properties[0].Value) != `{"packageName":"widget-operator","version":"1.2.0"}` {
		t.Errorf("first property = %s %s", fb.Properties[0].Type, fb.Properties[0].Value)
	}
	if string(fb.Properties[1].Value) != `{"group":"example.io","kind":"Widget","version":"v1alpha1"}` {
		t.Errorf("gvk property = %s", fb.Properties[1].Value)
	}
	if len(objects) != 2 || objects[0]["kind"] != "ClusterServiceVersion" || objects[1]["kind"] != "CustomResourceDefinition" {
		t.Errorf("bundle objects: %v", types)
	}
	wantImages := []RelatedImage{
		{Name: "", Image: "registry.example.io/widgets/widget-operator-bundle:v1.2.0"},
		{Name: "cache", Image: "docker.io/library/redis:7.2"},
		{Name: "proxy", Image: "docker.io/library/envoy:1.30"},
		{Name: "widget-operator", Image: "registry.example.io/widgets/widget-operator:v1.2.0"},
		{Name: "widget-server", Image: "registry.example.io/widgets/widget-server:v1.2.0"},
	}
	if d := cmp.Diff(wantImages, fb.RelatedImages); d != "" {
		t.Errorf("relatedImages (-want +got):\n%s", d)
	}
	var p Package
	if err := PackageIconAndDescription(&p, res.Bundle); err != nil {
		t.Fatal(err)
	}
	if p.Icon == nil || p.Icon.MediaType != "image/svg+xml" || !strings.Contains(string(p.Icon.Data), "<svg") || p.Description != "Makes widgets." {
		t.Errorf("package icon/description = %+v", p)
	}
}

func TestApplySkipRangesLinksMajorChannels(t *testing.T) {
	cfg, err := Render(tmpl(t, "schema: olm.semver\ngenerateMajorChannels: true\nstable:\n"+images("0.1.0", "0.2.0", "1.0.0")), fakeSource)
	if err != nil {
		t.Fatal(err)
	}
	ApplySkipRanges(cfg, map[string]string{"op.v1.0.0": ">=0.1.0 <1.0.0"})
	got := map[string][]ChannelEntry{}
	for _, ch := range cfg.Channels {
		got[ch.Name] = ch.Entries
	}
	want := map[string][]ChannelEntry{
		"stable-v0": {{Name: "op.v0.1.0"}, {Name: "op.v0.2.0", Replaces: "op.v0.1.0"}},
		"stable-v1": {{Name: "op.v1.0.0", SkipRange: ">=0.1.0 <1.0.0"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("channels (-want +got):\n%s", d)
	}
	if rep := Validate(cfg); rep.HasErrors() {
		t.Errorf("catalog with skipRanges fails validation: %v", rep.Errors())
	}
}
