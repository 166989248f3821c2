package fetch

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// errStalled cancels an attempt that received no bytes for StallTimeout.
var errStalled = errors.New("stalled: no data received")

const journalVersion = 1

// journal is the resume state of one partially downloaded file, stored next
// to the .part file. Chunks listed in Done were written and fsynced before
// the journal naming them was written.
type journal struct {
	Version   int    `json:"version"`
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256,omitempty"`
	GitOID    string `json:"gitOid,omitempty"`
	ETag      string `json:"etag,omitempty"`
	ChunkSize int64  `json:"chunkSize"`
	// Done chunks are written (at least to the page cache of BootID's boot).
	Done []int `json:"done"`
	// Durable chunks were fsynced: they survive a node crash.
	Durable []int `json:"durable"`
	// BootID identifies the kernel boot that wrote the journal; after a
	// reboot only Durable chunks are trusted.
	BootID string `json:"bootId"`
	// Hashed chunks [0, Hashed) are folded into the saved hash states.
	Hashed   int    `json:"hashed"`
	SHAState []byte `json:"shaState,omitempty"`
	GitState []byte `json:"gitState,omitempty"`
}

// bootID identifies the running kernel boot ("" when unknown, which is
// never trusted as the same boot).
var bootID = func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// trustable returns the chunks of j that can be reused now: all written
// ones on the same boot, only the fsynced ones after a reboot (the page
// cache is gone). The hash state is dropped when it covers lost chunks.
func (j *journal) trustable(boot string) {
	if boot != "" && j.BootID == boot {
		return
	}
	j.Done = append([]int(nil), j.Durable...)
	durable := map[int]bool{}
	for _, i := range j.Durable {
		durable[i] = true
	}
	for i := 0; i < j.Hashed; i++ {
		if !durable[i] {
			j.Hashed, j.SHAState, j.GitState = 0, nil, nil
			break
		}
	}
}

// fileTask is one file being downloaded.
type fileTask struct {
	rf        RemoteFile
	final     string
	part      string
	jpath     string
	chunkSize int64
	nchunks   int
	fh        *os.File
	doneCh    chan chunkDone // chunks written by workers
	pending   []int
	j         journal

	// The syncer fsyncs the partial file in the background and reports
	// which chunks that made durable.
	mu      sync.Mutex
	written []int // snapshot of done chunks for the syncer
	durable []int
	synced  chan struct{}
}

func (ft *fileTask) chunkRange(i int) (int64, int64) {
	off := int64(i) * ft.chunkSize
	return off, min(off+ft.chunkSize, ft.rf.Size)
}

type chunkJob struct {
	ft  *fileTask
	idx int
}

// chunkDone tells the finisher a chunk is written; the worker waits on ack
// until the journal lists the chunk, so a killed process loses at most the
// chunk each worker is busy with (durability against node crashes is the
// syncer's job).
type chunkDone struct {
	idx int
	ack chan error
}

// downloader fetches the pending files of one run.
type downloader struct {
	cfg      Config
	src      Source
	dest     string
	log      *slog.Logger
	progress *tracker
	publish  func(ManifestFile) error
	bufPool  sync.Pool
}

func (d *downloader) partPaths(p string) (part, jpath string) {
	base := filepath.Join(d.dest, metaDir, partialDir, filepath.FromSlash(p))
	return base + ".part", base + ".journal"
}

// resumeState loads a journal that matches rf, or nil.
func (d *downloader) resumeState(rf RemoteFile, part, jpath string) *journal {
	b, err := os.ReadFile(jpath)
	if err != nil {
		return nil
	}
	var j journal
	if json.Unmarshal(b, &j) != nil || j.Version != journalVersion || j.Path != rf.Path || j.Size != rf.Size ||
		j.SHA256 != rf.SHA256 || j.GitOID != rf.GitOID || j.ETag != rf.ETag || j.ChunkSize <= 0 {
		return nil
	}
	fi, err := os.Stat(part)
	if err != nil || fi.Size() != rf.Size {
		return nil
	}
	j.trustable(bootID())
	return &j
}

