package catalog

import (
	"context"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/operator-framework/operator-registry/alpha/declcfg"
	"github.com/operator-framework/operator-registry/alpha/property"
)

const (
	committed       = "../../../catalog/configs"
	committedInline = "../../../catalog/inline"
)

// TestCommittedCatalogPassesOPMValidate runs operator-registry's loader and
// model validation (what `opm validate` runs) on both committed catalogs,
// and checks the upgrade graph users rely on.
func TestCommittedCatalogPassesOPMValidate(t *testing.T) {
	for _, dir := range []string{committed, committedInline} {
		t.Run(strings.TrimPrefix(dir, "../../../"), func(t *testing.T) { checkCommittedCatalog(t, dir) })
	}
}

func checkCommittedCatalog(t *testing.T, committed string) {
	ctx := context.Background()
	if err := Validate(ctx, os.DirFS(committed)); err != nil {
		t.Fatalf("opm validate %s: %v", committed, err)
	}
	cfg, err := declcfg.LoadFS(ctx, os.DirFS(committed))
	if err != nil {
		t.Fatal(err)
	}
	m, err := declcfg.ConvertToModel(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	pkg := m["orchestra-operator"]
	if pkg == nil || pkg.DefaultChannel == nil || pkg.DefaultChannel.Name != "stable-v1" {
		t.Fatalf("package orchestra-operator with default channel stable-v1 expected, got %+v", pkg)
	}
	heads := map[string]string{}
	for name, ch := range pkg.Channels {
		h, err := ch.Head()
		if err != nil {
			t.Fatalf("channel %s: %v", name, err)
		}
		heads[name] = h.Name
	}
	want := map[string]string{
		"candidate-v0": "orchestra-operator.v0.2.1", "fast-v0": "orchestra-operator.v0.2.1", "stable-v0": "orchestra-operator.v0.2.1",
		"candidate-v1": "orchestra-operator.v1.0.0", "fast-v1": "orchestra-operator.v1.0.0", "stable-v1": "orchestra-operator.v1.0.0",
	}
	if d := cmp.Diff(want, heads); d != "" {
		t.Errorf("channel heads (-want +got):\n%s", d)
	}
	// 1.0.0 upgrades 0.2.x across major channels through its skipRange;
	// the carrier 0.2.1 upgrades 0.1.0 and 0.2.0, which left the catalog.
	b := pkg.Channels["stable-v1"].Bundles["orchestra-operator.v1.0.0"]
	if b.SkipRange != ">=0.1.0 <1.0.0" {
		t.Errorf("stable-v1 entry 1.0.0 skipRange = %q, want >=0.1.0 <1.0.0", b.SkipRange)
	}
	c := pkg.Channels["stable-v0"].Bundles["orchestra-operator.v0.2.1"]
	if c.SkipRange != ">=0.1.0 <0.2.1" {
		t.Errorf("stable-v0 entry 0.2.1 skipRange = %q, want >=0.1.0 <0.2.1", c.SkipRange)
	}
	for _, b := range cfg.Bundles {
		objs, err := BundleObjects(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) == 0 {
			t.Errorf("%s: bundle %s has no inline objects", committed, b.Name)
		}
		if inline := committed == committedInline; inline != (b.Image == "") {
			t.Errorf("%s: bundle %s has image %q", committed, b.Name, b.Image)
		}
	}
}

// A catalog file starting with a comment-only document, as this project
// once wrote, is refused by opm; YAML keeps the header inside the first
// document.
func TestHeaderStaysInsideTheFirstDocument(t *testing.T) {
	ctx := context.Background()
	cfg := &declcfg.DeclarativeConfig{
		Packages: []declcfg.Package{{Schema: declcfg.SchemaPackage, Name: "p", DefaultChannel: "stable"}},
		Channels: []declcfg.Channel{{Schema: declcfg.SchemaChannel, Package: "p", Name: "stable", Entries: []declcfg.ChannelEntry{{Name: "p.v1.0.0"}}}},
		Bundles: []declcfg.Bundle{{Schema: declcfg.SchemaBundle, Package: "p", Name: "p.v1.0.0", Image: "example.com/p-bundle:v1.0.0",
			Properties: []property.Property{property.MustBuildPackage("p", "1.0.0")}}},
	}
	out, err := YAML(cfg, "Generated; do not edit.\nSecond line.")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "# Generated; do not edit.\n# Second line.\ndefaultChannel: stable\n") {
		t.Fatalf("unexpected start:\n%s", out)
	}
	if err := Validate(ctx, fstest.MapFS{"c.yaml": {Data: out}}); err != nil {
		t.Fatalf("opm validate refuses the written catalog: %v", err)
	}
	old := append([]byte("# Generated; do not edit.\n---\n"), out...)
	err = Validate(ctx, fstest.MapFS{"c.yaml": {Data: old}})
	if err == nil || !strings.Contains(err.Error(), "missing root schema field") {
		t.Fatalf("a comment-only first document: err = %v, want opm's missing root schema field", err)
	}
}

