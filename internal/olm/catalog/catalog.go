// Package catalog renders this project's semver catalog template into a
// File-Based Catalog (FBC) and validates FBCs, with operator-registry's own
// code: its semver template (alpha/template/semver), its declarative config
// types, loader and writer (alpha/declcfg) and the validation `opm validate`
// runs (pkg/lib/config: declcfg.LoadFS, then declcfg.ConvertToModel, which
// runs model.Validate).
//
// opm renders a template by pulling every bundle image; its renderer
// (alpha/action) does not build without cgo and gpgme. This project keeps
// its bundles in the repository (the current release in bundle/, earlier
// ones in catalog/bundles/<version>/), so RenderBundleDir turns a bundle
// directory into an olm.bundle with operator-registry's bundle parser and
// property extraction, the steps `opm render <bundle-dir>` takes.
package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sort"
	"strings"

	"github.com/operator-framework/operator-registry/alpha/declcfg"
	"github.com/operator-framework/operator-registry/alpha/property"
	"github.com/operator-framework/operator-registry/alpha/template/api"
	"github.com/operator-framework/operator-registry/alpha/template/semver"
	"github.com/operator-framework/operator-registry/pkg/image"
	"github.com/operator-framework/operator-registry/pkg/lib/config"
	"github.com/operator-framework/operator-registry/pkg/registry"
	"k8s.io/apimachinery/pkg/util/sets"
)

// RenderTemplate renders an olm.semver template (read from tmpl) with
// operator-registry's semver template renderer. bundles resolves each
// bundle image the template lists.
func RenderTemplate(ctx context.Context, tmpl io.Reader, bundles api.BundleRenderer) (*declcfg.DeclarativeConfig, error) {
	cfg, err := (&semver.Factory{}).CreateTemplate(bundles).Render(ctx, tmpl)
	if err != nil {
		return nil, fmt.Errorf("rendering the semver template: %w", err)
	}
	return cfg, nil
}

// RenderBundleDir renders the registry+v1 bundle in dir, published as
// bundleImage, into an olm.bundle as `opm render` does: the properties
// operator-registry derives from the bundle (olm.package, olm.gvk,
// olm.gvk.required, olm.package.required, olm.bundle.object, ...), the
// bundle objects moved to the end of the properties, and as related images
// the CSV's, the bundle image and the operator's container images, sorted
// by image.
func RenderBundleDir(dir, bundleImage string) (*declcfg.DeclarativeConfig, error) {
	in, err := registry.NewImageInput(image.SimpleReference(bundleImage), dir)
	if err != nil {
		return nil, fmt.Errorf("parsing bundle %s: %w", dir, err)
	}
	b := in.Bundle
	objs, props, err := registry.ObjectsAndPropertiesFromBundle(b)
	if err != nil {
		return nil, fmt.Errorf("properties of bundle %s: %w", b.Name, err)
	}
	related, err := relatedImages(b)
	if err != nil {
		return nil, fmt.Errorf("related images of bundle %s: %w", b.Name, err)
	}
	var csvJSON []byte
	for _, o := range b.Objects {
		if o.GetKind() == "ClusterServiceVersion" {
			if csvJSON, err = json.Marshal(o); err != nil {
				return nil, err
			}
		}
	}
	// As alpha/action.Render: bundle objects last, related images sorted.
	var others, objects []property.Property
	for _, p := range props {
		if p.Type == property.TypeBundleObject || p.Type == property.TypeCSVMetadata {
			objects = append(objects, p)
		} else {
			others = append(others, p)
		}
	}
	sort.Slice(related, func(i, j int) bool { return related[i].Image < related[j].Image })
	return &declcfg.DeclarativeConfig{Bundles: []declcfg.Bundle{{
		Schema:        declcfg.SchemaBundle,
		Name:          b.Name,
		Package:       b.Package,
		Image:         b.BundleImage,
		Properties:    append(others, objects...),
		RelatedImages: related,
		Objects:       objs,
		CsvJSON:       string(csvJSON),
	}}}, nil
}

// relatedImages is alpha/action's getRelatedImages: the CSV's related
// images, then the bundle image and the operator images not among them,
// unnamed.
func relatedImages(b *registry.Bundle) ([]declcfg.RelatedImage, error) {
	csv, err := b.ClusterServiceVersion()
	if err != nil {
		return nil, err
	}
	var spec struct {
		RelatedImages []declcfg.RelatedImage `json:"relatedImages"`
	}
	if err := json.Unmarshal(csv.Spec, &spec); err != nil {
		return nil, err
	}
	out := spec.RelatedImages
	seen := sets.New[string]()
	for _, ri := range out {
		seen.Insert(ri.Image)
	}
	if b.BundleImage != "" && !seen.Has(b.BundleImage) {
		out = append(out, declcfg.RelatedImage{Image: b.BundleImage})
		seen.Insert(b.BundleImage)
	}
	ops, err := csv.GetOperatorImages()
	if err != nil {
		return nil, err
	}
	for _, img := range sets.List(sets.KeySet(ops)) {
		if !seen.Has(img) {
			out = append(out, declcfg.RelatedImage{Image: img})
			seen.Insert(img)
		}
	}
	return out, nil
}

