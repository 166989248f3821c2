package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
)

// RemoteFile is one file a source offers.
type RemoteFile struct {
	// Path is the slash-separated path relative to the destination.
	Path string
	Size int64
	// SHA256 is the expected hex digest, when the source knows it.
	SHA256 string
	// GitOID is the git blob id (sha1) of a small hub file stored in git.
	GitOID string
	// ETag identifies the object version for S3 sources.
	ETag string
	// key is the source-specific address (S3 key, URL).
	key string
}

// Source lists and reads the files of one model.
type Source interface {
	// List returns the files to fetch and the resolved revision (commit) if
	// the source has one.
	List(ctx context.Context) (files []RemoteFile, revision string, err error)
	// OpenRange returns length bytes of f starting at off.
	OpenRange(ctx context.Context, f RemoteFile, off, length int64) (io.ReadCloser, error)
}

// matchGlob matches a path.Match glob against p; a glob without "/" also
// matches the base name, and "**/" is accepted as "any directories".
func matchGlob(glob, p string) bool {
	if strings.HasPrefix(glob, "**/") {
		rest := glob[3:]
		if matchGlob(rest, p) {
			return true
		}
		for i := 0; i < len(p); i++ {
			if p[i] == '/' && matchGlob(rest, p[i+1:]) {
				return true
			}
		}
		return false
	}
	if ok, _ := path.Match(glob, p); ok {
		return true
	}
	if !strings.Contains(glob, "/") {
		ok, _ := path.Match(glob, path.Base(p))
		return ok
	}
	return false
}

// selectFiles keeps the files matched by include (all when empty) and not by
// exclude.
func selectFiles(files []RemoteFile, include, exclude []string) []RemoteFile {
	var out []RemoteFile
	for _, f := range files {
		in := len(include) == 0
		for _, g := range include {
			if matchGlob(g, f.Path) {
				in = true
				break
			}
		}
		for _, g := range exclude {
			if matchGlob(g, f.Path) {
				in = false
				break
			}
		}
		if in {
			out = append(out, f)
		}
	}
	return out
}

// safeRelPath rejects paths that would escape the destination.
func safeRelPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("unsafe file path %q", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("unsafe file path %q", p)
		}
	}
	if p == metaDir || strings.HasPrefix(p, metaDir+"/") {
		return fmt.Errorf("file path %q collides with the cache metadata directory", p)
	}
	return nil
}

// newHTTPClient builds the client used for hub and https sources: no
// transparent compression (ranges must be byte-exact), header timeout,
// and Authorization dropped when a redirect leaves the original host (a CDN
// with signed URLs rejects a second credential).
func newHTTPClient(cfg Config) *http.Client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: cfg.RequestTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   cfg.RequestTimeout,
		ResponseHeaderTimeout: cfg.RequestTimeout,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          cfg.Concurrency * 2,
		MaxIdleConnsPerHost:   cfg.Concurrency * 2,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		// HTTP/1.1 on purpose: each range gets its own TCP connection (and
		// congestion window) instead of sharing one HTTP/2 connection.
		ForceAttemptHTTP2: false,
		ReadBufferSize:    256 << 10,
		WriteBufferSize:   64 << 10,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			if req.URL.Host != via[0].URL.Host {
				req.Header.Del("Authorization")
			}
			return nil
		},
	}
}

// openHTTPRange GETs url with a Range header and returns a body of exactly
// length bytes from off. A server that ignores Range (200) is tolerated by
// skipping to off.
func openHTTPRange(ctx context.Context, c *http.Client, url, token string, off, length int64, what string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, permanent(fmt.Errorf("%s: %w", what, err))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+length-1))
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		start, ok := contentRangeStart(resp.Header.Get("Content-Range"))
		if !ok || start != off {
			_ = resp.Body.Close() // read-only body; the range mismatch is the error
			return nil, permanent(fmt.Errorf("%s: server answered range %q for bytes %d-", what, resp.Header.Get("Content-Range"), off))
		}
		return &limitedBody{r: io.LimitReader(resp.Body, length), c: resp.Body}, nil
	case http.StatusOK:
		if off > 0 {
			if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil {
				_ = resp.Body.Close() // read-only body; the copy error is returned
				return nil, fmt.Errorf("%s: skipping to offset %d of a non-ranged response: %w", what, off, err)
			}
		}
		return &limitedBody{r: io.LimitReader(resp.Body, length), c: resp.Body}, nil
	default:
		// Drain a little so the connection can be reused; the status is the error.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		return nil, newStatusError(resp, what)
	}
}

type limitedBody struct {
	r io.Reader
	c io.Closer
}

func (b *limitedBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *limitedBody) Close() error               { return b.c.Close() }

func contentRangeStart(h string) (int64, bool) {
	h = strings.TrimPrefix(h, "bytes ")
	first, _, ok := strings.Cut(h, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}

// httpsSource is a single file at an http(s) URL.
type httpsSource struct {
	client *http.Client
	url    string
	token  string
	sha256 string
}

func (s *httpsSource) List(ctx context.Context) ([]RemoteFile, string, error) {
	name := path.Base(strings.SplitN(strings.SplitN(s.url, "?", 2)[0], "#", 2)[0])
	if err := safeRelPath(name); err != nil {
		return nil, "", permanent(fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	size, err := s.size(ctx)
	if err != nil {
		return nil, "", err
	}
	return []RemoteFile{{Path: name, Size: size, SHA256: strings.ToLower(s.sha256), key: s.url}}, "", nil
}

// size asks for the first byte and reads the total from Content-Range, which
// works on servers that refuse HEAD too.
func (s *httpsSource) size(ctx context.Context) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return 0, permanent(err)
	}
	req.Header.Set("Range", "bytes=0-0")
	req.Header.Set("Accept-Encoding", "identity")
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("sizing %s: %w", s.url, err)
	}
	defer func() { _ = resp.Body.Close() }() // read-only body
	// Drain a little so the connection can be reused; only headers matter.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	switch resp.StatusCode {
	case http.StatusPartialContent:
		cr := resp.Header.Get("Content-Range")
		if i := strings.LastIndexByte(cr, '/'); i >= 0 {
			if n, err := strconv.ParseInt(cr[i+1:], 10, 64); err == nil {
				return n, nil
			}
		}
		return 0, permanent(fmt.Errorf("sizing %s: unusable Content-Range %q", s.url, cr))
	case http.StatusOK:
		if resp.ContentLength >= 0 {
			return resp.ContentLength, nil
		}
		return 0, permanent(fmt.Errorf("sizing %s: server reports no length", s.url))
	default:
		return 0, newStatusError(resp, "sizing "+s.url)
	}
}

func (s *httpsSource) OpenRange(ctx context.Context, f RemoteFile, off, length int64) (io.ReadCloser, error) {
	return openHTTPRange(ctx, s.client, f.key, s.token, off, length, "downloading "+f.Path)
}