// opm validate's graph rules apply: two heads in a channel are refused.
func TestValidateRefusesTwoChannelHeads(t *testing.T) {
	cfg := &declcfg.DeclarativeConfig{
		Packages: []declcfg.Package{{Schema: declcfg.SchemaPackage, Name: "p", DefaultChannel: "stable"}},
		Channels: []declcfg.Channel{{Schema: declcfg.SchemaChannel, Package: "p", Name: "stable", Entries: []declcfg.ChannelEntry{{Name: "p.v1.0.0"}, {Name: "p.v1.1.0"}}}},
		Bundles: []declcfg.Bundle{
			{Schema: declcfg.SchemaBundle, Package: "p", Name: "p.v1.0.0", Image: "example.com/p-bundle:v1.0.0", Properties: []property.Property{property.MustBuildPackage("p", "1.0.0")}},
			{Schema: declcfg.SchemaBundle, Package: "p", Name: "p.v1.1.0", Image: "example.com/p-bundle:v1.1.0", Properties: []property.Property{property.MustBuildPackage("p", "1.1.0")}},
		},
	}
	out, err := YAML(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	err = Validate(context.Background(), fstest.MapFS{"c.yaml": {Data: out}})
	if err == nil || !strings.Contains(err.Error(), "multiple channel heads") {
		t.Fatalf("err = %v, want multiple channel heads", err)
	}
}

// TestRenderBundleDirAndTemplate renders the committed releases through
// operator-registry's semver template and checks the edges it generates
// and the skipRange this project adds.
func TestRenderBundleDirAndTemplate(t *testing.T) {
	dirs := map[string]string{
		"example.com/b:v0.1.0": "../../../catalog/bundles/0.1.0",
		"example.com/b:v0.2.0": "../../../catalog/bundles/0.2.0",
	}
	render := func(_ context.Context, image string) (*declcfg.DeclarativeConfig, error) {
		return RenderBundleDir(dirs[image], image)
	}
	tmpl := "schema: olm.semver\ngenerateMajorChannels: true\nstable:\n  bundles:\n  - image: example.com/b:v0.1.0\n  - image: example.com/b:v0.2.0\n"
	cfg, err := RenderTemplate(context.Background(), strings.NewReader(tmpl), render)
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplySkipRanges(cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Channels) != 1 || cfg.Channels[0].Name != "stable-v0" {
		t.Fatalf("channels = %+v", cfg.Channels)
	}
	want := []declcfg.ChannelEntry{
		{Name: "orchestra-operator.v0.1.0"},
		{Name: "orchestra-operator.v0.2.0", Replaces: "orchestra-operator.v0.1.0", SkipRange: ">=0.1.0 <0.2.0"},
	}
	if d := cmp.Diff(want, cfg.Channels[0].Entries); d != "" {
		t.Errorf("entries (-want +got):\n%s", d)
	}
	for _, b := range cfg.Bundles {
		var hasBundleImage bool
		for _, ri := range b.RelatedImages {
			hasBundleImage = hasBundleImage || ri.Image == b.Image
		}
		if !hasBundleImage {
			t.Errorf("%s: related images lack the bundle image %s", b.Name, b.Image)
		}
	}
}
