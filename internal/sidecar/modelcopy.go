package sidecar

// The engine loads the hottest verified copy of its model file on its
// node. Engines that open their model file at each load (Ollama re-opens
// its blob, llama.cpp's router re-opens the preset's model path) are
// pointed at a symlink, the link, in a directory the engine container
// and the sidecar share (an emptyDir). The sidecar is the link's one
// writer: at its start, before each wake and whenever the copy it points
// at goes away, it points the link at the first of
//
//	hot:  <hot dir>/<name>   the node agent's copy in RAM
//	warm: <warm dir>/<name>  the node agent's copy on disk
//	cold: <model dir>/<file> the model cache
//
// that qualifies. A hot or warm copy qualifies only when the node agent's
// metadata beside it (.<name>.meta.json) records the same size and the
// same sha256 as the fetcher's manifest lists for the model file: the
// agent writes a copy under a temporary name, verifies it against the
// manifest while copying, writes the metadata and only then renames it
// into place, so a partly written or unverified copy is never pointed
// at. The node agent owns the copies (placement, budgets, eviction,
// periodic re-verification, which drops a copy that no longer matches);
// the sidecar owns which one the engine opens. The link is replaced
// atomically (a new symlink renamed over it): a load that runs meanwhile
// opens the old or the new copy, never a missing file.

import (
	"github.com/model-orchestra/operator/api/v1alpha1"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// ModelCopiesConfig places the copies of an engine's model file, as the
// sidecar's container sees them (the same paths as the engine's).
type ModelCopiesConfig struct {
	// Link is the symlink the engine opens as its model file; its
	// directory is shared with the engine. Empty: the sidecar points the
	// engine at no copy (the engine reads its model where it was told).
	Link string `json:"link,omitempty"`
	// ModelDir is the model cache (/models), holding the fetcher's
	// .orchestra/manifest.json.
	ModelDir string `json:"modelDir,omitempty"`
	// File is the model file inside ModelDir.
	File string `json:"file,omitempty"`
	// HotDir and WarmDir are the node agent's namespace directories of
	// the hot and warm tiers; empty: the tier is not used.
	HotDir  string `json:"hotDir,omitempty"`
	WarmDir string `json:"warmDir,omitempty"`
	// Name is the copies' name in the tiers (the ModelCheckpoint's).
	Name string `json:"name,omitempty"`
}

// Enabled reports whether the sidecar points the engine at a copy.
func (c ModelCopiesConfig) Enabled() bool { return c.Link != "" }

// validate reports every invalid field of an enabled configuration.
func (c ModelCopiesConfig) validate(engine v1alpha1.Engine) []error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	if engine != v1alpha1.EngineOllama && engine != v1alpha1.EngineLlamaCPP && engine != v1alpha1.EngineVLLM {
		errs = append(errs, fmt.Errorf("model link: the sidecar points only Ollama and llama.cpp (they re-open their model file at each load) and vLLM (its model directory, read at start and by a level-2 wake's reload_weights) at a copy, not %s", engine))
	}
	if !filepath.IsAbs(c.Link) || !filepath.IsAbs(c.ModelDir) {
		errs = append(errs, fmt.Errorf("model link %q and model dir %q must be absolute paths", c.Link, c.ModelDir))
	}
	// vLLM's model may be the whole cache (an empty file: the cache's root).
	if f := filepath.Clean(c.File); (c.File == "" && engine != v1alpha1.EngineVLLM) || filepath.IsAbs(c.File) || f == ".." || strings.HasPrefix(f, "../") {
		errs = append(errs, fmt.Errorf("model file %q must be a path inside the model dir", c.File))
	}
	if (c.HotDir != "" || c.WarmDir != "") && (c.Name == "" || strings.ContainsAny(c.Name, "/\x00") || strings.HasPrefix(c.Name, ".")) {
		errs = append(errs, fmt.Errorf("copy name %q must be a plain file name not starting with a dot", c.Name))
	}
	return errs
}

// ModelCopies chooses the copy an engine loads and points the link at it.
type ModelCopies struct {
	cfg ModelCopiesConfig

	mu      sync.Mutex
	current *sidecarapi.ModelCopy // what the link points at
	passed  []string              // why the last Point passed over the faster tiers
}

// NewModelCopies returns the chooser of cfg (which must be Enabled).
func NewModelCopies(cfg ModelCopiesConfig) *ModelCopies { return &ModelCopies{cfg: cfg} }

