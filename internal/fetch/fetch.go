// Package fetch downloads a model into a cache directory (the model-cache
// Job of a ModelOrchestra) and verifies it: parallel ranged downloads with
// streaming sha256, atomic publication, crash-safe resume, retries with
// backoff, stall detection and progress reporting.
package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/internal/version"
)

// Options are the collaborators of a run; all are optional.
type Options struct {
	Logger *slog.Logger
	// Kube is used for the progress ConfigMap; when nil and
	// Config.ProgressConfigMap is set, a client is built from the
	// environment.
	Kube kubernetes.Interface
	// Sinks receive progress in addition to the configured ones.
	Sinks []ProgressSink
	// BarWriter receives the progress bar when Config.ProgressBar is set
	// (default os.Stderr).
	BarWriter io.Writer
	// HTTPTransport overrides the transport for hub, https and S3 sources.
	HTTPTransport http.RoundTripper
	// FreeBytes overrides the free-space probe of the cache filesystem.
	FreeBytes func(dir string) (int64, error)
}

// Result describes a successful run.
type Result struct {
	// Files and TotalBytes describe the complete cache.
	Files      int
	TotalBytes int64
	// Downloaded is what this run transferred (0 for a cache hit).
	Downloaded int64
	// CacheHit is true when the manifest was complete and the source was not
	// contacted.
	CacheHit bool
	Revision string
	Dir      string
}

// Run performs one fetch as described by cfg.
func Run(ctx context.Context, cfg Config, opts Options) (res *Result, err error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.LoadSecrets(); err != nil {
		return nil, err
	}
	if opts.FreeBytes == nil {
		opts.FreeBytes = freeBytes
	}

	t := newTracker()
	if cfg.SizeFile != "" && cfg.Dest != "" {
		// The cache's last verdict is reported until this run sizes the
		// model again: the operator holds the engine at zero pods while a
		// report has no verdict for its check, so a new Job over a cache
		// it already sized (an operator upgrade, say) leaves the running
		// engine alone.
		t.sizing = previousSizing(cfg.Dest)
	}
	sinks := []sinkSpec{{sink: logSink{log}, every: cfg.ProgressInterval, name: "log"}}
	if cfg.ProgressBar {
		w := opts.BarWriter
		if w == nil {
			w = os.Stderr
		}
		sinks = append(sinks, sinkSpec{sink: barSink{w}, every: 250 * time.Millisecond, name: "bar"})
	}
	if cfg.ProgressConfigMap != "" {
		kc := opts.Kube
		if kc == nil {
			kc, err = NewKubeClient()
			if err != nil {
				log.Warn("progress ConfigMap disabled: no Kubernetes client", "err", err)
			}
		}
		if kc != nil {
			sinks = append(sinks, sinkSpec{
				sink:  &ConfigMapSink{Client: kc, Namespace: cfg.ProgressNamespace, Name: cfg.ProgressConfigMap},
				every: cfg.ProgressInterval, name: "configmap",
			})
		}
	}
	for i, s := range opts.Sinks {
		sinks = append(sinks, sinkSpec{sink: s, every: cfg.ProgressInterval, name: fmt.Sprintf("extra-%d", i)})
	}
	rep := startReporter(t, log, sinks)
	defer func() {
		switch {
		case errors.Is(err, context.Canceled):
			t.setPhase(PhaseFailed, "interrupted; running again resumes the download")
		case err != nil:
			t.setPhase(PhaseFailed, err.Error())
		}
		rep.Stop()
	}()

	res, err = fetchModel(ctx, cfg, opts, t, log)
	if err != nil {
		return res, err
	}
	if cfg.Convert != "" {
		// the conversion writes into the cache too: one fetcher at a time
		unlock, err := lockDir(ctx, filepath.Join(res.Dir, metaDir), func() {
			t.setPhase(PhasePending, "waiting for another orchestra-fetch using "+res.Dir)
			log.Info("another orchestra-fetch is using the cache; waiting", "dir", res.Dir)
		})
		if err != nil {
			return res, fmt.Errorf("locking %s: %w", res.Dir, err)
		}
		err = convertModel(ctx, cfg, res.Dir, t, log)
		unlock()
		if err != nil {
			return res, err
		}
	}
	if cfg.SizeFile != "" {
		if err := sizeModel(cfg, res.Dir, t, log); err != nil {
			return res, err
		}
	}
	return res, nil
}

