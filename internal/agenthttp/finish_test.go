package agenthttp

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

func TestFinish(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name, tokenFile, method, path, auth string
		want                                int
	}{
		{"healthz", tok, http.MethodGet, "/healthz", "", http.StatusOK},
		{"metrics", tok, http.MethodGet, "/metrics", "", http.StatusOK},
		{"post without the token", tok, http.MethodPost, "/act", "", http.StatusUnauthorized},
		{"post with another token", tok, http.MethodPost, "/act", "Bearer other", http.StatusUnauthorized},
		{"post with the token", tok, http.MethodPost, "/act", "Bearer s3cret", http.StatusNoContent},
		{"post with no token file", "", http.MethodPost, "/act", "", http.StatusNoContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("POST /act", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
			h := Finish(mux, NewRegistry(), tc.tokenFile, log, "the test's")
			r := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Errorf("%s %s = %d, want %d (%s)", tc.method, tc.path, w.Code, tc.want, w.Body)
			}
		})
	}
}