// Choose is the hottest qualifying copy now, without pointing at it. The
// model cache's file qualifies when it exists; an error says why none
// does.
func (m *ModelCopies) Choose() (sidecarapi.ModelCopy, error) {
	c, _, err := m.choose()
	return c, err
}

// choose is Choose, with why each faster tier did not qualify.
func (m *ModelCopies) choose() (sidecarapi.ModelCopy, []string, error) {
	want, listErr := ModelFilesOf(m.cfg.ModelDir, m.cfg.File)
	if listErr != nil && !errors.Is(listErr, errNotVouched) {
		return sidecarapi.ModelCopy{}, nil, listErr
	}
	var passed []string
	for _, t := range []struct {
		tier v1alpha1.Tier
		dir  string
	}{{v1alpha1.TierHot, m.cfg.HotDir}, {v1alpha1.TierWarm, m.cfg.WarmDir}} {
		if t.dir == "" {
			continue
		}
		if listErr != nil {
			passed = append(passed, fmt.Sprintf("%s: nothing vouches for a copy (%v)", t.tier, listErr))
			continue
		}
		c, err := tierCopy(t.dir, m.cfg.Name, want)
		if err == nil {
			c.Tier = t.tier
			return c, passed, nil
		}
		passed = append(passed, fmt.Sprintf("%s: %v", t.tier, err))
	}
	c, err := m.cold(want, listErr == nil)
	return c, passed, err
}

// cold is the model in the cache itself; want, when listed, is what the
// fetcher's manifest records for it.
func (m *ModelCopies) cold(want sidecarapi.ModelFiles, listed bool) (sidecarapi.ModelCopy, error) {
	cold := filepath.Join(m.cfg.ModelDir, m.cfg.File)
	fi, err := os.Stat(cold)
	if err != nil {
		return sidecarapi.ModelCopy{}, fmt.Errorf("the model in the cache: %w", err)
	}
	c := sidecarapi.ModelCopy{Tier: v1alpha1.TierCold, Path: cold, Bytes: fi.Size()}
	switch {
	case fi.IsDir() && listed:
		c.Bytes, c.Files = want.Bytes(), len(want.Files)
	case fi.IsDir():
		c.Bytes = 0 // unknown: no manifest lists the directory's files
	case listed && !want.Dir:
		c.SHA256 = want.Files[0].SHA256
	}
	return c, nil
}

// tierCopy is the node agent's copy name in dir when its metadata records
// the manifest's files (one file: its size and sha256; a directory: every
// file of the model with its size and sha256, nothing else) and the copy
// holds them with those sizes; the error says why it does not qualify.
func tierCopy(dir, name string, want sidecarapi.ModelFiles) (sidecarapi.ModelCopy, error) {
	b, err := os.ReadFile(filepath.Join(dir, nodeapi.CopyMetaName(name)))
	if errors.Is(err, os.ErrNotExist) {
		return sidecarapi.ModelCopy{}, errors.New("the node agent holds no copy")
	}
	if err != nil {
		return sidecarapi.ModelCopy{}, fmt.Errorf("reading the copy's metadata: %w", err)
	}
	var md nodeapi.CopyMeta
	if err := json.Unmarshal(b, &md); err != nil {
		return sidecarapi.ModelCopy{}, fmt.Errorf("the copy's metadata: %w", err)
	}
	p := filepath.Join(dir, name)
	if want.Dir {
		if err := sameFiles(md, want); err != nil {
			return sidecarapi.ModelCopy{}, err
		}
		for _, f := range md.Files {
			fi, err := os.Stat(filepath.Join(p, filepath.FromSlash(f.Path)))
			if err != nil {
				return sidecarapi.ModelCopy{}, err
			}
			if !fi.Mode().IsRegular() || fi.Size() != f.Bytes {
				return sidecarapi.ModelCopy{}, fmt.Errorf("%s in %s is not a regular file of %d bytes", f.Path, p, f.Bytes)
			}
		}
		return sidecarapi.ModelCopy{Path: p, Bytes: md.Bytes, Files: len(md.Files)}, nil
	}
	w := want.Files[0]
	if len(md.Files) > 0 || md.Bytes != w.Bytes || md.SHA256 == "" || !strings.EqualFold(md.SHA256, w.SHA256) {
		return sidecarapi.ModelCopy{}, fmt.Errorf("the copy's metadata records %d bytes with sha256 %q, the manifest %d bytes with %q", md.Bytes, md.SHA256, w.Bytes, w.SHA256)
	}
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return sidecarapi.ModelCopy{}, err
	case !fi.Mode().IsRegular() || fi.Size() != md.Bytes:
		return sidecarapi.ModelCopy{}, fmt.Errorf("%s is not a regular file of %d bytes", p, md.Bytes)
	}
	return sidecarapi.ModelCopy{Path: p, Bytes: md.Bytes, SHA256: strings.ToLower(md.SHA256)}, nil
}

