package npmsdk

import (
	"encoding/json"
	"errors"
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
	run(t, dir, "batches.mjs", &got, "BASE_URL="+baseURL, "KEY_A="+token, "KEY_B="+otherToken,
		"MODEL="+model, "LINES="+strconv.Itoa(lines))
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

// ResponsesResult is what responses.mjs saw: a stored response, its
// streamed continuation (events and deltas), retrieve, input items, another
// token's retrieve, a refused built-in tool, delete and a retrieve after it.
type ResponsesResult struct {
	First struct {
		ID, Status, Text string
		Usage            map[string]any
	}
	Second             struct{ ID, Text, Previous string }
	Events             []string
	Deltas             string
	Retrieved          string
	InputItems         []string
	OtherTokenRetrieve any
	UnsupportedTool    any
	Deleted            any
	RetrieveDeleted    any
}

// Responses drives the Responses API at baseURL (…/v1) with the official
// npm openai SDK (responses.mjs in dir, from Dir) and returns what it saw,
// for the caller to judge against its engine's answers.
func Responses(t testing.TB, dir, baseURL, token, otherToken, model string) ResponsesResult {
	t.Helper()
	var got ResponsesResult
	run(t, dir, "responses.mjs", &got, "BASE_URL="+baseURL, "KEY_A="+token, "KEY_B="+otherToken, "MODEL="+model)
	return got
}

// run runs the script of dir with node and env added to this process's,
// and decodes the one JSON object it prints into out.
func run(t testing.TB, dir, script string, out any, env ...string) {
	t.Helper()
	cmd := exec.Command("node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node %s: %v\n%s\n%s", script, err, b, stderr)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s printed %s: %v", script, b, err)
	}
}
