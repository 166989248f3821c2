package sidecarapi

// The model's files, as the sidecar hands them to its node agent. The
// engine's sidecar mounts the model cache (read-only) whatever its access
// mode; the node agent, a DaemonSet on every node, can mount it only when
// it is a ReadWriteMany claim. So where the agent cannot read the cache it
// asks the sidecar of an engine on its node for the files it copies into
// its hot or warm tier:
//
//	GET /model/files          200 with ModelFiles: the files of the engine's model the
//	                          fetcher's manifest lists (complete, each with its sha256);
//	                          409 when the manifest cannot vouch for them
//	GET /model/files/{path}   200 with the bytes of one listed file, Content-Length its
//	                          size and HeaderSHA256 its manifest sha256; 404 for a path
//	                          the listing does not hold
//
// Both require the release's caller token, on GET too (the bytes are the
// model's weights): 401 without it. The sidecar only reads; the node
// agent is the one that verifies (it hashes every byte with sha256 as it
// writes the copy under a temporary name and places the copy only when the
// manifest's sha256 matches) and the one that owns the tiers' budgets and
// eviction.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/model-orchestra/operator/internal/nodeapi"
)

// PathModelFiles is the sidecar's listing of its engine's model files;
// PathModelFiles + "/" + path is one file.
const PathModelFiles = "/model/files"

// HeaderSHA256 carries a served file's manifest sha256.
const HeaderSHA256 = "X-Orchestra-Sha256"

// ModelFiles is the body of GET /model/files.
type ModelFiles struct {
	// Root is the model inside the cache, as the engine is told to load
	// it: one file (a GGUF) or a directory (vLLM's safetensors model,
	// "" for the cache's root).
	Root string `json:"root"`
	// Dir is true when Root is a directory: Files are then paths inside
	// it, and a copy of the model is a directory holding all of them.
	Dir bool `json:"dir,omitempty"`
	// Files are the files to copy, with the fetcher's manifest size and
	// sha256. For a single file, its one entry's Path is Root's base name.
	Files []ModelFile `json:"files"`
}

// ModelFile is one file of the model.
type ModelFile struct {
	// Path is the file's path inside Root (a directory), or Root's base
	// name (a single file); slash-separated, local.
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Bytes is the files' total size.
func (m ModelFiles) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Bytes
	}
	return n
}

// ModelFiles is GET /model/files, with the caller token.
func (c Client) ModelFiles(ctx context.Context) (ModelFiles, error) {
	var out ModelFiles
	resp, err := c.get(ctx, PathModelFiles, "model files")
	if err != nil {
		return out, err
	}
	defer func() { _ = resp.Body.Close() }()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&out); err != nil {
		return out, fmt.Errorf("sidecar model files: decoding the answer: %w", err)
	}
	return out, nil
}

// OpenModelFile is GET /model/files/{path}: the file's bytes (the caller
// closes them), their number and the manifest sha256 the sidecar names.
func (c Client) OpenModelFile(ctx context.Context, p string) (io.ReadCloser, int64, string, error) {
	if !localSlash(p) {
		return nil, 0, "", fmt.Errorf("model file %q must be a local slash-separated path", p)
	}
	parts := strings.Split(p, "/")
	for i := range parts {
		parts[i] = url.PathEscape(parts[i])
	}
	resp, err := c.get(ctx, PathModelFiles+"/"+strings.Join(parts, "/"), "model file "+p)
	if err != nil {
		return nil, 0, "", err
	}
	n, err := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	if err != nil || n < 0 {
		_ = resp.Body.Close()
		return nil, 0, "", fmt.Errorf("sidecar model file %s: no Content-Length in the answer", p)
	}
	return resp.Body, n, resp.Header.Get(HeaderSHA256), nil
}

// get sends an authenticated GET and returns a 2xx answer, whose body
// the caller closes; any other answer is an *Error.
func (c Client) get(ctx context.Context, p, op string) (*http.Response, error) {
	client := c.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.URL, "/")+p, nil)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		tok, err := c.Token.Read()
		if err != nil {
			return nil, fmt.Errorf("sidecar %s: %w", op, err)
		}
		nodeapi.Authorize(req, tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sidecar %s: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, &Error{Op: op, Status: resp.StatusCode, Message: errorMessage(b)}
	}
	return resp, nil
}

// errorMessage is the message of an agenthttp error body, else the body.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(b))
}

// localSlash reports whether p is a relative slash-separated path that
// stays inside its root.
func localSlash(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || strings.ContainsRune(p, 0) {
		return false
	}
	c := path.Clean(p)
	return c == p && c != "." && c != ".." && !strings.HasPrefix(c, "../")
}

// LocalPath reports whether p is a path a listing may hold: relative,
// slash-separated, clean, inside its root.
func LocalPath(p string) bool { return localSlash(p) }
