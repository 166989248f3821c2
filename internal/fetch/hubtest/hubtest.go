// Package hubtest is a Hugging Face compatible hub for tests and the local
// demo: revision and tree APIs (with LFS sha256 and sizes, paginated),
// resolve/{rev}/{file} with Range, LFS files redirected to a separate CDN
// handler with signed URLs, optional bearer-token auth, and fault injection.
package hubtest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
)

// File is one file of a repository.
type File struct {
	Path    string
	Content fetchtest.Content
	// LFS files are listed with their sha256 and served through the CDN;
	// others are listed with their git blob id and served directly.
	LFS bool
	// ListedSHA256 overrides the sha256 the listing advertises (to simulate
	// corruption); empty means the real digest.
	ListedSHA256 string
}

// Repo is a model repository at one commit.
type Repo struct {
	ID     string // org/name
	Commit string // 40 hex digits; derived from ID when empty
	// Refs are extra revision names (tags, branches) besides "main".
	Refs  []string
	Files []File

	sums map[string]string // path -> sha256 (LFS) or git oid
}

// Server is the fake hub. Create it with New, or use Handler/CDNHandler
// directly under your own listener.
type Server struct {
	// Token, when set, is required as "Authorization: Bearer <Token>".
	Token string
	// PageSize of the tree listing (default 1000).
	PageSize int

	Faults fetchtest.Faults
	Stats  fetchtest.Stats

	hub, cdn *httptest.Server
	cdnBase  string

	mu    sync.RWMutex
	repos map[string]*Repo
}

// New starts a hub and a separate CDN on loopback.
func New(repos ...*Repo) *Server {
	s := &Server{}
	for _, r := range repos {
		s.AddRepo(r)
	}
	s.cdn = httptest.NewServer(s.CDNHandler())
	s.cdnBase = s.cdn.URL
	s.hub = httptest.NewServer(s.Handler())
	return s
}

// URL is the hub endpoint (for --hf-endpoint).
func (s *Server) URL() string { return s.hub.URL }

// SetCDNBase sets where LFS downloads are redirected (when not using New).
// Empty means a relative redirect to /cdn/ on the hub's own host, which
// works behind any Service name.
func (s *Server) SetCDNBase(u string) { s.cdnBase = strings.TrimRight(u, "/") }

// Close stops both servers.
func (s *Server) Close() {
	if s.hub != nil {
		s.hub.Close()
	}
	if s.cdn != nil {
		s.cdn.Close()
	}
}

// AddRepo adds (or replaces) a repository, hashing its files.
func (s *Server) AddRepo(r *Repo) {
	if r.Commit == "" {
		h := sha1.Sum([]byte("commit:" + r.ID))
		r.Commit = hex.EncodeToString(h[:])
	}
	r.sums = map[string]string{}
	for _, f := range r.Files {
		switch {
		case f.LFS && f.ListedSHA256 != "":
			r.sums[f.Path] = f.ListedSHA256 // not hashed: content may be huge or wrong on purpose
		case f.LFS:
			r.sums[f.Path] = fetchtest.SHA256(f.Content)
		default:
			h := sha1.New()
			_, _ = fmt.Fprintf(h, "blob %d\x00", f.Content.Size()) // hash writes never fail
			if _, err := io.Copy(h, io.NewSectionReader(f.Content, 0, f.Content.Size())); err != nil {
				panic(err) // as fetchtest.SHA256: test content must be readable
			}
			r.sums[f.Path] = hex.EncodeToString(h.Sum(nil))
		}
	}
	s.mu.Lock()
	if s.repos == nil {
		s.repos = map[string]*Repo{}
	}
	s.repos[r.ID] = r
	s.mu.Unlock()
}

func (s *Server) repo(id, rev string) (*Repo, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.repos[id]
	if !ok {
		return nil, false
	}
	if rev == "main" || rev == r.Commit {
		return r, true
	}
	for _, ref := range r.Refs {
		if ref == rev {
			return r, true
		}
	}
	return nil, false
}

func (r *Repo) file(p string) (File, bool) {
	for _, f := range r.Files {
		if f.Path == p {
			return f, true
		}
	}
	return File{}, false
}

func (s *Server) authorized(req *http.Request) bool {
	return s.Token == "" || req.Header.Get("Authorization") == "Bearer "+s.Token
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client is gone
}

func hubError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg}) // client gone if this fails
}

// Handler serves the hub API and resolve endpoints.
func (s *Server) Handler() http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("GET /api/models/{org}/{name}/revision/{rev}", s.revision)
	api.HandleFunc("GET /api/models/{org}/{name}/tree/{rev}", s.tree)
	files := http.NewServeMux()
	files.HandleFunc("GET /{org}/{name}/resolve/{rev}/{path...}", s.resolve)
	files.HandleFunc("HEAD /{org}/{name}/resolve/{rev}/{path...}", s.resolve)
	cdn := s.CDNHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch {
		case strings.HasPrefix(req.URL.Path, "/cdn/"):
			cdn.ServeHTTP(w, req)
		case strings.HasPrefix(req.URL.Path, "/api/"):
			api.ServeHTTP(w, req)
		default:
			files.ServeHTTP(w, req)
		}
	})
}

func (s *Server) revision(w http.ResponseWriter, req *http.Request) {
	s.Stats.Count("api")
	if !s.authorized(req) {
		hubError(w, http.StatusUnauthorized, "Invalid credentials in Authorization header")
		return
	}
	r, ok := s.repo(req.PathValue("org")+"/"+req.PathValue("name"), req.PathValue("rev"))
	if !ok {
		hubError(w, http.StatusNotFound, "Repository or revision not found")
		return
	}
	siblings := make([]map[string]string, 0, len(r.Files))
	for _, f := range r.Files {
		siblings = append(siblings, map[string]string{"rfilename": f.Path})
	}
	writeJSON(w, map[string]any{"id": r.ID, "sha": r.Commit, "siblings": siblings})
}

