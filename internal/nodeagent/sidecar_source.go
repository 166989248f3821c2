package nodeagent

// The cold copy from an engine's sidecar. Where the agent does not mount
// the model cache (a ReadWriteOnce claim attaches to one node and admits
// only the engine's pod; the agent runs on every node), the leader's
// POST /promote names the sidecar of an engine on this node (Sidecar, its
// base URL), and the agent reads the model's files from it
// (sidecarapi.PathModelFiles) with the release's caller token. The
// sidecar only reads its cache; the agent stays the one owner of the
// copies: it checks the size and hashes every byte with sha256 as it
// writes the copy under a temporary name, and places it only when the
// sha256 is the one the fetcher's manifest records (a corrupted cache file
// is refused and nothing is placed), within its budgets and eviction
// rules, exactly as for a cache it mounts (modelfile.go).

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// sidecarHTTP reads the sidecars: a copy of a large model streams for
// minutes, so only connecting and the answer's headers are bounded (the
// request's context bounds the rest).
var sidecarHTTP = &http.Client{Transport: &http.Transport{
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	ResponseHeaderTimeout: 30 * time.Second,
	DisableCompression:    true,
}}

// checkSidecarURL accepts only http://<IP>:<port>: the address of a pod,
// never a name to resolve, a path or credentials.
func checkSidecarURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("sidecar %q: %w", s, err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if u.Scheme != "http" || err != nil || net.ParseIP(host) == nil || port == "" || u.User != nil ||
		strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("sidecar %q must be http://<pod IP>:<port>", s)
	}
	return nil
}

// sidecarSource lists the model's files at the sidecar base and returns
// the cold source of a copy of them: one file (a GGUF), or a directory of
// files (vLLM's model), copied as one directory copy (store_dir.go).
func (n *Node) sidecarSource(ctx context.Context, base string) (ColdSource, error) {
	if err := checkSidecarURL(base); err != nil {
		return nil, err
	}
	return SidecarModel(ctx, sidecarapi.Client{URL: base, HTTP: sidecarHTTP, Token: nodeapi.TokenFile(n.cfg.CallerTokenFile)})
}

// SidecarModel lists the model's files at the sidecar c and returns the
// cold source of a copy of them: a SidecarFile or a SidecarDir.
func SidecarModel(ctx context.Context, c sidecarapi.Client) (ColdSource, error) {
	files, err := c.ModelFiles(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the model's files at the sidecar: %w", err)
	}
	if files.Dir {
		d := SidecarDir{Client: c, Root: files.Root}
		for _, f := range files.Files {
			d.Files = append(d.Files, nodeapi.CopyFile{Path: f.Path, Bytes: f.Bytes, SHA256: strings.ToLower(f.SHA256)})
		}
		if err := checkCopyFiles(d.Files); err != nil {
			return nil, fmt.Errorf("%w: the sidecar's model %q: %w", ErrManifestMismatch, files.Root, err)
		}
		return d, nil
	}
	if len(files.Files) != 1 {
		return nil, fmt.Errorf("the sidecar lists %d files for the model file %q, want one", len(files.Files), files.Root)
	}
	f := files.Files[0]
	if f.SHA256 == "" || f.Bytes < 0 {
		return nil, fmt.Errorf("%w: the sidecar names no sha256 for %s", ErrManifestMismatch, f.Path)
	}
	return SidecarFile{Client: c, File: f}, nil
}

// SidecarFile is one model file an engine's sidecar hands out, with the
// fetcher's manifest size and sha256 the sidecar listed.
type SidecarFile struct {
	Client sidecarapi.Client
	File   sidecarapi.ModelFile
}

// Open reads the file from the sidecar. Its size and the sha256 it is
// sent with must be the listed ones; its reader fails at the end of the
// bytes, before the copy is placed, when they do not hash to that sha256.
func (s SidecarFile) Open(ctx context.Context) (io.ReadCloser, int64, error) {
	rc, n, sha, err := s.Client.OpenModelFile(ctx, s.File.Path)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the cold copy from the sidecar: %w", err)
	}
	if n != s.File.Bytes || !strings.EqualFold(sha, s.File.SHA256) {
		_ = rc.Close() // read-only
		return nil, 0, fmt.Errorf("%w: %s holds %d bytes sent with sha256 %q, the manifest lists %d bytes with %q", ErrManifestMismatch, s, n, sha, s.File.Bytes, s.File.SHA256)
	}
	return &sha256Reader{ReadCloser: rc, h: sha256.New(), want: s.File.SHA256, name: s.String()}, n, nil
}

// Kind is ColdModelCache: the bytes are the model cache's.
func (SidecarFile) Kind() string { return nodeapi.ColdModelCache }

func (s SidecarFile) String() string {
	return strings.TrimSuffix(s.Client.URL, "/") + sidecarapi.PathModelFiles + "/" + s.File.Path + " (the model cache, through the engine's sidecar)"
}

// SHA256 is the manifest's sha256 of the file, which the copy records.
func (s SidecarFile) SHA256() string { return strings.ToLower(s.File.SHA256) }

// SidecarDir is a model directory an engine's sidecar hands out (vLLM's
// safetensors model), file by file, with the manifest sizes and sha256
// it listed: a directory copy's source (store_dir.go).
type SidecarDir struct {
	Client sidecarapi.Client
	Root   string
	Files  []nodeapi.CopyFile
}

// CopyFiles implements DirSource.
func (s SidecarDir) CopyFiles() []nodeapi.CopyFile { return s.Files }

// Open streams the files concatenated in order; each is fetched when the
// one before it ends, checked to have its listed size and the sha256 it
// is sent with, and hashed with sha256 as it passes: a file whose bytes
// do not match fails the copy before it is placed.
func (s SidecarDir) Open(ctx context.Context) (io.ReadCloser, int64, error) {
	return &sidecarDirReader{ctx: ctx, src: s}, nodeapi.CopyFilesBytes(s.Files), nil
}

// Kind is ColdModelCache: the bytes are the model cache's.
func (SidecarDir) Kind() string { return nodeapi.ColdModelCache }

func (s SidecarDir) String() string {
	return fmt.Sprintf("%s%s (%d files of the model %q in the model cache, through the engine's sidecar)", strings.TrimSuffix(s.Client.URL, "/"), sidecarapi.PathModelFiles, len(s.Files), s.Root)
}

type sidecarDirReader struct {
	ctx context.Context
	src SidecarDir
	i   int
	cur io.ReadCloser
}

func (r *sidecarDirReader) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			if r.i >= len(r.src.Files) {
				return 0, io.EOF
			}
			f := r.src.Files[r.i]
			rc, _, err := SidecarFile{Client: r.src.Client, File: sidecarapi.ModelFile{Path: f.Path, Bytes: f.Bytes, SHA256: f.SHA256}}.Open(r.ctx)
			if err != nil {
				return 0, err
			}
			r.cur = rc
		}
		n, err := r.cur.Read(p)
		if errors.Is(err, io.EOF) {
			_ = r.cur.Close() // read-only
			r.cur = nil
			r.i++
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (r *sidecarDirReader) Close() error {
	if r.cur != nil {
		return r.cur.Close()
	}
	return nil
}
