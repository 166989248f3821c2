package fetch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// hfSource reads a model repository from a Hugging Face compatible hub.
type hfSource struct {
	client   *http.Client
	endpoint string // without trailing slash
	repo     string
	revision string // as asked; replaced by the commit after List
	token    string
}

type hfRevisionInfo struct {
	SHA string `json:"sha"`
}

type hfTreeEntry struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	OID  string `json:"oid"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

func (s *hfSource) getJSON(ctx context.Context, u, what string, out any) (next string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", permanent(err)
	}
	req.Header.Set("Accept", "application/json")
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = resp.Body.Close() }() // read-only body
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused; the status is the error.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return "", newStatusError(resp, what)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return "", fmt.Errorf("%s: decoding response: %w", what, err)
	}
	return nextLink(resp.Header.Get("Link")), nil
}

// nextLink extracts the rel="next" target of a Link header.
func nextLink(h string) string {
	for _, part := range strings.Split(h, ",") {
		target, params, ok := strings.Cut(part, ";")
		if !ok || !strings.Contains(params, `rel="next"`) {
			continue
		}
		return strings.Trim(strings.TrimSpace(target), "<>")
	}
	return ""
}

// List resolves the revision to a commit and lists every file at it.
func (s *hfSource) List(ctx context.Context) ([]RemoteFile, string, error) {
	var info hfRevisionInfo
	revURL := fmt.Sprintf("%s/api/models/%s/revision/%s", s.endpoint, s.repo, url.PathEscape(s.revision))
	if _, err := s.getJSON(ctx, revURL, fmt.Sprintf("resolving %s@%s", s.repo, s.revision), &info); err != nil {
		return nil, "", err
	}
	if info.SHA != "" {
		s.revision = info.SHA
	}
	var files []RemoteFile
	u := fmt.Sprintf("%s/api/models/%s/tree/%s?recursive=true", s.endpoint, s.repo, url.PathEscape(s.revision))
	for pages := 0; u != ""; pages++ {
		if pages > 10000 {
			return nil, "", permanent(fmt.Errorf("listing %s: too many pages", s.repo))
		}
		var entries []hfTreeEntry
		next, err := s.getJSON(ctx, u, "listing "+s.repo, &entries)
		if err != nil {
			return nil, "", err
		}
		for _, e := range entries {
			if e.Type != "file" {
				continue
			}
			if err := safeRelPath(e.Path); err != nil {
				return nil, "", permanent(fmt.Errorf("listing %s: %w", s.repo, err))
			}
			f := RemoteFile{Path: e.Path, Size: e.Size}
			if e.LFS != nil {
				f.SHA256 = strings.ToLower(e.LFS.OID)
				f.Size = e.LFS.Size
			} else {
				f.GitOID = strings.ToLower(e.OID)
			}
			files = append(files, f)
		}
		if next != "" {
			nu, err := url.Parse(u)
			if err != nil {
				return nil, "", permanent(err)
			}
			ref, err := nu.Parse(next)
			if err != nil {
				return nil, "", permanent(fmt.Errorf("listing %s: bad next link %q", s.repo, next))
			}
			next = ref.String()
		}
		u = next
	}
	return files, info.SHA, nil
}

func (s *hfSource) resolveURL(p string) string {
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	return fmt.Sprintf("%s/%s/resolve/%s/%s", s.endpoint, s.repo, url.PathEscape(s.revision), strings.Join(segs, "/"))
}

func (s *hfSource) OpenRange(ctx context.Context, f RemoteFile, off, length int64) (io.ReadCloser, error) {
	return openHTTPRange(ctx, s.client, s.resolveURL(f.Path), s.token, off, length, "downloading "+f.Path)
}
