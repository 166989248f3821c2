package gateway

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/npmsdk"
)

// npmSDKDir installs the official npm openai SDK of testdata/npm-sdk
// (pinned by its package-lock.json) and returns the directory with it and
// the test scripts (internal/npmsdk). It skips the test without node and npm.
func npmSDKDir(t *testing.T) string {
	t.Helper()
	return npmsdk.Dir(t, filepath.Join("testdata", "npm-sdk"))
}

// TestNpmSDK drives the Responses API with the official npm openai SDK
// (testdata/npm-sdk/responses.mjs): a stored response, its streamed
// continuation, retrieve, input items, another token's 404, a refused
// built-in tool, delete.
func TestNpmSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the npm openai SDK test (it installs the SDK with npm ci)")
	}
	dir := npmSDKDir(t)
	h := newResponsesHarness(t)
	got := npmsdk.Responses(t, dir, h.srv.URL+"/v1", aliceToken, bobToken, "llama-3-8b")
	answer := strings.Join(chatWords, "")
	if got.First.Status != "completed" || got.First.Text != answer || got.First.Usage["output_tokens"] != float64(fakeCompletionTokens) {
		t.Errorf("first response = %+v", got.First)
	}
	if got.Deltas != answer || got.Second.Text != answer || got.Second.Previous != got.First.ID || got.Retrieved != answer {
		t.Errorf("continuation: deltas %q, completed %+v, retrieved %q", got.Deltas, got.Second, got.Retrieved)
	}
	if n := len(got.Events); n < 2 || got.Events[0] != "response.created" || got.Events[n-1] != "response.completed" {
		t.Errorf("events = %v", got.Events)
	}
	if diff := cmp.Diff([]string{"user: Hi", "assistant: " + answer, "user: And again?"}, got.InputItems); diff != "" {
		t.Errorf("input items (-want +got):\n%s", diff)
	}
	for name, pair := range map[string][2]any{
		"another token's retrieve": {got.OtherTokenRetrieve, float64(404)},
		"a built-in tool":          {got.UnsupportedTool, float64(400)},
		"delete":                   {got.Deleted, float64(200)},
		"retrieve after delete":    {got.RetrieveDeleted, float64(404)},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s: %v, want %v", name, pair[0], pair[1])
		}
	}
}
