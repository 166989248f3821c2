package fetch

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
	hs        *hashStream // nil when not verifying

	mu sync.Mutex
	// written is, per chunk, how many bytes from its start are written
	// (the whole chunk once done): the hasher may read those back.
	written []int64

	// The syncer starts writeback of finished chunks, fsyncs the partial
	// file in the background and reports which chunks that made durable.
	listed    []int // snapshot of done chunks for the syncer
	durable   []int
	synced    chan struct{}
	writeback chan int // finished chunks to start writing to disk
}

func (ft *fileTask) chunkRange(i int) (int64, int64) {
	off := int64(i) * ft.chunkSize
	return off, min(off+ft.chunkSize, ft.rf.Size)
}

// wrote records that n bytes of *bp were written at off and offers them to
// the hasher; it returns true when the hasher took the buffer.
func (ft *fileTask) wrote(off int64, bp *[]byte, n int) bool {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if ft.hs == nil {
		ft.written[off/ft.chunkSize] += int64(n)
		return false
	}
	handed := ft.hs.offer(off, bp, n)
	ft.written[off/ft.chunkSize] += int64(n)
	if !handed {
		ft.hs.wake() // in case these bytes are at the frontier after all
	}
	return handed
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
	// hashed is signalled when a hasher moves forward (cap 1).
	hashed chan struct{}
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
	ft.written = make([]int64, ft.nchunks)
	for i := range done {
		off, end := ft.chunkRange(i)
		ft.written[i] = end - off
	}
	if h := d.hashersFor(ft); h != nil {
		ft.hs = newHashStream(ft, h, d.putBuf, d.hashMoved)
	}
	ft.doneCh = make(chan chunkDone, ft.nchunks+1)
	if resumed > 0 {
		d.progress.add(resumed)
		d.log.Info("resuming file", "file", rf.Path, "chunksDone", len(done), "chunks", ft.nchunks, "bytes", resumed)
	}
	return ft, nil
}

// activeFiles is how many files the workers share at a time: at least
// two, so that hashing one file (one core each, in order) overlaps
// receiving another, and one per CPU when there are enough ranges.
func (d *downloader) activeFiles() int {
	return max(1, min(d.cfg.Concurrency, max(2, runtime.GOMAXPROCS(0))))
}

// lookahead is how many chunks past the one its hasher is in a file may
// start: one more than the ranges each active file gets. When hashing is
// the bottleneck (fast network, few CPUs) this keeps the download from
// running ahead of it, so that little is left to hash when the last byte
// arrives and the unhashed bytes are few enough to still be in the page
// cache when they are read back. When the network is the bottleneck the
// hasher keeps up and this rarely holds a chunk back.
func (d *downloader) lookahead() int {
	f := d.activeFiles()
	return (d.cfg.Concurrency+f-1)/f + 1
}

// mayStart tells whether chunk idx of ft is within its hasher's lookahead.
func (d *downloader) mayStart(ft *fileTask, idx int) bool {
	if ft.hs == nil {
		return true
	}
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return idx < int(ft.hs.hashed/ft.chunkSize)+d.lookahead()
}

// hashMoved wakes a scheduler waiting for a hasher.
func (d *downloader) hashMoved() {
	select {
	case d.hashed <- struct{}{}:
	default:
	}
}

