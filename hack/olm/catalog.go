package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/blang/semver/v4"
	"github.com/operator-framework/operator-registry/alpha/declcfg"
	"github.com/spf13/cobra"

	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/catalog"
)

func newCatalogCommand(root *string) *cobra.Command {
	var src catalogSources
	var output, inlineOutput string
	cmd := &cobra.Command{
		Use:   "catalog",
		Short: "Render the semver template into a File-Based Catalog",
		Long: `Render catalog/semver-template.yaml into an FBC with operator-registry's
semver template, deterministically. Each bundle image of the template is
resolved to a local bundle directory: the current release in bundle/ or an
earlier one in catalog/bundles/<version>/, rendered as opm render renders a
bundle directory. Unlike opm, each entry gets the skipRange of its CSV's
olm.skipRange, so that 0.2.0 (stable-v0) can upgrade to 1.0.0 (stable-v1);
--opm-compatible turns that off. The catalog is checked with opm validate's
code before it is written.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			src.root = *root
			written, err := writeCarriers(src)
			if err != nil {
				return err
			}
			for _, w := range written {
				fmt.Fprintf(cmd.OutOrStdout(), "CRD carrier written to %s\n", w)
			}
			outs, err := renderCatalogYAML(cmd.Context(), src)
			if err != nil {
				return err
			}
			for _, o := range []struct {
				path string
				data []byte
			}{{output, outs.images}, {inlineOutput, outs.inline}} {
				if o.path == "" {
					continue
				}
				path := filepath.Join(*root, o.path)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(path, o.data, 0o644); err != nil {
					return err
				}
				sum, err := catalog.Summary(cmd.Context(), os.DirFS(filepath.Dir(path)))
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "catalog written to %s: %s\n", o.path, sum)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&src.template, "template", "catalog/semver-template.yaml", "semver template")
	f.StringVar(&output, "output", "catalog/configs/orchestra-operator/catalog.yaml", "FBC file to write")
	f.StringVar(&inlineOutput, "inline-output", "catalog/inline/orchestra-operator/catalog.yaml", "FBC file to write without bundle images (bundles install from their inline objects); empty: none")
	f.StringVar(&src.current, "bundle", "bundle", "the current release's bundle directory")
	f.StringVar(&src.carriers, "carriers", "catalog/carriers.yaml", "the CRD carriers to generate (patch releases of older lines that ship the current CRDs)")
	f.StringVar(&src.carrierDir, "carrier-dir", "catalog/carriers", "directory the CRD carriers' bundles are written to")
	f.StringVar(&src.history, "history", "catalog/bundles", "directory of earlier releases' bundles")
	f.BoolVar(&src.opmCompatible, "opm-compatible", false, "write exactly what opm's semver template writes: no skipRange from the CSVs' olm.skipRange (which leaves no upgrade path across major channels)")
	return cmd
}

// catalogSources says where the template and the bundles are.
type catalogSources struct {
	root, template, current, history string
	carriers, carrierDir             string
	opmCompatible                    bool
}

// renderedCatalogs are the two FBC files rendered from one template: with
// bundle images, and without (bundles install from their inline objects).
type renderedCatalogs struct{ images, inline []byte }

// renderCatalogYAML renders the semver template from the local bundles,
// carries the CSVs' skipRanges unless opmCompatible, validates the result
// with opm validate's code and returns the FBC file, and its variant
// without bundle images (validated the same way).
func renderCatalogYAML(ctx context.Context, src catalogSources) (renderedCatalogs, error) {
	var none renderedCatalogs
	tmpl, err := os.ReadFile(filepath.Join(src.root, src.template))
	if err != nil {
		return none, err
	}
	dirs, err := localBundleDirs(filepath.Join(src.root, src.current), filepath.Join(src.root, src.history), carrierDirs(src))
	if err != nil {
		return none, err
	}
	images := bundle.Default()
	render := func(_ context.Context, image string) (*declcfg.DeclarativeConfig, error) {
		for version, dir := range dirs {
			if images.BundleImage(version) == image {
				return catalog.RenderBundleDir(dir, image)
			}
		}
		return nil, fmt.Errorf("no local bundle for %s: expected %s/ or %s/<version>/ with that version", image, src.current, src.history)
	}
	cfg, err := catalog.RenderTemplate(ctx, bytes.NewReader(tmpl), render)
	if err != nil {
		return none, err
	}
	if !src.opmCompatible {
		if err := catalog.ApplySkipRanges(cfg); err != nil {
			return none, err
		}
	}
	inline, err := catalog.Inline(cfg)
	if err != nil {
		return none, err
	}
	var out renderedCatalogs
	for _, c := range []struct {
		cfg    *declcfg.DeclarativeConfig
		header string
		to     *[]byte
	}{
		{cfg, "Generated by `go run ./hack/olm catalog` from " + src.template + "; do not edit.\nBundles install from their images (docs/olm.md).", &out.images},
		{inline, "Generated by `go run ./hack/olm catalog` from " + src.template + "; do not edit.\nBundles have no image: OLM installs them from their inline objects (docs/olm.md).", &out.inline},
	} {
		data, err := catalog.YAML(c.cfg, c.header)
		if err != nil {
			return none, err
		}
		if err := validateFBC(ctx, data); err != nil {
			return none, err
		}
		*c.to = data
	}
	return out, nil
}

// validateFBC checks one FBC file with opm validate's code.
func validateFBC(ctx context.Context, data []byte) error {
	dir, err := os.MkdirTemp("", "fbc-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := os.WriteFile(filepath.Join(dir, "catalog.yaml"), data, 0o644); err != nil {
		return err
	}
	if err := catalog.Validate(ctx, os.DirFS(dir)); err != nil {
		return fmt.Errorf("the rendered catalog is invalid: %w", err)
	}
	return nil
}

// localBundleDirs maps each release version to its bundle directory: the
// earlier ones under history, and the current one. When the current
// release is also kept in history, both must be identical.
func localBundleDirs(current, history string, carriers []string) (map[string]string, error) {
	hist, err := historyDirs(history)
	if err != nil {
		return nil, err
	}
	for _, dir := range carriers {
		c, err := bundle.Load(dir)
		if err != nil {
			return nil, err
		}
		v, err := semver.Parse(c.CSV.Spec.Version.String())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		released := false
		for _, h := range hist {
			if h.version.EQ(v) {
				if !sameFiles(h.bundle, c) {
					return nil, fmt.Errorf("%s and %s both hold version %s but differ; a released bundle must not change (give the carrier the next patch version)", dir, h.dir, v)
				}
				released = true
			}
		}
		if !released {
			hist = append(hist, historyBundle{dir: dir, version: v, bundle: c})
		}
	}
	out := map[string]string{}
	byVersion := map[string]*bundle.Bundle{}
	for _, h := range hist {
		out[h.version.String()] = h.dir
		byVersion[h.version.String()] = h.bundle
	}
	cur, err := bundle.Load(current)
	if err != nil {
		return nil, err
	}
	v, err := semver.Parse(cur.CSV.Spec.Version.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", current, err)
	}
	if old, ok := byVersion[v.String()]; ok {
		if !sameFiles(old, cur) {
			return nil, fmt.Errorf("%s and %s/%s both hold version %s but differ; a released bundle must not change", current, history, v, v)
		}
		return out, nil
	}
	out[v.String()] = current
	return out, nil
}

func sameFiles(a, b *bundle.Bundle) bool {
	if len(a.Files) != len(b.Files) {
		return false
	}
	for i := range a.Files {
		if a.Files[i].Name != b.Files[i].Name || !bytes.Equal(a.Files[i].Data, b.Files[i].Data) {
			return false
		}
	}
	return true
}
