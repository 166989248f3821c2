package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/olm/bundle"
)

// TestCommittedBundleIsUpToDate regenerates the current release's bundle
// from config/, the CRD, the samples and the product chart, and compares it
// with bundle/. A change to any of those sources needs
// `make bundle VERSION=<version>` (and `make catalog`) in the same commit.
func TestCommittedBundleIsUpToDate(t *testing.T) {
	committed, err := bundle.Load("../../bundle")
	if err != nil {
		t.Fatal(err)
	}
	cfg := bundle.Default()
	cfg.Root = "../.."
	cfg.Version = committed.CSV.Spec.Version.String()
	res, err := generateBundle(context.Background(), cfg, "catalog/bundles")
	if err != nil {
		t.Fatalf("generating bundle %s: %v", cfg.Version, err)
	}
	for i, f := range res.Bundle.Files {
		if i >= len(committed.Files) || committed.Files[i].Name != f.Name || !bytes.Equal(committed.Files[i].Data, f.Data) {
			t.Errorf("bundle/manifests/%s is stale: run `make bundle VERSION=%s`", f.Name, cfg.Version)
		}
	}
	if len(res.Bundle.Files) != len(committed.Files) {
		t.Errorf("bundle/manifests has %d files, generation gives %d: run `make bundle VERSION=%s`", len(committed.Files), len(res.Bundle.Files), cfg.Version)
	}
	if d := cmp.Diff(committed.Annotations, res.Bundle.Annotations); d != "" {
		t.Errorf("bundle/metadata/annotations.yaml is stale (-committed +generated):\n%s", d)
	}
	df, err := os.ReadFile("../../bundle.Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(df, bundle.Dockerfile(res.Bundle.Annotations, "bundle")) {
		t.Errorf("bundle.Dockerfile is stale: run `make bundle VERSION=%s`", cfg.Version)
	}
}

// TestCommittedCatalogIsUpToDate regenerates the CRD carriers and
// re-renders the semver template, and compares them with catalog/carriers,
// catalog/configs (bundle images) and catalog/inline (no bundle images).
func TestCommittedCatalogIsUpToDate(t *testing.T) {
	src := catalogSources{root: "../..", template: "catalog/semver-template.yaml", current: "bundle", history: "catalog/bundles",
		carriers: "catalog/carriers.yaml", carrierDir: "catalog/carriers"}
	list, err := loadCarriers(src)
	if err != nil {
		t.Fatal(err)
	}
	current, err := bundle.Load("../../bundle")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		from, err := bundle.Load(filepath.Join("../../catalog/bundles", c.Replaces))
		if err != nil {
			t.Fatal(err)
		}
		want, err := bundle.Carrier(from, current, c.Version)
		if err != nil {
			t.Fatal(err)
		}
		got, err := bundle.Load(filepath.Join("../../catalog/carriers", c.Version))
		if err != nil {
			t.Fatalf("%v: run `make catalog`", err)
		}
		if !sameFiles(want, got) {
			t.Errorf("catalog/carriers/%s is stale: run `make catalog`", c.Version)
		}
	}
	out, err := renderCatalogYAML(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	for path, data := range map[string][]byte{
		"catalog/configs/orchestra-operator/catalog.yaml": out.images,
		"catalog/inline/orchestra-operator/catalog.yaml":  out.inline,
	} {
		committed, err := os.ReadFile(filepath.Join("../..", path))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(committed, data) {
			t.Errorf("%s is stale: run `make catalog`", path)
		}
	}
}
