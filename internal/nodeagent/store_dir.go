package nodeagent

// Directory copies: a model that is a directory of files (vLLM's
// safetensors model: config.json, the tokenizer's files, the shards the
// fetcher's manifest lists) is kept as one copy, the directory
// <tier>/<namespace>/<name>, on the same rules as a copy of one file. Its
// bytes are the concatenation of its files in the listed order: a cold
// source streams them so (each file verified against its manifest sha256
// as it passes), the store writes the stream into a temporary directory,
// splitting it by the listed sizes, and hashes it whole into the copy's
// digest (the xxh3c of the concatenation, which the periodic
// re-verification and every copy between tiers check); the metadata file
// lists the files with their sizes and sha256 (nodeapi.CopyMeta.Files),
// and the directory is renamed into place only once every file is
// written, synced (warm) and the metadata is in place. Budgets count the
// files' total size.

import (
	"github.com/model-orchestra/operator/api/v1alpha1"

	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// DirSource is a cold source whose bytes are a directory's files,
// concatenated in the order Files lists them.
type DirSource interface {
	ColdSource
	CopyFiles() []nodeapi.CopyFile
}

// copyDirMode is the mode of a directory copy and the directories in it:
// readable by the store's group (the engines that load the copy), as its
// files are (fileMode).
func (s *Store) copyDirMode() os.FileMode {
	if s.cfg.Group > 0 {
		return 0o750
	}
	return 0o700
}

// checkCopyFiles checks a directory copy's file list: local, clean,
// distinct paths, sizes not negative, a sha256 each.
func checkCopyFiles(files []nodeapi.CopyFile) error {
	seen := map[string]bool{}
	for _, f := range files {
		if !sidecarapi.LocalPath(f.Path) || seen[f.Path] {
			return fmt.Errorf("a directory copy's file %q must be a distinct local path", f.Path)
		}
		if f.Bytes < 0 || f.SHA256 == "" {
			return fmt.Errorf("a directory copy's file %s needs a size and a sha256", f.Path)
		}
		seen[f.Path] = true
	}
	if len(files) == 0 {
		return errors.New("a directory copy needs at least one file")
	}
	return nil
}

// writeDir writes the concatenated files of req from src into a
// temporary directory in dir, hashing the stream, and returns the
// directory, the digest and the bytes written. A failure removes it.
func (s *Store) writeDir(dir string, req PutRequest, src io.Reader) (string, arena.Digest, int64, error) {
	if err := checkCopyFiles(req.Files); err != nil {
		return "", 0, 0, err
	}
	tmp, err := os.MkdirTemp(dir, "."+req.Key.Name+".tmp-*")
	if err != nil {
		return "", 0, 0, fmt.Errorf("creating a temporary directory in %s: %w", dir, err)
	}
	fail := func(err error) (string, arena.Digest, int64, error) {
		_ = os.RemoveAll(tmp)
		return "", 0, 0, err
	}
	if err := s.share(tmp, s.copyDirMode()); err != nil {
		return fail(err)
	}
	w := &splitWriter{s: s, root: tmp, files: req.Files, sync: req.Tier == v1alpha1.TierWarm}
	d, n, err := arena.CopyHash(w, io.LimitReader(src, req.Bytes+1))
	if err == nil {
		err = w.finish()
	}
	w.close()
	if err != nil {
		return fail(fmt.Errorf("copying %s into the %s tier: %w", req.Key, req.Tier, err))
	}
	if n != req.Bytes {
		return fail(fmt.Errorf("copying %s into the %s tier: got %d bytes, want %d", req.Key, req.Tier, n, req.Bytes))
	}
	return tmp, d, n, nil
}

// splitWriter writes a stream into files of the listed sizes, in order.
type splitWriter struct {
	s     *Store
	root  string
	files []nodeapi.CopyFile
	sync  bool

	i    int      // the file being written
	left int64    // its bytes still to write
	f    *os.File // open while left > 0
}

// next opens the next file that has bytes to write, creating the empty
// ones on the way; false when no file is left.
func (w *splitWriter) next() (bool, error) {
	for w.f == nil || w.left == 0 {
		if w.f != nil {
			if err := w.closeFile(); err != nil {
				return false, err
			}
			w.i++
		}
		if w.i >= len(w.files) {
			return false, nil
		}
		cf := w.files[w.i]
		p := filepath.Join(w.root, filepath.FromSlash(cf.Path))
		if err := w.mkdirs(path.Dir(cf.Path)); err != nil {
			return false, err
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return false, err
		}
		w.f, w.left = f, cf.Bytes
		if err := w.s.shareFile(f); err != nil {
			return false, err
		}
	}
	return true, nil
}

// mkdirs creates the directories of rel (slash-separated) under root,
// each given the tier's directory mode and group.
func (w *splitWriter) mkdirs(rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	if err := w.mkdirs(path.Dir(rel)); err != nil {
		return err
	}
	p := filepath.Join(w.root, filepath.FromSlash(rel))
	if err := os.Mkdir(p, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return err
	}
	return w.s.share(p, w.s.copyDirMode())
}

func (w *splitWriter) closeFile() error {
	var err error
	if w.sync {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	return err
}

func (w *splitWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		ok, err := w.next()
		if err != nil {
			return written, err
		}
		if !ok {
			return written, errors.New("more bytes than the listed files hold")
		}
		k := int64(len(p))
		if k > w.left {
			k = w.left
		}
		n, err := w.f.Write(p[:k])
		written += n
		w.left -= int64(n)
		if err != nil {
			return written, err
		}
		p = p[k:]
	}
	return written, nil
}

// finish creates the listed files after the last byte (empty ones) and
// closes the last; an error when a file is short.
func (w *splitWriter) finish() error {
	if w.f != nil && w.left > 0 {
		return fmt.Errorf("%s is %d bytes short", w.files[w.i].Path, w.left)
	}
	if _, err := w.next(); err != nil {
		return err
	}
	if w.f != nil {
		return fmt.Errorf("%s is %d bytes short", w.files[w.i].Path, w.left)
	}
	return nil
}

func (w *splitWriter) close() {
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
}

// dirReader reads a directory copy's files concatenated, in order, each
// checked to have its listed size.
type dirReader struct {
	root  string
	files []nodeapi.CopyFile
	drop  bool // drop each file's cached pages before reading it

	i    int
	f    *os.File
	read int64
}

// openDir reads the directory copy at root.
func openDir(root string, files []nodeapi.CopyFile, drop bool) io.ReadCloser {
	return &dirReader{root: root, files: files, drop: drop}
}

func (r *dirReader) Read(p []byte) (int, error) {
	for {
		if r.f == nil {
			if r.i >= len(r.files) {
				return 0, io.EOF
			}
			name := filepath.Join(r.root, filepath.FromSlash(r.files[r.i].Path))
			if r.drop {
				_ = DropCache(name)
			}
			f, err := os.Open(name)
			if err != nil {
				return 0, err
			}
			r.f, r.read = f, 0
		}
		n, err := r.f.Read(p)
		r.read += int64(n)
		if r.read > r.files[r.i].Bytes {
			return n, fmt.Errorf("%s holds more than its %d bytes", r.files[r.i].Path, r.files[r.i].Bytes)
		}
		if errors.Is(err, io.EOF) {
			_ = r.f.Close()
			r.f = nil
			if r.read != r.files[r.i].Bytes {
				return n, fmt.Errorf("%s holds %d bytes, want %d", r.files[r.i].Path, r.read, r.files[r.i].Bytes)
			}
			r.i++
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (r *dirReader) Close() error {
	if r.f != nil {
		return r.f.Close()
	}
	return nil
}

// checkDir reports whether the directory copy at root holds every listed
// file with its size.
func checkDir(root string, files []nodeapi.CopyFile, bytes int64) error {
	if nodeapi.CopyFilesBytes(files) != bytes {
		return fmt.Errorf("the listed files hold %d bytes, the metadata %d", nodeapi.CopyFilesBytes(files), bytes)
	}
	if err := checkCopyFiles(files); err != nil {
		return err
	}
	for _, f := range files {
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(f.Path)))
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Size() != f.Bytes {
			return fmt.Errorf("%s is not a regular file of %d bytes", f.Path, f.Bytes)
		}
	}
	return nil
}

// filesOf is the file list of the directory copy of k in t (nil for a
// copy of one file).
func (s *Store) filesOf(k nodeapi.Key, t v1alpha1.Tier) []nodeapi.CopyFile {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.files[entryID{k, t}]
}

// openCopy reads the bytes of the copy e, a file or a directory's files
// concatenated; direct reads a warm copy past the page cache.
func (s *Store) openCopy(e nodeapi.Entry, direct bool) (io.ReadCloser, error) {
	if files := s.filesOf(e.Key, e.Tier); len(files) > 0 {
		return openDir(s.Path(e.Key, e.Tier), files, direct), nil
	}
	return os.Open(s.Path(e.Key, e.Tier))
}

// hashCopy hashes the copy e as its digest was made.
func (s *Store) hashCopy(e nodeapi.Entry) (arena.Digest, error) {
	files := s.filesOf(e.Key, e.Tier)
	if len(files) == 0 {
		return hashFile(s.Path(e.Key, e.Tier), e.Bytes, e.Tier == v1alpha1.TierWarm)
	}
	r := openDir(s.Path(e.Key, e.Tier), files, e.Tier == v1alpha1.TierWarm)
	defer func() { _ = r.Close() }()
	d, n, err := arena.CopyHash(io.Discard, r)
	if err != nil {
		return 0, fmt.Errorf("verifying %s: %w", s.Path(e.Key, e.Tier), err)
	}
	if n != e.Bytes {
		return 0, fmt.Errorf("verifying %s: %d bytes, want %d", s.Path(e.Key, e.Tier), n, e.Bytes)
	}
	return d, nil
}

// demoteDir is Demote of the store's hot directory copy hot (the caller
// holds s.admit): copied to the warm tier within its budget, verified
// against its digest, then the hot copy removed.
func (s *Store) demoteDir(hot nodeapi.Entry, priority int32) (nodeapi.Entry, nodeapi.DemoteSource, error) {
	hot.Priority = max(priority, hot.Priority)
	in := nodeapi.Entry{Key: hot.Key, Tier: v1alpha1.TierWarm, Bytes: hot.Bytes, Priority: hot.Priority, LastUsed: s.now()}
	plan, err := PlanAdmit(s.Entries(), s.cfg.Budgets, in)
	if err != nil {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s (%d bytes) to the warm tier: %w", hot.Key, hot.Bytes, err)
	}
	if err := s.apply(plan); err != nil {
		return nodeapi.Entry{}, "", err
	}
	e, err := s.copyTier(hot, v1alpha1.TierWarm)
	if err != nil {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s: %w", hot.Key, err)
	}
	if err := s.Remove(hot.Key, v1alpha1.TierHot); err != nil {
		return e, nodeapi.DemoteFromStore, err
	}
	s.log.Info("demoted to the warm tier", "key", hot.String(), "from", nodeapi.DemoteFromStore, "bytes", e.Bytes, "files", e.Files, "digest", e.Digest)
	return e, nodeapi.DemoteFromStore, nil
}

// CopyFiles passes the file list of a directory source through (nil for
// a source of one file).
func (c *coldRead) CopyFiles() []nodeapi.CopyFile {
	if d, ok := c.ColdSource.(DirSource); ok {
		return d.CopyFiles()
	}
	return nil
}
