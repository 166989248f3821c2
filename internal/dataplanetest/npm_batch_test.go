package dataplanetest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	const n = 10
	cmd := exec.Command("node", "batches.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BASE_URL="+s.Gateway.URL+"/v1", "KEY_A="+dataplanetest.APIKey, "KEY_B="+dataplanetest.OtherAPIKey,
		"MODEL="+simCfg.Model, "LINES="+strconv.Itoa(n))
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node batches.mjs: %v\n%s\n%s", err, out, stderr)
	}
	var got struct {
		File    struct{ Purpose string }
		Created struct {
			Status   string
			Total    int
			Metadata map[string]string
		}
		Final struct {
			Status string
			Counts struct{ Total, Completed, Failed int }
			Error  *string
		}
		Results []struct {
			CustomID string `json:"custom_id"`
			Status   int
			Content  string
		}
		Listed             bool
		OtherTokenRetrieve any
		OtherTokenContent  any
		Deleted            bool
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("script output %s: %v", out, err)
	}
	if got.File.Purpose != "batch" || got.Created.Status != "validating" || got.Created.Total != n || got.Created.Metadata["run"] != "npm" {
		t.Errorf("file %+v, created batch %+v", got.File, got.Created)
	}
	if got.Final.Status != "completed" || got.Final.Counts.Total != n || got.Final.Counts.Completed != n || got.Final.Counts.Failed != 0 || got.Final.Error != nil {
		t.Errorf("final batch %+v", got.Final)
	}
	if len(got.Results) != n {
		t.Fatalf("%d results, want %d", len(got.Results), n)
	}
	for i, r := range got.Results {
		if r.CustomID != fmt.Sprintf("req-%d", i) || r.Status != 200 || r.Content == "" {
			t.Errorf("result line %d: %+v", i, r)
		}
	}
	if !got.Listed || got.OtherTokenRetrieve != float64(404) || got.OtherTokenContent != float64(404) || !got.Deleted {
		t.Errorf("listed %v, another token's retrieve %v and content %v, deleted %v", got.Listed, got.OtherTokenRetrieve, got.OtherTokenContent, got.Deleted)
	}
}