// run downloads files with cfg.Concurrency workers taking chunks from one
// queue that interleaves the active files (in order within each file), one
// finisher per open file keeping its journal and publishing it, and one
// hasher per file when verifying.
func (d *downloader) run(ctx context.Context, files []RemoteFile) error {
	d.hashed = make(chan struct{}, 1)
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
		var active []*fileTask
		next, turn := 0, 0
		for {
			for len(active) < d.activeFiles() && next < len(files) {
				ft, err := d.prepare(files[next])
				if err != nil {
					return err
				}
				next++
				g.Go(func() error { return d.finish(ctx, ft) })
				if len(ft.pending) > 0 {
					active = append(active, ft)
				}
			}
			if len(active) == 0 {
				return nil
			}
			// The next file in turn whose next chunk is within its lookahead.
			pick := -1
			for k := range active {
				if i := (turn + k) % len(active); d.mayStart(active[i], active[i].pending[0]) {
					pick = i
					break
				}
			}
			if pick < 0 {
				select {
				case <-d.hashed:
					continue
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			turn = pick
			ft := active[turn]
			select {
			case jobs <- chunkJob{ft, ft.pending[0]}:
			case <-ctx.Done():
				return ctx.Err()
			}
			if ft.pending = ft.pending[1:]; len(ft.pending) == 0 {
				active = slices.Delete(active, turn, turn+1)
			} else {
				turn++
			}
		}
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

// bufSize is the unit of reading, writing and hashing.
const bufSize = 1 << 20

func (d *downloader) getBuf() *[]byte {
	if bp, ok := d.bufPool.Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, bufSize)
	return &b
}

func (d *downloader) putBuf(bp *[]byte) { d.bufPool.Put(bp) }

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

	bp := d.getBuf()
	defer func() { d.putBuf(bp) }() // the buffer held at the end, not necessarily this one
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
			if ft.wrote(pos+written, bp, filled) {
				bp = d.getBuf() // the hasher has this one now
				buf = *bp
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

// finish collects finished chunks of ft, keeps the journal current, starts
// their writeback, and publishes the file once it is complete, durable and
// verified. The hasher runs beside it.
func (d *downloader) finish(ctx context.Context, ft *fileTask) (err error) {
	hctx, stopHasher := context.WithCancel(ctx)
	hashed := make(chan error, 1)
	if ft.hs != nil {
		go func() { hashed <- ft.hs.run(hctx) }()
	} else {
		hashed <- nil
	}
	hasherRunning := true
	defer func() {
		// The hasher reads the file: stop it before closing the file.
		stopHasher()
		if hasherRunning {
			if herr := <-hashed; err == nil {
				err = herr // keep the first error
			}
		}
		// verifyAndPublish closes fh itself on success, so this only runs
		// on an error path; keep the first error.
		if ft.fh != nil {
			if cerr := ft.fh.Close(); err == nil && cerr != nil {
				err = writeErr(ft.rf.Path, cerr)
			}
		}
	}()
	done := make([]bool, ft.nchunks)
	ndone := 0
	for _, i := range ft.j.Done {
		if i >= 0 && i < ft.nchunks && !done[i] {
			done[i] = true
			ndone++
		}
	}

	// saveJournal records the chunks written so far, with the newest hash
	// state that covers only recorded chunks; durable (after an fsync by the
	// syncer) also makes the journal itself durable.
	saveJournal := func(durable bool) error {
		ft.j.Done = ft.j.Done[:0]
		prefix := -1
		for i, ok := range done {
			if ok {
				ft.j.Done = append(ft.j.Done, i)
			} else if prefix < 0 {
				prefix = i
			}
		}
		if prefix < 0 {
			prefix = ft.nchunks
		}
		ft.mu.Lock()
		ft.listed = append(ft.listed[:0], ft.j.Done...)
		ft.j.Durable = append(ft.j.Durable[:0], ft.durable...)
		if ft.hs != nil {
			if s, ok := ft.hs.saveable(prefix); ok {
				ft.j.Hashed, ft.j.SHAState, ft.j.GitState = s.chunks, s.sha, s.git
			}
		}
		ft.mu.Unlock()
		ft.j.BootID = bootID()
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

	var batch []chan error
	take := func(c chunkDone) {
		if !done[c.idx] {
			done[c.idx] = true
			ndone++
			ft.writeback <- c.idx // buffered for every chunk: never blocks
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
		case err := <-hashed:
			hasherRunning = false
			if err != nil {
				return err
			}
			continue // the hasher finished: nothing else is missing
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
	}
	// Every byte is written: make it durable while the hasher catches up.
	stopSyncer()
	if err := ft.fh.Sync(); err != nil {
		return writeErr(ft.rf.Path, err)
	}
	if hasherRunning {
		select {
		case err := <-hashed:
			hasherRunning = false
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return d.verifyAndPublish(ft)
}

// syncEvery is how often a partial file is fsynced so that a node crash
// loses at most this much download time per file.
var syncEvery = 3 * time.Second

// startSyncer starts writing each finished chunk of ft to disk at once (so
// that the fsyncs, the last one before publishing above all, find little
// left to write), fsyncs ft every syncEvery, and records which chunks that
// made durable. The returned stop function is idempotent.
func (d *downloader) startSyncer(ft *fileTask) (stop func()) {
	ft.synced = make(chan struct{}, 1)
	ft.writeback = make(chan int, ft.nchunks+1)
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
			case i := <-ft.writeback:
				off, end := ft.chunkRange(i)
				startWriteback(ft.fh, off, end-off)
				continue
			case <-t.C:
			}
			ft.mu.Lock()
			snap := append([]int(nil), ft.listed...)
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

// verifyAndPublish checks the digests of the complete, fsynced file and
// renames it into place.
func (d *downloader) verifyAndPublish(ft *fileTask) error {
	entry := ManifestFile{Path: ft.rf.Path, Size: ft.rf.Size, SHA256: ft.rf.SHA256, GitOID: ft.rf.GitOID, ETag: ft.rf.ETag}
	if ft.hs != nil {
		h := ft.hs.h
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
		d.log.Debug("hashed", "file", ft.rf.Path, "readBack", ft.hs.readBack)
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
