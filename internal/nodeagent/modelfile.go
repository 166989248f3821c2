package nodeagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"path/filepath"
	"strings"

	"github.com/model-orchestra/operator/internal/fetch"
)

// A model file of the cold tier is verified against the fetcher's
// manifest. The agent's cold directory (--cold-dir) holds one model cache
// per application, <cold-dir>/<app>, as orchestra-fetch filled it: the
// model's files and .orchestra/manifest.json, which lists each file with
// its size and sha256 (fetch.Manifest). A copy of such a file into the hot
// or warm tier hashes the bytes with sha256 as they are copied and places
// the copy only when they match the manifest, so a copy an engine later
// loads (a GGUF that llama.cpp and Ollama mmap, vLLM's safetensors) is the
// file the fetcher verified, byte for byte. The copy's own digest
// (xxh3c) is recorded as for every copy, and the periodic re-verification
// uses it.

// ErrManifestMismatch refuses a cold copy whose bytes do not match the
// fetcher's manifest, or whose manifest cannot vouch for it (not complete,
// no sha256 for the file). Nothing is placed.
var ErrManifestMismatch = errors.New("the cold copy does not match the fetcher's manifest")

// manifestFile is the manifest entry of coldPath (<app>/<file> inside the
// cold directory), or ok false when <app> has no manifest or it does not
// list the file (then the copy is verified only by the digest the caller
// gives, as before).
func manifestFile(coldDir, coldPath string) (fetch.ManifestFile, bool, error) {
	app, rel, found := strings.Cut(filepath.ToSlash(coldPath), "/")
	if !found || app == "" || rel == "" {
		return fetch.ManifestFile{}, false, nil
	}
	m, err := fetch.ReadManifest(filepath.Join(coldDir, app))
	if err != nil || m == nil {
		return fetch.ManifestFile{}, false, err
	}
	for _, f := range m.Files {
		if f.Path != rel {
			continue
		}
		switch {
		case !m.Complete:
			return f, true, fmt.Errorf("%w: the manifest of %s is not complete (the fetch has not finished)", ErrManifestMismatch, app)
		case f.SHA256 == "":
			return f, true, fmt.Errorf("%w: the manifest of %s lists %s without a sha256", ErrManifestMismatch, app, rel)
		}
		return f, true, nil
	}
	return fetch.ManifestFile{}, false, nil
}

// manifestVerified is a cold file checked against its manifest entry.
type manifestVerified struct {
	ColdFile
	want fetch.ManifestFile
}

// ModelFile is the cold model file f checked against its manifest entry
// want: a copy of it is placed only when its bytes hash to want's sha256.
func ModelFile(f ColdFile, want fetch.ManifestFile) ColdSource {
	return manifestVerified{ColdFile: f, want: want}
}

// Open opens the file; its reader fails at the end of the bytes, before
// the copy is placed, when they do not hash to the manifest's sha256.
func (m manifestVerified) Open(ctx context.Context) (io.ReadCloser, int64, error) {
	rc, n, err := m.ColdFile.Open(ctx)
	if err != nil {
		return nil, 0, err
	}
	if n != m.want.Size {
		_ = rc.Close() // read-only
		return nil, 0, fmt.Errorf("%w: %s holds %d bytes, the manifest %d", ErrManifestMismatch, m.ColdFile, n, m.want.Size)
	}
	return &sha256Reader{ReadCloser: rc, h: sha256.New(), want: m.want.SHA256, name: string(m.ColdFile)}, n, nil
}

// SHA256 is the manifest's sha256 of the file, which the copy records.
func (m manifestVerified) SHA256() string { return strings.ToLower(m.want.SHA256) }

// manifestSHA256 is the manifest sha256 a cold source verifies its bytes
// against (a model file the fetcher's manifest lists), or "".
func manifestSHA256(c ColdSource) string {
	if m, ok := c.(interface{ SHA256() string }); ok {
		return m.SHA256()
	}
	return ""
}

func (m manifestVerified) String() string {
	return string(m.ColdFile) + " (sha256 of the fetcher's manifest)"
}

// sha256Reader hashes what it reads and turns the end of the bytes into
// an error when they do not match want.
type sha256Reader struct {
	io.ReadCloser
	h          hash.Hash
	want, name string
}

func (r *sha256Reader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(r.h.Sum(nil)); !strings.EqualFold(got, r.want) {
			return n, fmt.Errorf("%w: %s hashes to sha256 %s, the manifest says %s", ErrManifestMismatch, r.name, got, r.want)
		}
	}
	return n, err
}
