// Package nodeapi is the wire protocol of the node agent
// (orchestra-agent --role node, internal/nodeagent): its paths,
// the requests and answers of its HTTP API, the authentication of its
// callers, and the one client, shared by the agent and the lifecycle
// leader that calls it. It imports nothing of either side.
//
// Authentication. The node agent keeps copies of the release's weights
// and, where process snapshots work, dumps and restores engine processes:
// its mutating endpoints (every method but GET and HEAD) accept only a
// caller of its own release, which proves it by the release's caller
// token, a Secret both the agent and the leader mount:
//
//	Authorization: Bearer <token>
//
// A call without it, or with another token, is refused with 401; while
// the agent has no token (its file is missing or empty) every mutating
// call is refused with 503. Reads (GET /report, GET /tiers, /healthz,
// /metrics) stay open to what the NetworkPolicy admits.
//
// Files:
//   - auth.go: TokenFile, Authorize, RequireCaller, Caller (the token
//     on any method: the sidecar's GET /model/files).
//   - client.go: the paths and THE client (Client.Call), which the
//     lifecycle leader calls every node agent with.
//   - tiers.go: Tier, Key, Entry, Budgets, the planned Action, and the
//     bodies of /tiers, /promote, /demote and /verify.
//   - records.go: WakeRecord and SleepRecord (POST /wakes, /sleeps).
//   - report.go: NodeReport (GET /report) and what it is made of:
//     tier, criu, runtime, cold-source, verification and promotion
//     reports, Bandwidth, Prediction.
//   - copies.go: CopyMeta (with CopyFile for a directory copy), the
//     metadata file beside each copy on disk, which the sidecar reads.
package nodeapi

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// TokenFile is the path of a file holding the release's caller token (a
// mounted Secret key). It is read at each use, so a Secret mounted or
// rotated after the start takes effect without a restart.
type TokenFile string

// ErrNoToken is returned while the token file is missing or empty.
var ErrNoToken = errors.New("no caller token")

// Read returns the token, without surrounding white space.
func (f TokenFile) Read() (string, error) {
	if f == "" {
		return "", ErrNoToken
	}
	b, err := os.ReadFile(string(f))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoToken, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrNoToken, f)
	}
	return tok, nil
}

// Authorize adds the caller token to req.
func Authorize(req *http.Request, token string) {
	req.Header.Set("Authorization", "Bearer "+token)
}

// mutating reports whether a request changes the agent's state.
func mutating(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead
}

// RequireCaller wraps the agent's handler: a mutating request passes only
// with the token in f; refuse writes the refusal (status, message).
func RequireCaller(f TokenFile, next http.Handler, refuse func(w http.ResponseWriter, status int, msg string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !mutating(r) || Caller(f, w, r, refuse) {
			next.ServeHTTP(w, r)
		}
	})
}

// Caller checks that r carries the token in f, whatever its method (a
// read that hands out the model's bytes requires it too); when it does
// not, it writes the refusal (503 while f has no token, else 401) and
// returns false.
func Caller(f TokenFile, w http.ResponseWriter, r *http.Request, refuse func(w http.ResponseWriter, status int, msg string)) bool {
	want, err := f.Read()
	if err != nil {
		refuse(w, http.StatusServiceUnavailable, fmt.Sprintf("%s %s refused: the agent has %v yet", r.Method, r.URL.Path, err))
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="orchestra-agent"`)
		who := "only the release's lifecycle leader may call it"
		if !mutating(r) {
			who = "only the release's node agent may read it"
		}
		refuse(w, http.StatusUnauthorized, fmt.Sprintf("%s %s refused: %s (Authorization: Bearer <the release's caller token>)", r.Method, r.URL.Path, who))
		return false
	}
	return true
}
