package catalog

import (
	"encoding/base64"
	"fmt"
	"sort"

	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// FromRegistryV1 renders a registry+v1 bundle, published as image, into an
// olm.bundle the way `opm render` does: an olm.package property with the
// CSV version, an olm.gvk property per version of every CRD in the bundle,
// an olm.gvk.required per required CRD, an olm.bundle.object per manifest
// (the CSV first), and as related images the CSV's, the bundle image and
// every operator container image (unnamed when the CSV does not name it).
func FromRegistryV1(b *bundle.Bundle, image string) (Bundle, error) {
	csv := b.CSV
	pkg := b.Package()
	if pkg == "" {
		return Bundle{}, fmt.Errorf("bundle %s has no package annotation", csv.Name)
	}
	out := Bundle{Schema: SchemaBundle, Name: csv.Name, Package: pkg, Image: image}
	add := func(typ string, v any) error {
		p, err := NewProperty(typ, v)
		if err != nil {
			return err
		}
		out.Properties = append(out.Properties, p)
		return nil
	}
	if err := add(PropertyPackage, PackageProperty{PackageName: pkg, Version: csv.Spec.Version}); err != nil {
		return Bundle{}, err
	}
	var gvks []GVKProperty
	for _, crd := range b.CRDs {
		for _, v := range crd.Spec.Versions {
			gvks = append(gvks, GVKProperty{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Version: v.Name})
		}
	}
	sortGVKs(gvks)
	for _, g := range gvks {
		if err := add(PropertyGVK, g); err != nil {
			return Bundle{}, err
		}
	}
	var required []GVKProperty
	for _, r := range csv.Spec.CustomResourceDefinitions.Required {
		group := r.Name
		if i := indexDot(r.Name); i >= 0 {
			group = r.Name[i+1:]
		}
		required = append(required, GVKProperty{Group: group, Kind: r.Kind, Version: r.Version})
	}
	sortGVKs(required)
	for _, g := range required {
		if err := add(PropertyGVKRequired, g); err != nil {
			return Bundle{}, err
		}
	}
	objects, err := bundleObjects(b)
	if err != nil {
		return Bundle{}, err
	}
	for _, o := range objects {
		if err := add(PropertyBundleObject, BundleObjectProperty{Data: o}); err != nil {
			return Bundle{}, err
		}
	}
	out.RelatedImages = relatedImages(csv, image)
	return out, nil
}

func indexDot(s string) int {
	for i := range s {
		if s[i] == '.' {
			return i
		}
	}
	return -1
}

func sortGVKs(g []GVKProperty) {
	sort.Slice(g, func(i, j int) bool {
		a, b := g[i], g[j]
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Version < b.Version
	})
}

// bundleObjects returns every manifest of the bundle as JSON, the CSV first,
// then the files in name order.
func bundleObjects(b *bundle.Bundle) ([][]byte, error) {
	var csv []byte
	var rest [][]byte
	for _, f := range b.Files {
		docs, err := manifest.Documents(f.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		for _, doc := range docs {
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Name, err)
			}
			objs, err := manifest.Objects(doc)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Name, err)
			}
			if objs[0].GetKind() == manifest.CSVKind {
				csv = js
				continue
			}
			rest = append(rest, js)
		}
	}
	if csv == nil {
		return nil, fmt.Errorf("bundle has no ClusterServiceVersion")
	}
	return append([][]byte{csv}, rest...), nil
}

func relatedImages(csv *manifest.ClusterServiceVersion, bundleImage string) []RelatedImage {
	seen := map[string]bool{}
	var out []RelatedImage
	addImg := func(name, img string) {
		if img == "" || seen[img] {
			return
		}
		seen[img] = true
		out = append(out, RelatedImage{Name: name, Image: img})
	}
	for _, ri := range csv.Spec.RelatedImages {
		addImg(ri.Name, ri.Image)
	}
	addImg("", bundleImage)
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		for _, c := range append(append(d.Spec.Template.Spec.InitContainers[:0:0], d.Spec.Template.Spec.InitContainers...), d.Spec.Template.Spec.Containers...) {
			addImg("", c.Image)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Image < out[j].Image
	})
	return out
}

// PackageIconAndDescription copies the icon and description of a bundle's
// CSV onto the package, so that catalog UIs show them. opm's semver
// template leaves them empty; they are optional in olm.package.
func PackageIconAndDescription(p *Package, b *bundle.Bundle) error {
	csv := b.CSV
	p.Description = csv.Spec.Description
	if len(csv.Spec.Icon) > 0 {
		data, err := base64.StdEncoding.DecodeString(csv.Spec.Icon[0].Data)
		if err != nil {
			return fmt.Errorf("decoding the icon of %s: %w", csv.Name, err)
		}
		p.Icon = &Icon{Data: data, MediaType: csv.Spec.Icon[0].MediaType}
	}
	return nil
}

// ApplySkipRanges sets skipRange on every channel entry of a bundle whose
// CSV declares olm.skipRange (ranges maps bundle names to ranges). opm's
// semver template drops the annotation, which leaves no upgrade path from
// one major channel to the next (1.0.0 neither replaces nor skips 0.2.0,
// which sits in stable-v0). With it, a Subscription or ClusterExtension
// moved from stable-v0 to stable-v1 upgrades 0.2.0 to 1.0.0. skipRange adds
// no incoming edge, so heads and stranded bundles are unchanged.
func ApplySkipRanges(cfg *DeclarativeConfig, ranges map[string]string) {
	for ci := range cfg.Channels {
		for ei := range cfg.Channels[ci].Entries {
			e := &cfg.Channels[ci].Entries[ei]
			if r, ok := ranges[e.Name]; ok && r != "" {
				e.SkipRange = r
			}
		}
	}
}