// sameFiles reports how a directory copy's recorded files differ from
// the manifest's files of the model, if they do.
func sameFiles(md nodeapi.CopyMeta, want sidecarapi.ModelFiles) error {
	got := map[string]nodeapi.CopyFile{}
	for _, f := range md.Files {
		got[f.Path] = f
	}
	if len(md.Files) != len(want.Files) {
		return fmt.Errorf("the copy's metadata lists %d files, the manifest %d", len(md.Files), len(want.Files))
	}
	for _, w := range want.Files {
		g, ok := got[w.Path]
		if !ok || g.Bytes != w.Bytes || !strings.EqualFold(g.SHA256, w.SHA256) {
			return fmt.Errorf("the copy's metadata records %s as %d bytes with sha256 %q, the manifest %d bytes with %q", w.Path, g.Bytes, g.SHA256, w.Bytes, w.SHA256)
		}
	}
	return nil
}

// Point points the link at the hottest qualifying copy and returns it.
func (m *ModelCopies) Point() (sidecarapi.ModelCopy, error) {
	c, passed, err := m.choose()
	if err != nil {
		return c, err
	}
	m.mu.Lock()
	m.passed = passed
	m.mu.Unlock()
	return c, m.point(c)
}

// PassedOver says why the last Point passed over each faster tier (empty
// when it pointed at the hot copy): what a user asks when a wake read a
// slower tier than expected.
func (m *ModelCopies) PassedOver() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.passed, "; ")
}

// PointCold points the link at the model cache's file, whatever the tiers
// hold: the fallback of a wake that could not load a tier's copy.
func (m *ModelCopies) PointCold() (sidecarapi.ModelCopy, error) {
	want, err := ModelFilesOf(m.cfg.ModelDir, m.cfg.File)
	c, cerr := m.cold(want, err == nil)
	if cerr != nil {
		return c, cerr
	}
	return c, m.point(c)
}

func (m *ModelCopies) point(c sidecarapi.ModelCopy) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if target, err := os.Readlink(m.cfg.Link); err != nil || target != c.Path {
		tmp := fmt.Sprintf("%s.tmp-%d", m.cfg.Link, os.Getpid())
		_ = os.Remove(tmp)
		if err := os.Symlink(c.Path, tmp); err != nil {
			return fmt.Errorf("pointing the model link: %w", err)
		}
		if err := os.Rename(tmp, m.cfg.Link); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("pointing the model link: %w", err)
		}
	}
	m.current = &c
	return nil
}

// Current is the copy the link points at (nil before the first Point).
func (m *ModelCopies) Current() *sidecarapi.ModelCopy {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current == nil {
		return nil
	}
	c := *m.current
	return &c
}

// Gone reports whether the copy the link points at no longer exists (the
// node agent evicted or dropped it), so that a load would fail.
func (m *ModelCopies) Gone() bool {
	c := m.Current()
	if c == nil {
		return true
	}
	_, err := os.Stat(c.Path)
	return errors.Is(err, os.ErrNotExist)
}

// copyEngine is an engine that loads its model file through the link:
// each wake first points it at the hottest qualifying copy, and reports
// that copy as what the wake read.
type copyEngine struct {
	Engine
	copies *ModelCopies
	log    *slog.Logger

	mu   sync.Mutex
	last *sidecarapi.Transfer
}

// withModelCopies wraps engine when cfg points it at copies.
func withModelCopies(engine Engine, copies *ModelCopies, log *slog.Logger) Engine {
	if copies == nil {
		return engine
	}
	return &copyEngine{Engine: engine, copies: copies, log: log}
}