// prepare opens (or resumes) the partial file of rf and returns its task.
func (d *downloader) prepare(rf RemoteFile) (*fileTask, error) {
	part, jpath := d.partPaths(rf.Path)
	ft := &fileTask{rf: rf, final: filepath.Join(d.dest, filepath.FromSlash(rf.Path)), part: part, jpath: jpath}
	if j := d.resumeState(rf, part, jpath); j != nil {
		ft.j = *j
	} else {
		// Best effort: a stale partial that survives is harmless, since the
		// fresh journal marks no chunk done and every byte is written again.
		_ = os.Remove(jpath)
		_ = os.Remove(part)
		ft.j = journal{Version: journalVersion, Path: rf.Path, Size: rf.Size, SHA256: rf.SHA256,
			GitOID: rf.GitOID, ETag: rf.ETag, ChunkSize: d.cfg.ChunkSize}
	}
	ft.chunkSize = ft.j.ChunkSize
	ft.durable = append([]int(nil), ft.j.Durable...)
	ft.nchunks = int((rf.Size + ft.chunkSize - 1) / ft.chunkSize)
	if err := os.MkdirAll(filepath.Dir(part), 0o755); err != nil {
		return nil, fmt.Errorf("creating partial directory: %w", err)
	}
	fh, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", part, err)
	}
	if err := reserve(fh, rf.Size); err != nil {
		_ = fh.Close() // nothing written yet; the reserve error is what matters
		return nil, writeErr(rf.Path, fmt.Errorf("reserving %s: %w", FormatBytes(rf.Size), err))
	}
	ft.fh = fh
	done := make(map[int]bool, len(ft.j.Done))
	var resumed int64
	for _, i := range ft.j.Done {
		if i >= 0 && i < ft.nchunks && !done[i] {
			done[i] = true
			off, end := ft.chunkRange(i)
			resumed += end - off
		}
	}
	for i := 0; i < ft.nchunks; i++ {
		if !done[i] {
			ft.pending = append(ft.pending, i)
		}
	}
	ft.doneCh = make(chan chunkDone, ft.nchunks+1)
	if resumed > 0 {
		d.progress.add(resumed)
		d.log.Info("resuming file", "file", rf.Path, "chunksDone", len(done), "chunks", ft.nchunks, "bytes", resumed)
	}
	return ft, nil
}

