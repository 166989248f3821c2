package npmsdk

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Batches drives the Files and Batch APIs at baseURL (…/v1) with the
// official npm openai SDK (batches.mjs in dir, from Dir): files.create of
// lines chat requests for model, batches.create, batches.retrieve until the
// batch ends, files.content of its output, batches.list, another token's
// retrieve and content (both must be 404) and files.delete. It fails t
// unless the batch completed with exact counts and one 200 answer with
// content per line, in input order, each with its custom_id.
func Batches(t testing.TB, dir, baseURL, token, otherToken, model string, lines int) {
	t.Helper()
	cmd := exec.Command("node", "batches.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BASE_URL="+baseURL, "KEY_A="+token, "KEY_B="+otherToken,
		"MODEL="+model, "LINES="+strconv.Itoa(lines))
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
	if got.File.Purpose != "batch" || got.Created.Status != "validating" || got.Created.Total != lines || got.Created.Metadata["run"] != "npm" {
		t.Errorf("file %+v, created batch %+v", got.File, got.Created)
	}
	if got.Final.Status != "completed" || got.Final.Counts.Total != lines || got.Final.Counts.Completed != lines || got.Final.Counts.Failed != 0 || got.Final.Error != nil {
		t.Errorf("final batch %+v", got.Final)
	}
	if len(got.Results) != lines {
		t.Fatalf("%d results, want %d", len(got.Results), lines)
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