// ApplySkipRanges sets skipRange on every channel entry of a bundle whose
// CSV declares olm.skipRange. opm's semver template drops the annotation,
// which leaves no upgrade path from one major channel to the next (1.0.0
// neither replaces nor skips 0.2.0, which sits in stable-v0). With it, a
// Subscription or ClusterExtension moved from stable-v0 to stable-v1
// upgrades 0.2.0 to 1.0.0. A skipRange adds no incoming edge inside the
// channel, so heads and stranded bundles are unchanged.
func ApplySkipRanges(cfg *declcfg.DeclarativeConfig) error {
	ranges := map[string]string{}
	for _, b := range cfg.Bundles {
		if b.CsvJSON == "" {
			continue
		}
		var csv struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal([]byte(b.CsvJSON), &csv); err != nil {
			return fmt.Errorf("reading the CSV of %s: %w", b.Name, err)
		}
		ranges[b.Name] = csv.Metadata.Annotations["olm.skipRange"]
	}
	for ci := range cfg.Channels {
		for ei := range cfg.Channels[ci].Entries {
			e := &cfg.Channels[ci].Entries[ei]
			if r := ranges[e.Name]; r != "" {
				e.SkipRange = r
			}
		}
	}
	return nil
}

// YAML writes cfg as operator-registry writes it (declcfg.WriteYAML: one
// document per object, packages, then channels and bundles by name), with
// header as a comment on top. The comment is part of the first document:
// a comment-only document has no schema, which opm's loader refuses
// ("object ” is missing root schema field").
func YAML(cfg *declcfg.DeclarativeConfig, header string) ([]byte, error) {
	var buf bytes.Buffer
	if err := declcfg.WriteYAML(*cfg, &buf); err != nil {
		return nil, err
	}
	out := bytes.TrimPrefix(buf.Bytes(), []byte("---\n"))
	if header == "" {
		return out, nil
	}
	var h strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(header, "\n"), "\n") {
		h.WriteString("# " + line + "\n")
	}
	return append([]byte(h.String()), out...), nil
}

// Validate checks the FBC in fsys exactly as `opm validate` does
// (operator-registry's pkg/lib/config.Validate): load every JSON and YAML
// document (declcfg.LoadFS), then convert to the package model, which runs
// model.Validate (duplicate and dangling references, one channel head, no
// stranded bundles or cycles, semver versions, image references, icons,
// deprecations, ...).
func Validate(ctx context.Context, fsys fs.FS) error {
	return config.Validate(ctx, fsys)
}

// Summary counts what an FBC holds, for command output.
func Summary(ctx context.Context, fsys fs.FS) (string, error) {
	cfg, err := declcfg.LoadFS(ctx, fsys)
	if err != nil {
		return "", err
	}
	var defaults []string
	for _, p := range cfg.Packages {
		defaults = append(defaults, p.Name+" (default channel "+p.DefaultChannel+")")
	}
	slices.Sort(defaults)
	return fmt.Sprintf("%d package(s): %s; %d channel(s), %d bundle(s)", len(cfg.Packages), strings.Join(defaults, ", "), len(cfg.Channels), len(cfg.Bundles)), nil
}

// Inline returns a copy of cfg whose bundles have no image: OLM then
// installs each bundle from its olm.bundle.object properties (the CSV and
// the CRDs, inline in the catalog) instead of unpacking the bundle image
// with a Job, so no bundle image is pulled (air-gapped clusters, or a
// catalog served by opm outside the cluster). The bundle image also leaves
// the related images; the operator's images stay. opm validate accepts a
// bundle without an image when it has objects.
func Inline(cfg *declcfg.DeclarativeConfig) (*declcfg.DeclarativeConfig, error) {
	out := *cfg
	out.Bundles = make([]declcfg.Bundle, len(cfg.Bundles))
	for i, b := range cfg.Bundles {
		props, err := property.Parse(b.Properties)
		if err != nil {
			return nil, fmt.Errorf("bundle %s: %w", b.Name, err)
		}
		if len(props.BundleObjects) == 0 {
			return nil, fmt.Errorf("bundle %s has no olm.bundle.object properties; it can only be installed from its image", b.Name)
		}
		nb := b
		nb.Properties = slices.Clone(b.Properties)
		nb.RelatedImages = nil
		for _, ri := range b.RelatedImages {
			if ri.Image != b.Image {
				nb.RelatedImages = append(nb.RelatedImages, ri)
			}
		}
		nb.Image = ""
		out.Bundles[i] = nb
	}
	return &out, nil
}

// BundleObjects returns the objects a catalog's bundle installs from its
// olm.bundle.object properties (JSON documents: the CSV and the CRDs).
func BundleObjects(b declcfg.Bundle) ([][]byte, error) {
	props, err := property.Parse(b.Properties)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", b.Name, err)
	}
	var out [][]byte
	for _, o := range props.BundleObjects {
		out = append(out, o.Data)
	}
	return out, nil
}

// Load reads the FBC in fsys with operator-registry's loader.
func Load(ctx context.Context, fsys fs.FS) (*declcfg.DeclarativeConfig, error) {
	return declcfg.LoadFS(ctx, fsys)
}