// fetchModel downloads (or verifies in place) the model files.
func fetchModel(ctx context.Context, cfg Config, opts Options, t *tracker, log *slog.Logger) (*Result, error) {
	ps := ParsedSource{}
	if cfg.Source != "" {
		ps, _ = ParseSource(cfg.Source, cfg.Revision)
	}
	if cfg.PreConverted || ps.Kind == KindPVC {
		dir := cfg.Dest
		if dir == "" {
			dir = filepath.Join(cfg.PVCRoot, ps.Claim, filepath.FromSlash(ps.Prefix))
		}
		return verifyInPlace(ctx, cfg, dir, t, log)
	}

	transport := opts.HTTPTransport
	client := newHTTPClient(cfg)
	if transport != nil {
		client.Transport = transport
	} else {
		transport = client.Transport
	}
	var src Source
	switch ps.Kind {
	case KindHF:
		src = &hfSource{client: client, endpoint: strings.TrimRight(cfg.HFEndpoint, "/"), repo: ps.Repo, revision: ps.Revision, token: cfg.Token}
	case KindHTTPS:
		token := ""
		if cfg.TokenFile != "" {
			token = cfg.Token // only an explicitly given token goes to an arbitrary URL
		}
		src = &httpsSource{client: client, url: ps.URL, token: token, sha256: cfg.SHA256}
	case KindS3:
		s3, err := newS3Source(cfg, ps, transport)
		if err != nil {
			return nil, err
		}
		src = s3
	}
	return fetchInto(ctx, cfg, ps, src, t, opts, log)
}

// canonicalSource is the identity recorded in the manifest.
func canonicalSource(cfg Config, ps ParsedSource) string {
	switch ps.Kind {
	case KindHF:
		return fmt.Sprintf("hf://%s@%s", ps.Repo, ps.Revision)
	case KindS3:
		if cfg.S3Endpoint != "" {
			return fmt.Sprintf("s3://%s/%s (endpoint %s)", ps.Bucket, ps.Prefix, cfg.S3Endpoint)
		}
		return fmt.Sprintf("s3://%s/%s", ps.Bucket, ps.Prefix)
	}
	return cfg.Source
}

// cacheComplete tells whether m describes a finished fetch of the same
// selection and every file is still there with its size (and hash when
// verify is set).
func cacheComplete(ctx context.Context, cfg Config, dest, source string, m *Manifest, verify bool, t *tracker) (bool, string) {
	if m == nil || !m.Complete {
		return false, "no complete manifest"
	}
	if m.Source != source || !slices.Equal(m.Include, cfg.Include) || !slices.Equal(m.Exclude, cfg.Exclude) {
		return false, "manifest is for another source or selection"
	}
	if cfg.SHA256 != "" && (len(m.Files) != 1 || m.Files[0].SHA256 != strings.ToLower(cfg.SHA256)) {
		return false, "expected sha256 changed"
	}
	for _, f := range m.Files {
		fi, err := os.Stat(filepath.Join(dest, filepath.FromSlash(f.Path)))
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != f.Size {
			return false, "file " + f.Path + " is missing or has another size"
		}
		if verify && f.SHA256 != "" {
			got, err := hashFile(ctx, filepath.Join(dest, filepath.FromSlash(f.Path)), t)
			if err != nil || got != f.SHA256 {
				return false, "file " + f.Path + " does not match its sha256"
			}
		}
	}
	return true, ""
}