// run downloads files with cfg.Concurrency workers sharing one queue of
// chunks in file order, one finisher per open file hashing and publishing.
func (d *downloader) run(ctx context.Context, files []RemoteFile) error {
	g, ctx := errgroup.WithContext(ctx)
	jobs := make(chan chunkJob)
	for w := 0; w < d.cfg.Concurrency; w++ {
		g.Go(func() error {
			for job := range jobs {
				if err := d.fetchChunk(ctx, job.ft, job.idx); err != nil {
					return err
				}
				ack := make(chan error, 1)
				job.ft.doneCh <- chunkDone{job.idx, ack}
				select {
				case err := <-ack:
					if err != nil {
						return err
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(jobs)
		for _, rf := range files {
			ft, err := d.prepare(rf)
			if err != nil {
				return err
			}
			g.Go(func() error { return d.finish(ctx, ft) })
			for _, idx := range ft.pending {
				select {
				case jobs <- chunkJob{ft, idx}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	})
	return g.Wait()
}

// fetchChunk downloads one chunk, retrying from the last byte written.
func (d *downloader) fetchChunk(ctx context.Context, ft *fileTask, idx int) error {
	off, end := ft.chunkRange(idx)
	pos := off
	failures := 0
	for {
		n, err := d.fetchOnce(ctx, ft, pos, end)
		pos += n
		if err == nil && pos == end {
			return nil
		}
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) {
			return fmt.Errorf("%s bytes %d-%d: %w", ft.rf.Path, pos, end-1, err)
		}
		if n > 0 {
			failures = 0 // progress: this is a new problem, not the same one again
		}
		failures++
		if failures >= d.cfg.MaxAttempts {
			return fmt.Errorf("%w: %s bytes %d-%d: %d attempts without progress: %w",
				ErrGaveUp, ft.rf.Path, pos, end-1, failures, err)
		}
		wait := d.backoff(failures)
		var se *statusError
		if errors.As(err, &se) && se.RetryAfter > wait {
			wait = min(se.RetryAfter, d.cfg.BackoffMax)
		}
		d.log.Warn("retrying range", "file", ft.rf.Path, "offset", pos, "attempt", failures+1,
			"wait", wait.Round(time.Millisecond).String(), "err", err.Error())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// backoff is exponential with full jitter: random in [base/2, base*2^(n-1)].
func (d *downloader) backoff(failures int) time.Duration {
	ceil := d.cfg.BackoffBase << min(failures-1, 20)
	if ceil > d.cfg.BackoffMax || ceil <= 0 {
		ceil = d.cfg.BackoffMax
	}
	lo := d.cfg.BackoffBase / 2
	if ceil <= lo {
		return ceil
	}
	return lo + rand.N(ceil-lo)
}

const bufSize = 1 << 20

// fetchOnce makes one request for [pos, end) and writes what arrives. It
// returns the bytes written, even on error.
func (d *downloader) fetchOnce(ctx context.Context, ft *fileTask, pos, end int64) (int64, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(d.cfg.StallTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	stalled := func(err error) error {
		if errors.Is(context.Cause(actx), errStalled) && ctx.Err() == nil {
			return fmt.Errorf("%w for %s: %w", errStalled, d.cfg.StallTimeout, err)
		}
		return err
	}

	body, err := d.src.OpenRange(actx, ft.rf, pos, end-pos)
	if err != nil {
		return 0, stalled(err)
	}
	defer func() { _ = body.Close() }() // read-only response body

	bp, _ := d.bufPool.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, bufSize)
		bp = &b
	}
	defer d.bufPool.Put(bp)
	buf := *bp

	var written int64
	for pos+written < end {
		// Fill the buffer (or up to the end of the range) before writing.
		want := min(int64(len(buf)), end-pos-written)
		filled := 0
		var rerr error
		for int64(filled) < want && rerr == nil {
			var n int
			n, rerr = body.Read(buf[filled:want])
			if n > 0 {
				filled += n
				stall.Reset(d.cfg.StallTimeout)
			}
		}
		if filled > 0 {
			if _, werr := ft.fh.WriteAt(buf[:filled], pos+written); werr != nil {
				return written, writeErr(ft.rf.Path, werr)
			}
			written += int64(filled)
			d.progress.add(int64(filled))
		}
		if rerr == io.EOF {
			if pos+written < end {
				return written, io.ErrUnexpectedEOF
			}
			break
		}
		if rerr != nil {
			return written, stalled(rerr)
		}
	}
	return written, nil
}

func writeErr(p string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: writing %s: %w", ErrNoSpace, p, err)
	}
	return permanent(fmt.Errorf("writing %s: %w", p, err))
}

// hashers builds the hash state for ft, restored from its journal.
type fileHashers struct {
	sha hash.Hash
	git hash.Hash
}

func (d *downloader) hashersFor(ft *fileTask) (*fileHashers, error) {
	if !d.cfg.VerifySHA256 {
		return nil, nil
	}
	h := &fileHashers{sha: sha256.New()}
	if ft.rf.SHA256 == "" && ft.rf.GitOID != "" {
		h.git = sha1.New()
	}
	if ft.j.Hashed > 0 && len(ft.j.SHAState) > 0 {
		ok := h.sha.(encoding.BinaryUnmarshaler).UnmarshalBinary(ft.j.SHAState) == nil
		if h.git != nil {
			ok = ok && len(ft.j.GitState) > 0 && h.git.(encoding.BinaryUnmarshaler).UnmarshalBinary(ft.j.GitState) == nil
		}
		if ok {
			return h, nil
		}
		h.sha.Reset()
		if h.git != nil {
			h.git.Reset()
		}
	}
	ft.j.Hashed = 0
	if h.git != nil {
		_, _ = fmt.Fprintf(h.git, "blob %d\x00", ft.rf.Size) // hash.Hash writes never fail
	}
	return h, nil
}

// finish collects finished chunks of ft, makes them durable, hashes them in
// order, keeps the journal current, and publishes the verified file.
func (d *downloader) finish(ctx context.Context, ft *fileTask) (err error) {
	defer func() {
		// verifyAndPublish closes fh itself on success, so this only runs
		// on an error path; keep the first error.
		if ft.fh != nil {
			if cerr := ft.fh.Close(); err == nil && cerr != nil {
				err = writeErr(ft.rf.Path, cerr)
			}
		}
	}()
	h, err := d.hashersFor(ft)
	if err != nil {
		return err
	}
	done := make([]bool, ft.nchunks)
	ndone := 0
	for _, i := range ft.j.Done {
		if i >= 0 && i < ft.nchunks && !done[i] {
			done[i] = true
			ndone++
		}
	}
	buf := make([]byte, bufSize)

	// hashUpTo folds every contiguous finished chunk into the hash.
	hashUpTo := func() error {
		if h == nil {
			return nil
		}
		for ft.j.Hashed < ft.nchunks && done[ft.j.Hashed] {
			off, end := ft.chunkRange(ft.j.Hashed)
			for off < end {
				n := min(int64(len(buf)), end-off)
				if _, err := ft.fh.ReadAt(buf[:n], off); err != nil {
					return fmt.Errorf("reading back %s: %w", ft.rf.Path, err)
				}
				h.sha.Write(buf[:n])
				if h.git != nil {
					h.git.Write(buf[:n])
				}
				off += n
			}
			ft.j.Hashed++
		}
		return nil
	}
	// saveJournal records the chunks written so far; durable (after an
	// fsync by the syncer) also makes the journal itself durable.
	saveJournal := func(durable bool) error {
		ft.j.Done = ft.j.Done[:0]
		for i, ok := range done {
			if ok {
				ft.j.Done = append(ft.j.Done, i)
			}
		}
		ft.mu.Lock()
		ft.written = append(ft.written[:0], ft.j.Done...)
		ft.j.Durable = append(ft.j.Durable[:0], ft.durable...)
		ft.mu.Unlock()
		ft.j.BootID = bootID()
		if h != nil {
			ft.j.SHAState, _ = h.sha.(encoding.BinaryMarshaler).MarshalBinary()
			if h.git != nil {
				ft.j.GitState, _ = h.git.(encoding.BinaryMarshaler).MarshalBinary()
			}
		}
		b, err := json.Marshal(&ft.j)
		if err != nil {
			return err
		}
		write := writeFileQuick
		if durable {
			write = writeFileAtomic
		}
		if err := write(ft.jpath, b); err != nil {
			return writeErr(ft.rf.Path, err)
		}
		return nil
	}
	stopSyncer := d.startSyncer(ft)
	defer stopSyncer()

	if err := hashUpTo(); err != nil {
		return err
	}
	var batch []chan error
	take := func(c chunkDone) {
		if !done[c.idx] {
			done[c.idx] = true
			ndone++
		}
		batch = append(batch, c.ack)
	}
	drain := func() {
		for {
			select {
			case c := <-ft.doneCh:
				take(c)
			default:
				return
			}
		}
	}
	ackAll := func(err error) {
		for _, a := range batch {
			a <- err
		}
		batch = batch[:0]
	}
	for ndone < ft.nchunks {
		durable := false
		select {
		case <-ctx.Done():
			// Keep what already arrived for the next run.
			drain()
			if len(batch) > 0 {
				if err := saveJournal(false); err != nil {
					d.log.Warn("saving resume state", "file", ft.rf.Path, "err", err)
				}
			}
			ackAll(ctx.Err())
			return ctx.Err()
		case c := <-ft.doneCh:
			take(c)
		case <-ft.synced:
			durable = true
		}
		drain() // chunks that finished meanwhile share one journal write
		err := saveJournal(durable)
		ackAll(err)
		if err != nil {
			return err
		}
		if err := hashUpTo(); err != nil {
			return err
		}
	}
	if err := hashUpTo(); err != nil {
		return err
	}
	stopSyncer()
	return d.verifyAndPublish(ft, h)
}

// syncEvery is how often a partial file is fsynced so that a node crash
// loses at most this much download time per file.
var syncEvery = 3 * time.Second

// startSyncer fsyncs ft in the background every syncEvery and records which
// chunks that made durable. The returned stop function is idempotent.
func (d *downloader) startSyncer(ft *fileTask) (stop func()) {
	ft.synced = make(chan struct{}, 1)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(syncEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			ft.mu.Lock()
			snap := append([]int(nil), ft.written...)
			n := len(ft.durable)
			ft.mu.Unlock()
			if len(snap) == n {
				continue
			}
			if err := ft.fh.Sync(); err != nil {
				d.log.Warn("fsync of partial file failed", "file", ft.rf.Path, "err", err)
				continue
			}
			ft.mu.Lock()
			ft.durable = snap
			ft.mu.Unlock()
			select {
			case ft.synced <- struct{}{}:
			default:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			wg.Wait()
		})
	}
}

func (d *downloader) verifyAndPublish(ft *fileTask, h *fileHashers) error {
	entry := ManifestFile{Path: ft.rf.Path, Size: ft.rf.Size, SHA256: ft.rf.SHA256, GitOID: ft.rf.GitOID, ETag: ft.rf.ETag}
	if h != nil {
		got := hex.EncodeToString(h.sha.Sum(nil))
		var mismatch string
		switch {
		case ft.rf.SHA256 != "" && got != ft.rf.SHA256:
			mismatch = fmt.Sprintf("sha256 %s, expected %s", got, ft.rf.SHA256)
		case h.git != nil:
			if gotGit := hex.EncodeToString(h.git.Sum(nil)); gotGit != ft.rf.GitOID {
				mismatch = fmt.Sprintf("git blob id %s, expected %s", gotGit, ft.rf.GitOID)
			}
		}
		if mismatch != "" {
			// Start this file from scratch next time; never publish it.
			// Best effort: the file is being discarded either way.
			_ = ft.fh.Close()
			ft.fh = nil
			_ = os.Remove(ft.part)
			_ = os.Remove(ft.jpath)
			return fmt.Errorf("%w: %s: got %s", ErrVerification, ft.rf.Path, mismatch)
		}
		entry.SHA256 = got
	}
	if err := ft.fh.Sync(); err != nil {
		return writeErr(ft.rf.Path, err)
	}
	if err := ft.fh.Close(); err != nil {
		return writeErr(ft.rf.Path, err)
	}
	ft.fh = nil
	if err := os.MkdirAll(filepath.Dir(ft.final), 0o755); err != nil {
		return fmt.Errorf("publishing %s: %w", ft.rf.Path, err)
	}
	if err := os.Rename(ft.part, ft.final); err != nil {
		return fmt.Errorf("publishing %s: %w", ft.rf.Path, err)
	}
	if err := syncDir(filepath.Dir(ft.final)); err != nil {
		return fmt.Errorf("publishing %s: %w", ft.rf.Path, err)
	}
	if err := os.Remove(ft.jpath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("removing journal", "file", ft.rf.Path, "err", err)
	}
	d.progress.fileDone()
	d.log.Info("file ready", "file", ft.rf.Path, "size", ft.rf.Size, "sha256", entry.SHA256)
	return d.publish(entry)
}

// hashFile returns the hex sha256 of the file at p, counting bytes into t.
func hashFile(ctx context.Context, p string, t *tracker) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }() // opened read-only
	h := sha256.New()
	buf := make([]byte, bufSize)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		n, err := f.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			if t != nil {
				t.add(int64(n))
			}
		}
		if err == io.EOF {
			return hex.EncodeToString(h.Sum(nil)), nil
		}
		if err != nil {
			return "", err
		}
	}
}
