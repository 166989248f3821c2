package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/olm/bundle"
)

// copyBundle copies a bundle directory (manifests/ and metadata/).
func copyBundle(t *testing.T, from, to string) {
	t.Helper()
	b, err := bundle.Load(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(to); err != nil {
		t.Fatal(err)
	}
}

func TestHistoryFolderMustBeNamedAfterItsVersion(t *testing.T) {
	hist := t.TempDir()
	copyBundle(t, "../../catalog/bundles/0.2.0", filepath.Join(hist, "0.3.0"))
	_, err := historyDirs(hist)
	if err == nil || !strings.Contains(err.Error(), "name the folder after the version") {
		t.Fatalf("err = %v", err)
	}
}

func TestReleasedBundleMustNotChange(t *testing.T) {
	hist := t.TempDir()
	copyBundle(t, "../../bundle", filepath.Join(hist, "1.0.0"))
	// Identical copies are fine: the current release is in both places.
	bs, err := localBundleDirs("../../bundle", hist, nil)
	if err != nil {
		t.Fatalf("identical bundle in history: %v", err)
	}
	if len(bs) != 1 {
		t.Fatalf("got %d bundles, want the one", len(bs))
	}
	// An edited copy is refused.
	csv := filepath.Join(hist, "1.0.0", "manifests", "orchestra-operator.clusterserviceversion.yaml")
	data, err := os.ReadFile(csv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(csv, append(data, []byte("# edited\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := localBundleDirs("../../bundle", hist, nil); err == nil || !strings.Contains(err.Error(), "must not change") {
		t.Fatalf("err = %v, want a refusal", err)
	}
}
