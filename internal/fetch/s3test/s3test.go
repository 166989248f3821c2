// Package s3test is a small S3-compatible server for tests: path-style
// GetBucketLocation, ListObjectsV2 (paginated), HeadObject and GetObject
// with Range and If-Match, SigV4-shaped auth checked by access key only,
// and the same fault injection as the fake hub.
package s3test

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/xml"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
)

// Server is the fake object store.
type Server struct {
	// AccessKey, when set, must appear as the SigV4 credential.
	AccessKey string
	// MaxKeys per list page (default 1000).
	MaxKeys int

	Faults fetchtest.Faults
	Stats  fetchtest.Stats

	srv     *httptest.Server
	mu      sync.RWMutex
	objects map[string]map[string]object // bucket -> key -> object
}

type object struct {
	c    fetchtest.Content
	etag string
}

var modTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// New starts the server on loopback.
func New(accessKey string) *Server {
	s := &Server{AccessKey: accessKey, objects: map[string]map[string]object{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the endpoint (for --s3-endpoint).
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Put stores an object (creating the bucket).
func (s *Server) Put(bucket, key string, c fetchtest.Content) {
	h := md5.New()
	if _, err := io.Copy(h, io.NewSectionReader(c, 0, c.Size())); err != nil {
		panic(err) // as fetchtest.SHA256: test content must be readable
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objects[bucket] == nil {
		s.objects[bucket] = map[string]object{}
	}
	s.objects[bucket][key] = object{c: c, etag: hex.EncodeToString(h.Sum(nil))}
}

type s3Error struct {
	XMLName  xml.Name `xml:"Error"`
	Code     string   `xml:"Code"`
	Message  string   `xml:"Message"`
	Resource string   `xml:"Resource"`
}

func writeError(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		// A failed write means the client is gone; nothing left to tell it.
		_ = xml.NewEncoder(w).Encode(s3Error{Code: code, Message: msg, Resource: r.URL.Path})
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.Stats.Count("all")
	if s.AccessKey != "" {
		auth := r.Header.Get("Authorization")
		if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+s.AccessKey+"/") {
			writeError(w, r, http.StatusForbidden, "AccessDenied", "Access Denied")
			return
		}
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	s.mu.RLock()
	objs, ok := s.objects[bucket]
	s.mu.RUnlock()
	if !ok {
		writeError(w, r, http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist")
		return
	}
	switch {
	case key == "" && r.Method == http.MethodGet && r.URL.Query().Has("location"):
		w.Header().Set("Content-Type", "application/xml")
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><LocationConstraint xmlns="http://s3.amazonaws.com/doc/2006-03-01/">us-east-1</LocationConstraint>`)
	case key == "" && r.Method == http.MethodGet:
		s.list(w, r, bucket, objs)
	case key != "" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.mu.RLock()
		o, ok := objs[key]
		s.mu.RUnlock()
		if !ok {
			writeError(w, r, http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
			return
		}
		etag := `"` + o.etag + `"`
		if m := r.Header.Get("If-Match"); m != "" && strings.Trim(m, `"`) != o.etag {
			writeError(w, r, http.StatusPreconditionFailed, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Last-Modified", modTime.Format(http.TimeFormat))
		if r.Method == http.MethodGet {
			s.Stats.Count("content")
		}
		fetchtest.ServeContent(w, r, key, o.c, &s.Faults, &s.Stats)
	default:
		writeError(w, r, http.StatusNotImplemented, "NotImplemented", "not implemented by s3test")
	}
}

type listResult struct {
	XMLName               xml.Name   `xml:"http://s3.amazonaws.com/doc/2006-03-01/ ListBucketResult"`
	Name                  string     `xml:"Name"`
	Prefix                string     `xml:"Prefix"`
	KeyCount              int        `xml:"KeyCount"`
	MaxKeys               int        `xml:"MaxKeys"`
	IsTruncated           bool       `xml:"IsTruncated"`
	ContinuationToken     string     `xml:"ContinuationToken,omitempty"`
	NextContinuationToken string     `xml:"NextContinuationToken,omitempty"`
	Contents              []listItem `xml:"Contents"`
}

type listItem struct {
	Key          string `xml:"Key"`
	LastModified string `xml:"LastModified"`
	ETag         string `xml:"ETag"`
	Size         int64  `xml:"Size"`
	StorageClass string `xml:"StorageClass"`
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, bucket string, objs map[string]object) {
	s.Stats.Count("list")
	q := r.URL.Query()
	prefix := q.Get("prefix")
	var keys []string
	s.mu.RLock()
	for k := range objs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	s.mu.RUnlock()
	sort.Strings(keys)
	maxKeys := s.MaxKeys
	if maxKeys <= 0 {
		maxKeys = 1000
	}
	if mk, err := strconv.Atoi(q.Get("max-keys")); err == nil && mk > 0 && mk < maxKeys {
		maxKeys = mk
	}
	start := 0
	if tok := q.Get("continuation-token"); tok != "" {
		start = sort.SearchStrings(keys, tok)
	} else if sa := q.Get("start-after"); sa != "" {
		start = sort.Search(len(keys), func(i int) bool { return keys[i] > sa })
	}
	end := min(start+maxKeys, len(keys))
	res := listResult{Name: bucket, Prefix: prefix, MaxKeys: maxKeys, ContinuationToken: q.Get("continuation-token")}
	s.mu.RLock()
	for _, k := range keys[start:end] {
		o := objs[k]
		res.Contents = append(res.Contents, listItem{Key: k, LastModified: modTime.Format(time.RFC3339),
			ETag: `"` + o.etag + `"`, Size: o.c.Size(), StorageClass: "STANDARD"})
	}
	s.mu.RUnlock()
	res.KeyCount = len(res.Contents)
	if end < len(keys) {
		res.IsTruncated = true
		res.NextContinuationToken = keys[end]
	}
	w.Header().Set("Content-Type", "application/xml")
	// A failed write means the client is gone; nothing left to tell it.
	_, _ = io.WriteString(w, xml.Header)
	_ = xml.NewEncoder(w).Encode(res)
}
