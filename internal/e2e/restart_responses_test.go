package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/npmsdk"
)

// storedResponse is a response the gateway stored, and its text.
type storedResponse struct{ id, text string }

// npmResponses drives the Responses API through the gateway's Service with
// the official npm openai SDK, as TestNpmSDK does in process
// (internal/gateway/testdata/npm-sdk/responses.mjs): a stored response, its
// streamed continuation, retrieve, input items, another token's 404, a
// refused built-in tool, delete. Every text is the simulator's answer to
// the chat the gateway translates the request into, word for word. It
// returns the first response, which stays stored.
func npmResponses(t *testing.T, ref simReference, base, token, otherToken, model string) storedResponse {
	t.Helper()
	dir := npmsdk.Dir(t, filepath.Join(env.root, "internal", "gateway", "testdata", "npm-sdk"))
	got := npmsdk.Responses(t, dir, base, token, otherToken, model)
	// instructions become a system message; a continuation puts the stored
	// conversation, output included, in front of its input, without the
	// earlier instructions (docs/gateway.md).
	first, err := ref.chat(0, "system", "Be brief.", "user", "Hi")
	if err != nil {
		t.Fatal(err)
	}
	second, err := ref.chat(0, "user", "Hi", "assistant", first, "user", "And again?")
	if err != nil {
		t.Fatal(err)
	}
	if got.First.Status != "completed" || got.First.Text != first || got.First.Usage["output_tokens"] == nil {
		t.Errorf("first response = %+v, want completed with the text %q and a usage", got.First, first)
	}
	if got.Deltas != second || got.Second.Text != second || got.Second.Previous != got.First.ID || got.Retrieved != second {
		t.Errorf("continuation: deltas %q, completed %+v, retrieved %q; want the text %q after %s", got.Deltas, got.Second, got.Retrieved, second, got.First.ID)
	}
	if n := len(got.Events); n < 2 || got.Events[0] != "response.created" || got.Events[n-1] != "response.completed" {
		t.Errorf("events = %v", got.Events)
	}
	if want := []string{"user: Hi", "assistant: " + first, "user: And again?"}; !slices.Equal(got.InputItems, want) {
		t.Errorf("input items = %q, want %q", got.InputItems, want)
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
	t.Logf("npm openai SDK on real pods: stored %s, continued it streamed (%d events), retrieved, listed its input items, 404 for another token, 400 for a built-in tool, deleted", got.First.ID, len(got.Events))
	return storedResponse{id: got.First.ID, text: got.First.Text}
}

// requireStoredResponse checks that the stored response is still there
// for its token, with its text, and not for another token.
func requireStoredResponse(ctx context.Context, t *testing.T, base, token, otherToken string, want storedResponse) {
	t.Helper()
	get := func(tok string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/responses/"+want.id, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		data, _ := io.ReadAll(resp.Body)
		var r struct {
			Output []struct {
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"output"`
		}
		_ = json.Unmarshal(data, &r)
		var b strings.Builder
		for _, o := range r.Output {
			for _, c := range o.Content {
				b.WriteString(c.Text)
			}
		}
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, string(data)
		}
		return resp.StatusCode, b.String()
	}
	if status, text := get(token); status != http.StatusOK || text != want.text {
		t.Errorf("GET /v1/responses/%s = %d %q, want 200 %q", want.id, status, text, want.text)
	}
	if status, _ := get(otherToken); status != http.StatusNotFound {
		t.Errorf("GET /v1/responses/%s with another token = %d, want 404", want.id, status)
	}
	t.Logf("%s", fmt.Sprintf("response %s, stored before the rollouts, read back whole after them", want.id))
}