// Wake points the link, then wakes the engine. When the engine cannot
// load a tier's copy (it went away between the choice and the engine's
// open, or the engine answered that it could not load it), the wake is
// retried once from the model cache: a copy never keeps an engine from
// waking. An engine that did not answer (not started yet, restarting, a
// timeout) says nothing about the copy: that wake fails as it is, the link
// stays on the copy, and the caller's next attempt loads it.
func (e *copyEngine) Wake(ctx context.Context) error {
	if !e.readsCopy() {
		// vLLM after a level-1 sleep: its weights come back from its own
		// CPU RAM (the offload inside its process); no copy is read.
		if err := e.Engine.Wake(ctx); err != nil {
			return err
		}
		e.mu.Lock()
		e.last = &sidecarapi.Transfer{Tier: v1alpha1.TierHot}
		e.mu.Unlock()
		return nil
	}
	c, err := e.copies.Point()
	if err != nil {
		return err
	}
	if why := e.copies.PassedOver(); why != "" && e.log != nil {
		e.log.Info("the wake loads the "+string(c.Tier)+" copy of the model file", "path", c.Path, "passedOver", why)
	}
	err = e.Engine.Wake(ctx)
	var answered *EngineError
	if err != nil && c.Tier != v1alpha1.TierCold && ctx.Err() == nil && (errors.As(err, &answered) || e.copies.Gone()) {
		first, tier, path := err, c.Tier, c.Path
		if c, err = e.copies.PointCold(); err != nil {
			return errors.Join(first, err)
		}
		if err = e.Engine.Wake(ctx); err != nil {
			return fmt.Errorf("loading the %s copy %s: %w; then the model cache: %w", tier, path, first, err)
		}
		if e.log != nil {
			e.log.Warn("the engine could not load the "+string(tier)+" copy of its model file; it loaded the model cache", "copy", path, "err", first)
		}
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	// Every candidate was verified against the fetcher's manifest sha256:
	// a hot or warm copy by the node agent as it copied it (and by its
	// periodic re-hash since), the cache's file by the fetcher.
	e.last = &sidecarapi.Transfer{Tier: c.Tier, Bytes: c.Bytes, Verified: c.SHA256 != "" || c.Files > 0}
	e.mu.Unlock()
	return nil
}

// Sleep unloads the model; the copy it loaded stays where it is.
func (e *copyEngine) Sleep(ctx context.Context, level int) error {
	err := e.Engine.Sleep(ctx, level)
	e.mu.Lock()
	e.last = nil // a sleep moves no bytes of the model file
	e.mu.Unlock()
	return err
}

// LastTransfer implements TransferReporter.
func (e *copyEngine) LastTransfer() *sidecarapi.Transfer {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil {
		return nil
	}
	t := *e.last
	return &t
}

// ModelCopy implements ModelCopyReporter: awake, the copy the engine
// loaded; otherwise the copy its next wake will load, or, for vLLM asleep
// at level 1, its own RAM (tier hot, no path: the offload inside its
// process, of the loaded copy's size).
func (e *copyEngine) ModelCopy(awake bool) *sidecarapi.ModelCopy {
	if awake {
		return e.copies.Current()
	}
	if !e.readsCopy() {
		c := sidecarapi.ModelCopy{Tier: v1alpha1.TierHot}
		if cur := e.copies.Current(); cur != nil {
			c.Bytes = cur.Bytes
		}
		return &c
	}
	c, err := e.copies.Choose()
	if err != nil {
		return e.copies.Current()
	}
	return &c
}

// WeightsReloader is implemented by engines whose wake loads their
// weights from their model's files only after some sleeps: vLLM re-reads
// its --model directory (reload_weights) after a level-2 sleep, and
// restores its own CPU RAM copy after a level-1 sleep.
type WeightsReloader interface {
	// ReloadsWeights reports whether the next wake reads the model's
	// files.
	ReloadsWeights() bool
}

// readsCopy reports whether the engine's next wake reads the copy the
// link points at (always, for engines that load their model at each
// wake: Ollama, llama.cpp).
func (e *copyEngine) readsCopy() bool {
	r, ok := e.Engine.(WeightsReloader)
	return !ok || r.ReloadsWeights()
}

// ModelCopyReporter is implemented by engines the sidecar points at a
// copy of their model file.
type ModelCopyReporter interface {
	ModelCopy(awake bool) *sidecarapi.ModelCopy
}
