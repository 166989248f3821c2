package nodeapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/nodeapi"
)

// The client sends the release's token on every mutating call and on no
// read, and the agent's check lets exactly those calls through.
func TestClientCarriesTheCallerToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(" release-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	agent := nodeapi.RequireCaller(nodeapi.TokenFile(file), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen[r.Method+" "+r.URL.Path] = r.Header.Get("Authorization")
		_, _ = w.Write([]byte(`{}`))
	}), func(w http.ResponseWriter, status int, msg string) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error":{"message":` + `"` + msg + `"}}`))
	})
	srv := httptest.NewServer(agent)
	defer srv.Close()
	ctx := context.Background()

	c := nodeapi.Client{URL: srv.URL, Token: nodeapi.TokenFile(file)}
	if err := c.Call(ctx, http.MethodPost, nodeapi.PathDemote, map[string]string{"namespace": "ns"}, nil); err != nil {
		t.Fatalf("POST with the token: %v", err)
	}
	if err := c.Call(ctx, http.MethodGet, nodeapi.PathReport, nil, nil); err != nil {
		t.Fatalf("GET: %v", err)
	}
	if got := seen["POST /demote"]; got != "Bearer release-token" {
		t.Errorf("POST /demote carried %q; want the trimmed token", got)
	}
	if got := seen["GET /report"]; got != "" {
		t.Errorf("GET /report carried %q; reads carry no token", got)
	}

	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("another-release"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := nodeapi.Client{URL: srv.URL, Token: nodeapi.TokenFile(other)}.Call(ctx, http.MethodPost, nodeapi.PathPromote, struct{}{}, nil)
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("POST with another release's token: %v; want a 401", err)
	}
	err = nodeapi.Client{URL: srv.URL, Token: nodeapi.TokenFile(filepath.Join(t.TempDir(), "missing"))}.Call(ctx, http.MethodPost, nodeapi.PathPromote, struct{}{}, nil)
	if err == nil || !strings.Contains(err.Error(), "no caller token") {
		t.Errorf("POST while the client's token file is missing: %v; want ErrNoToken before any call", err)
	}
}