func fetchInto(ctx context.Context, cfg Config, ps ParsedSource, src Source, t *tracker, opts Options, log *slog.Logger) (*Result, error) {
	dest := cfg.Dest
	source := canonicalSource(cfg, ps)
	if err := os.MkdirAll(filepath.Join(dest, metaDir), 0o755); err != nil {
		return nil, fmt.Errorf("creating cache directory: %w", err)
	}
	// Two fetchers on one cache (an overlapping Job retry, a CLI run) would
	// overwrite each other's partial files: the second one waits.
	unlock, err := lockDir(ctx, filepath.Join(dest, metaDir), func() {
		t.setPhase(PhasePending, "waiting for another orchestra-fetch using "+dest)
		log.Info("another orchestra-fetch is using the cache; waiting", "dir", dest)
	})
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", dest, err)
	}
	defer unlock()
	old, err := ReadManifest(dest)
	if err != nil {
		log.Warn("ignoring unreadable manifest", "err", err)
		old = nil
	}

	if !cfg.Refresh {
		if cfg.VerifyExisting && old != nil && old.Complete {
			t.setTotals(len(old.Files), old.TotalBytes)
			t.setPhase(PhaseVerifying, "re-hashing the cached files")
		}
		if ok, why := cacheComplete(ctx, cfg, dest, source, old, cfg.VerifyExisting, t); ok {
			t.bytesDone.Store(old.TotalBytes)
			t.setTotals(len(old.Files), old.TotalBytes)
			for range old.Files {
				t.fileDone()
			}
			t.setVerified(old.Verified || cfg.VerifyExisting)
			t.setPhase(PhaseComplete, "cache already complete")
			log.Info("cache already complete; source not contacted", "dir", dest, "files", len(old.Files), "bytes", old.TotalBytes)
			return &Result{Files: len(old.Files), TotalBytes: old.TotalBytes, CacheHit: true, Revision: old.Revision, Dir: dest}, nil
		} else if old != nil {
			log.Info("cache not reusable as a whole", "reason", why)
			t.bytesDone.Store(0)
		}
	}

	t.setPhase(PhasePending, "listing "+source)
	all, revision, err := listWithRetry(ctx, cfg, src, log)
	if err != nil {
		return nil, err
	}
	files := selectFiles(all, cfg.Include, cfg.Exclude)
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no file of %s matches the include/exclude globs (%d files listed)", ErrNotFound, source, len(all))
	}
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.Path] {
			return nil, fmt.Errorf("%w: %s lists %s twice", ErrVerification, source, f.Path)
		}
		seen[f.Path] = true
		if f.Size < 0 {
			return nil, fmt.Errorf("%w: %s has no size", ErrVerification, f.Path)
		}
	}

	m := &Manifest{Version: ManifestVersion, Source: source, Revision: revision, Include: cfg.Include,
		Exclude: cfg.Exclude, Format: cfg.Format, Fetcher: "orchestra-fetch/" + version.Version}
	var pending []RemoteFile
	var total, reused int64
	verified := cfg.VerifySHA256
	for _, f := range files {
		total += f.Size
		if old != nil {
			if e, ok := old.file(f.Path); ok && reusable(e, f, dest) && (!cfg.VerifyExisting || sameHash(ctx, dest, e)) {
				// An incomplete manifest is only written by runs with the
				// same source; its entries carry that run's verification.
				verified = verified && old.Verified
				m.put(e)
				reused += f.Size
				continue
			}
		}
		pending = append(pending, f)
	}
	m.Verified = verified
	t.setTotals(len(files), total)
	t.bytesDone.Store(reused)
	for range len(files) - len(pending) {
		t.fileDone()
	}
	if err := writeManifest(dest, m); err != nil {
		return nil, fmt.Errorf("writing manifest: %w", err)
	}
	log.Info("plan", "source", source, "revision", revision, "files", len(files), "bytes", total,
		"reused", len(files)-len(pending), "toFetch", len(pending))

	d := &downloader{cfg: cfg, src: src, dest: dest, log: log, progress: t}
	if err := checkSpace(cfg, d, pending, opts.FreeBytes); err != nil {
		return nil, err
	}
	var downloaded int64
	if len(pending) > 0 {
		t.setPhase(PhaseDownloading, fmt.Sprintf("downloading %d files", len(pending)))
		start := t.bytesDone.Load()
		// Record published files in the manifest at most once a second (big
		// files at once), so repositories with thousands of small files do
		// not rewrite it thousands of times; a crash in between only costs
		// re-downloading those small files.
		var publishMu sync.Mutex // finishers of different files publish concurrently
		var lastWrite time.Time
		dirty := false
		d.publish = func(e ManifestFile) error {
			publishMu.Lock()
			defer publishMu.Unlock()
			m.put(e)
			dirty = true
			if e.Size < 16<<20 && time.Since(lastWrite) < time.Second {
				return nil
			}
			lastWrite, dirty = time.Now(), false
			return writeManifest(dest, m)
		}
		err := d.run(ctx, pending)
		downloaded = t.bytesDone.Load() - start
		if dirty {
			if werr := writeManifest(dest, m); werr != nil && err == nil {
				err = fmt.Errorf("writing manifest: %w", werr)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	t.setPhase(PhaseVerifying, "checking format")
	if err := checkFormat(dest, cfg.Format, m.Files); err != nil {
		return nil, err
	}
	m.Complete, m.Verified = true, verified
	if err := writeManifest(dest, m); err != nil {
		return nil, fmt.Errorf("writing manifest: %w", err)
	}
	pruneUnselected(dest, old, m, log)
	removeEmptyDirs(filepath.Join(dest, metaDir, partialDir))
	t.setVerified(verified)
	t.setPhase(PhaseComplete, fmt.Sprintf("%d files, %s", len(m.Files), FormatBytes(m.TotalBytes)))
	log.Info("fetch complete", "dir", dest, "files", len(m.Files), "bytes", m.TotalBytes, "downloaded", downloaded)
	return &Result{Files: len(m.Files), TotalBytes: m.TotalBytes, Downloaded: downloaded, Revision: revision, Dir: dest}, nil
}

// reusable tells whether the cached entry e is the same content as f.
func reusable(e ManifestFile, f RemoteFile, dest string) bool {
	if e.Size != f.Size {
		return false
	}
	switch {
	case f.SHA256 != "":
		if e.SHA256 != f.SHA256 {
			return false
		}
	case f.GitOID != "":
		if e.GitOID != f.GitOID {
			return false
		}
	case f.ETag != "":
		if e.ETag != f.ETag {
			return false
		}
	default:
		return false
	}
	fi, err := os.Stat(filepath.Join(dest, filepath.FromSlash(f.Path)))
	return err == nil && fi.Mode().IsRegular() && fi.Size() == f.Size
}

func listWithRetry(ctx context.Context, cfg Config, src Source, log *slog.Logger) ([]RemoteFile, string, error) {
	d := &downloader{cfg: cfg}
	for attempt := 1; ; attempt++ {
		// Bodies of listing responses have no stall detector: bound the
		// whole attempt instead.
		actx, cancel := context.WithTimeout(ctx, 10*cfg.RequestTimeout)
		files, rev, err := src.List(actx)
		cancel()
		if err == nil {
			return files, rev, nil
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		if !retryable(err) {
			return nil, "", err
		}
		if attempt >= cfg.MaxAttempts {
			return nil, "", fmt.Errorf("%w: %d attempts: %w", ErrGaveUp, attempt, err)
		}
		wait := d.backoff(attempt)
		log.Warn("retrying listing", "attempt", attempt+1, "wait", wait.Round(time.Millisecond).String(), "err", err.Error())
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(wait):
		}
	}
}

// checkSpace fails before any download when the files still missing do not
// fit on the cache filesystem (with cfg.MinFreeBytes to spare).
func checkSpace(cfg Config, d *downloader, pending []RemoteFile, free func(string) (int64, error)) error {
	var need int64
	for _, f := range pending {
		part, _ := d.partPaths(f.Path)
		need += max(0, f.Size-allocatedBytes(part))
	}
	if need == 0 {
		return nil
	}
	avail, err := free(cfg.Dest)
	if err != nil {
		return fmt.Errorf("checking free space in %s: %w", cfg.Dest, err)
	}
	if need+cfg.MinFreeBytes > avail {
		return fmt.Errorf("%w in %s: need %s (+%s headroom), %s available", ErrNoSpace, cfg.Dest,
			FormatBytes(need), FormatBytes(cfg.MinFreeBytes), FormatBytes(avail))
	}
	return nil
}

// verifyInPlace handles pvc:// and pre-converted models: nothing is
// downloaded; the files are checked against the manifest when there is one,
// otherwise hashed and recorded.
func verifyInPlace(ctx context.Context, cfg Config, dir string, t *tracker, log *slog.Logger) (*Result, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: model directory %s: %w", ErrNotFound, dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: model directory %s: not a directory", ErrNotFound, dir)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrVerification, err)
	}
	hadManifest := m != nil
	if m == nil {
		m = &Manifest{Version: ManifestVersion, Source: cfg.Source, Format: cfg.Format, Fetcher: "orchestra-fetch/" + version.Version}
		err := filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			rel = filepath.ToSlash(rel)
			if de.IsDir() {
				if rel == metaDir || strings.HasPrefix(de.Name(), ".") && rel != "." {
					return filepath.SkipDir
				}
				return nil
			}
			if !de.Type().IsRegular() || strings.HasPrefix(de.Name(), ".") {
				return nil
			}
			info, err := de.Info()
			if err != nil {
				return err
			}
			m.put(ManifestFile{Path: rel, Size: info.Size()})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walking %s: %w", dir, err)
		}
		if len(m.Files) == 0 {
			return nil, fmt.Errorf("%w: model directory %s holds no files", ErrVerification, dir)
		}
	}
	t.setTotals(len(m.Files), m.TotalBytes)
	t.setPhase(PhaseVerifying, "verifying "+dir)
	log.Info("verifying model in place", "dir", dir, "files", len(m.Files), "bytes", m.TotalBytes, "manifest", hadManifest)

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cfg.Concurrency)
	for i := range m.Files {
		f := &m.Files[i]
		g.Go(func() error {
			p := filepath.Join(dir, filepath.FromSlash(f.Path))
			st, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("%w: %s is missing: %w", ErrVerification, f.Path, err)
			}
			if st.Size() != f.Size {
				return fmt.Errorf("%w: %s is %d bytes, manifest says %d", ErrVerification, f.Path, st.Size(), f.Size)
			}
			if !cfg.VerifySHA256 {
				t.add(f.Size)
				t.fileDone()
				return nil
			}
			got, err := hashFile(gctx, p, t)
			if err != nil {
				return fmt.Errorf("hashing %s: %w", f.Path, err)
			}
			if f.SHA256 != "" && got != f.SHA256 {
				return fmt.Errorf("%w: %s: sha256 %s, manifest says %s", ErrVerification, f.Path, got, f.SHA256)
			}
			f.SHA256 = got
			t.fileDone()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := checkFormat(dir, cfg.Format, m.Files); err != nil {
		return nil, err
	}
	if !hadManifest {
		m.Complete, m.Verified = true, cfg.VerifySHA256
		if err := writeManifest(dir, m); err != nil {
			log.Warn("could not record a manifest (read-only volume?)", "dir", dir, "err", err)
		}
	}
	t.setVerified(cfg.VerifySHA256)
	t.setPhase(PhaseComplete, fmt.Sprintf("verified %d files, %s", len(m.Files), FormatBytes(m.TotalBytes)))
	log.Info("model verified", "dir", dir, "files", len(m.Files), "bytes", m.TotalBytes)
	return &Result{Files: len(m.Files), TotalBytes: m.TotalBytes, CacheHit: true, Dir: dir}, nil
}

// pruneUnselected removes files an earlier run published that the current
// selection no longer contains. Files the fetcher never recorded are left
// alone.
func pruneUnselected(dest string, old, cur *Manifest, log *slog.Logger) {
	if old == nil {
		return
	}
	for _, f := range old.Files {
		if _, ok := cur.file(f.Path); ok {
			continue
		}
		if err := os.Remove(filepath.Join(dest, filepath.FromSlash(f.Path))); err == nil {
			log.Info("removed file no longer selected", "file", f.Path)
		}
	}
}

// removeEmptyDirs removes dir and its subdirectories when they hold no files.
func removeEmptyDirs(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			removeEmptyDirs(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.Remove(dir) // fails, harmlessly, when not empty
}

// sameHash re-hashes a cached file against its manifest entry.
func sameHash(ctx context.Context, dest string, e ManifestFile) bool {
	if e.SHA256 == "" {
		return false
	}
	got, err := hashFile(ctx, filepath.Join(dest, filepath.FromSlash(e.Path)), nil)
	return err == nil && got == e.SHA256
}