type treeEntry struct {
	Type string    `json:"type"`
	OID  string    `json:"oid"`
	Size int64     `json:"size"`
	Path string    `json:"path"`
	LFS  *lfsEntry `json:"lfs,omitempty"`
}

type lfsEntry struct {
	OID         string `json:"oid"`
	Size        int64  `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

func (s *Server) tree(w http.ResponseWriter, req *http.Request) {
	s.Stats.Count("api")
	if !s.authorized(req) {
		hubError(w, http.StatusUnauthorized, "Invalid credentials in Authorization header")
		return
	}
	r, ok := s.repo(req.PathValue("org")+"/"+req.PathValue("name"), req.PathValue("rev"))
	if !ok {
		hubError(w, http.StatusNotFound, "Repository or revision not found")
		return
	}
	var entries []treeEntry
	dirs := map[string]bool{}
	for _, f := range r.Files {
		for d := f.Path; strings.Contains(d, "/"); {
			d = d[:strings.LastIndex(d, "/")]
			dirs[d] = true
		}
		e := treeEntry{Type: "file", Path: f.Path, Size: f.Content.Size(), OID: r.sums[f.Path]}
		if f.LFS {
			sum := r.sums[f.Path]
			if f.ListedSHA256 != "" {
				sum = f.ListedSHA256
			}
			h := sha1.Sum([]byte("pointer:" + sum))
			e.OID = hex.EncodeToString(h[:])
			e.Size = f.Content.Size()
			e.LFS = &lfsEntry{OID: sum, Size: f.Content.Size(), PointerSize: 134}
		}
		entries = append(entries, e)
	}
	for d := range dirs {
		entries = append(entries, treeEntry{Type: "directory", Path: d, OID: "0000000000000000000000000000000000000000"})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })

	pageSize := s.PageSize
	if pageSize <= 0 {
		pageSize = 1000
	}
	start, _ := strconv.Atoi(req.URL.Query().Get("cursor"))
	start = min(max(start, 0), len(entries))
	end := min(start+pageSize, len(entries))
	if end < len(entries) {
		next := *req.URL
		q := next.Query()
		q.Set("cursor", strconv.Itoa(end))
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, next.RequestURI()))
	}
	page := entries[start:end]
	if page == nil {
		page = []treeEntry{}
	}
	writeJSON(w, page)
}

// sign is the CDN URL signature (stands in for a presigned URL).
func sign(repo, commit, p string) string {
	h := sha256.Sum256([]byte("cdn-secret|" + repo + "|" + commit + "|" + p))
	return hex.EncodeToString(h[:16])
}

func (s *Server) resolve(w http.ResponseWriter, req *http.Request) {
	s.Stats.Count("resolve")
	if !s.authorized(req) {
		hubError(w, http.StatusUnauthorized, "Invalid credentials in Authorization header")
		return
	}
	id := req.PathValue("org") + "/" + req.PathValue("name")
	r, ok := s.repo(id, req.PathValue("rev"))
	if !ok {
		hubError(w, http.StatusNotFound, "Revision not found")
		return
	}
	p := req.PathValue("path")
	f, ok := r.file(p)
	if !ok {
		hubError(w, http.StatusNotFound, "Entry not found")
		return
	}
	w.Header().Set("X-Repo-Commit", r.Commit)
	if f.LFS {
		w.Header().Set("X-Linked-Size", strconv.FormatInt(f.Content.Size(), 10))
		w.Header().Set("X-Linked-Etag", `"`+r.sums[p]+`"`)
		target := fmt.Sprintf("%s/cdn/%s/%s/%s?sig=%s", s.cdnBase, id, r.Commit, escapePath(p), sign(id, r.Commit, p))
		http.Redirect(w, req, target, http.StatusFound)
		return
	}
	s.Stats.Count("content")
	w.Header().Set("ETag", `"`+r.sums[p]+`"`)
	fetchtest.ServeContent(w, req, p, f.Content, &s.Faults, &s.Stats)
}

func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i := range segs {
		segs[i] = url.PathEscape(segs[i])
	}
	return strings.Join(segs, "/")
}

// CDNHandler serves /cdn/{org}/{name}/{commit}/{path}?sig=..., like an object
// store behind presigned URLs: it refuses a request that also carries an
// Authorization header.
func (s *Server) CDNHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.Stats.Count("content")
		parts := strings.SplitN(strings.TrimPrefix(req.URL.Path, "/cdn/"), "/", 4)
		if len(parts) != 4 || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
			http.NotFound(w, req)
			return
		}
		id, commit, p := parts[0]+"/"+parts[1], parts[2], parts[3]
		if req.Header.Get("Authorization") != "" {
			http.Error(w, "Only one auth mechanism allowed", http.StatusBadRequest)
			return
		}
		if req.URL.Query().Get("sig") != sign(id, commit, p) {
			http.Error(w, "Request has expired or the signature does not match", http.StatusForbidden)
			return
		}
		r, ok := s.repo(id, commit)
		if !ok {
			http.NotFound(w, req)
			return
		}
		f, ok := r.file(p)
		if !ok {
			http.NotFound(w, req)
			return
		}
		w.Header().Set("ETag", `"`+r.sums[p]+`"`)
		fetchtest.ServeContent(w, req, p, f.Content, &s.Faults, &s.Stats)
	})
}
