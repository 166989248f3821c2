package fetch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Cache layout under Dest.
const (
	metaDir      = ".orchestra"
	manifestName = "manifest.json"
	partialDir   = "partial"
)

// ManifestVersion is the schema version of manifest.json.
const ManifestVersion = 1

// Manifest records what a cache directory holds. It is rewritten atomically
// after every published file; Complete turns true when the run finished.
type Manifest struct {
	Version int `json:"version"`
	// Complete is true only when every selected file is present and verified.
	Complete bool   `json:"complete"`
	Source   string `json:"source,omitempty"`
	// Revision is the commit an hf:// revision resolved to.
	Revision string   `json:"revision,omitempty"`
	Include  []string `json:"include,omitempty"`
	Exclude  []string `json:"exclude,omitempty"`
	Format   string   `json:"format,omitempty"`
	// Verified is true when every file was checked with sha256 (or its git
	// blob id) when it was published.
	Verified   bool           `json:"verified"`
	TotalBytes int64          `json:"totalBytes"`
	Files      []ManifestFile `json:"files"`
	UpdatedAt  time.Time      `json:"updatedAt"`
	Fetcher    string         `json:"fetcher,omitempty"`
}

// ManifestFile is one published file.
type ManifestFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// GitOID and ETag are the source's own identifiers, kept to decide
	// whether a re-run can reuse the file.
	GitOID string `json:"gitOid,omitempty"`
	ETag   string `json:"etag,omitempty"`
}

// ManifestPath is where the manifest of a cache directory lives.
func ManifestPath(dest string) string { return filepath.Join(dest, metaDir, manifestName) }

// ReadManifest loads dest's manifest; a missing one returns (nil, nil).
func ReadManifest(dest string) (*Manifest, error) {
	b, err := os.ReadFile(ManifestPath(dest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("parsing manifest %s: %w", ManifestPath(dest), err)
	}
	if m.Version != ManifestVersion {
		return nil, fmt.Errorf("manifest %s: unsupported version %d", ManifestPath(dest), m.Version)
	}
	return &m, nil
}

func (m *Manifest) file(p string) (ManifestFile, bool) {
	for _, f := range m.Files {
		if f.Path == p {
			return f, true
		}
	}
	return ManifestFile{}, false
}

// put adds or replaces an entry, keeping Files sorted by path.
func (m *Manifest) put(f ManifestFile) {
	i, found := slices.BinarySearchFunc(m.Files, f.Path, func(e ManifestFile, p string) int {
		switch {
		case e.Path < p:
			return -1
		case e.Path > p:
			return 1
		}
		return 0
	})
	if found {
		m.Files[i] = f
	} else {
		m.Files = slices.Insert(m.Files, i, f)
	}
	m.TotalBytes = 0
	for _, e := range m.Files {
		m.TotalBytes += e.Size
	}
}

// writeManifest stores m under dest atomically.
func writeManifest(dest string, m *Manifest) error {
	m.UpdatedAt = time.Now().UTC().Truncate(time.Second)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(ManifestPath(dest), append(b, '\n'))
}

// writeFileAtomic writes data to a temporary name, fsyncs it, renames it
// over path and fsyncs the directory.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	// Best effort: after the rename tmp is gone; on failure it is garbage.
	defer func() { _ = os.Remove(tmp) }()
	if _, err := f.Write(data); err != nil {
		_ = f.Close() // the file is discarded; the write error is returned
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the file is discarded; the sync error is returned
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

// writeFileQuick replaces path with data atomically with respect to process
// crashes (temporary name + rename) but without fsync.
func writeFileQuick(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }() // a directory opened read-only
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
