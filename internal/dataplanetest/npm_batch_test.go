package dataplanetest_test

import (
	"path/filepath"
	"testing"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/npmsdk"
)

// npmSDKDir installs the official npm openai SDK of the gateway's
// testdata/npm-sdk (internal/npmsdk) and returns the directory with it and
// the scripts. It skips the test without node and npm.
func npmSDKDir(t *testing.T) string {
	t.Helper()
	return npmsdk.Dir(t, filepath.Join("..", "gateway", "testdata", "npm-sdk"))
}

// TestNpmSDKBatches drives the Files and Batch APIs through the data plane
// with the official npm openai SDK (batches.mjs): files.create,
// batches.create, batches.retrieve until completed, files.content, list,
// another token's 404s, files.delete.
func TestNpmSDKBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the npm openai SDK test (it installs the SDK with npm ci)")
	}
	dir := npmSDKDir(t)
	simCfg := dataplanetest.FastSim()
	s := startStack(t, simCfg, nil)
	dispatcher(t, s)
	npmsdk.Batches(t, dir, s.Gateway.URL+"/v1", dataplanetest.APIKey, dataplanetest.OtherAPIKey, simCfg.Model, 10)
}
