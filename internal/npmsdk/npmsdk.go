// Package npmsdk installs the official npm openai SDK for the tests that
// drive the gateway with it: the in-process ones (internal/gateway) and the
// ones on real pods (internal/e2e). The SDK is pinned by the package-lock.json
// of internal/gateway/testdata/npm-sdk and installed with npm ci, once per
// lock file, into the user cache directory.
package npmsdk

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Dir installs the npm packages of src (a directory with package.json and
// package-lock.json, and the test scripts) into a cache directory keyed by
// the lock file, copies src's files next to them and returns that
// directory. It skips the test when node or npm is missing.
func Dir(t testing.TB, src string) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: skipping the npm openai SDK test", tool)
		}
	}
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "model-orchestra", "npm-sdk-"+hex.EncodeToString(sum[:8]))
	files, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		cmd := exec.Command("npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}
