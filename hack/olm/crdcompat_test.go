package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/operator-framework/operator-registry/alpha/declcfg"

	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/catalog"
	"github.com/model-orchestra/operator/internal/olm/check"
)

// writeCatalog renders the bundle directories into an FBC (bundles only,
// as opm render writes them) in a new directory.
func writeCatalog(t *testing.T, dirs ...string) string {
	t.Helper()
	var cfg declcfg.DeclarativeConfig
	for _, d := range dirs {
		b, err := bundle.Load(d)
		if err != nil {
			t.Fatal(err)
		}
		r, err := catalog.RenderBundleDir(d, bundle.Default().BundleImage(b.CSV.Spec.Version.String()))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Bundles = append(cfg.Bundles, r.Bundles...)
	}
	data, err := catalog.YAML(&cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "catalog.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// The pair that lost users' data under the real OLM: 1.0.0 installed, then
// 0.2.0 in another namespace replaced the shared CRD with its own, which
// lacks spec.applications.*.lifecycle. check-crd-compat must refuse a
// catalog offering both, in that order only.
func TestCheckCRDCompatRefusesAPairThatDropsAField(t *testing.T) {
	dir := writeCatalog(t, "../../catalog/bundles/0.2.0", "../../bundle")
	rep, n, err := checkCatalogInstallOrders(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d bundles, want 2", n)
	}
	var downgrade, upgrade []check.Finding
	for _, f := range rep.Errors() {
		switch {
		case strings.HasPrefix(f.Object, "installing orchestra-operator.v0.2.0 after orchestra-operator.v1.0.0: "):
			downgrade = append(downgrade, f)
		case strings.HasPrefix(f.Object, "installing orchestra-operator.v1.0.0 after orchestra-operator.v0.2.0: "):
			upgrade = append(upgrade, f)
		default:
			t.Errorf("unexpected finding %s", f)
		}
	}
	found := false
	for _, f := range downgrade {
		if f.Rule == "crd-field-removed" && strings.Contains(f.Message, ".spec.applications.*.lifecycle") {
			found = true
		}
	}
	if !found {
		t.Errorf("installing 0.2.0 after 1.0.0: no crd-field-removed finding for .spec.applications.*.lifecycle; findings: %v", downgrade)
	}
	if len(upgrade) != 0 {
		t.Errorf("installing 1.0.0 after 0.2.0 should be compatible, got %v", upgrade)
	}

	// The committed catalogs, where 0.2.1 carries 1.0.0's CRDs, pass.
	for _, c := range []string{"../../catalog/configs", "../../catalog/inline"} {
		rep, n, err := checkCatalogInstallOrders(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if n < 2 || rep.HasErrors() {
			t.Errorf("%s: %d bundles, errors %v", c, n, rep.Errors())
		}
	}
}
