package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// StoreConfig places the agent's tiers on the node.
type StoreConfig struct {
	// HotDir is on a tmpfs (RAM), for example /dev/shm/model-orchestra.
	HotDir string `json:"hotDir"`
	// WarmDir is on node-local disk, for example /var/lib/model-orchestra/warm.
	WarmDir string `json:"warmDir"`
	// Budgets bound the bytes kept per tier.
	Budgets nodeapi.Budgets `json:"budgets"`
	// Namespace, when set, scopes the store to one namespace: it indexes,
	// counts against its budgets and evicts only the copies (and engine
	// offloads) under <dir>/<Namespace>, and refuses every other
	// namespace's keys (ErrOtherNamespace). The chart sets it to the
	// release's namespace, so that the agents of releases in different
	// namespaces share a node's tier directories without touching each
	// other's copies.
	Namespace string `json:"namespace,omitempty"`
	// Group, when positive, is the group of the namespace directories
	// (mode 0750), the copies and their metadata (0640): the engines and
	// sidecars that load the copies read them as members of the group
	// (store_perm.go). 0 keeps them private to the agent (0700, 0600).
	Group int `json:"group,omitempty"`
}

// ErrNotFound means no tier holds the artifact.
var ErrNotFound = errors.New("artifact not found in any tier")

// ErrOtherNamespace means a key is outside the store's namespace
// (StoreConfig.Namespace).
var ErrOtherNamespace = errors.New("not this agent's namespace")

// Store is the node agent's hot and warm tiers: one directory per namespace
// (mode 0750 and StoreConfig.Group, or 0700 without a group) holding one
// file per artifact and a metadata file beside it (0640 or 0600).
// Every copy into or out of the store is hashed and compared with the
// digest recorded when the artifact entered the node. Store is safe for
// concurrent use; admissions are serialised so budgets hold.
type Store struct {
	cfg StoreConfig
	log *slog.Logger
	now func() time.Time

	admit   sync.Mutex // one admission (plan + apply + write) at a time
	mu      sync.Mutex // guards entries and noWarm
	entries map[entryID]*nodeapi.Entry
	// files are the file lists of the directory copies (store_dir.go).
	files map[entryID][]nodeapi.CopyFile
	// noWarm are the keys of applications without a warm tier (SetNoWarm).
	noWarm map[nodeapi.Key]bool
	// Evictions counts demotions and drops per tier, for metrics.
	onEvict func(v1alpha1.Tier, nodeapi.ActionKind)
}

type entryID struct {
	nodeapi.Key
	Tier v1alpha1.Tier
}

// CheckKey checks that k is safe to use as a path and is in the store's
// namespace, if it has one.
func (s *Store) CheckKey(k nodeapi.Key) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if s.cfg.Namespace != "" && k.Namespace != s.cfg.Namespace {
		return fmt.Errorf("%s: %w: this agent keeps the copies of namespace %q only", k, ErrOtherNamespace, s.cfg.Namespace)
	}
	return nil
}

// namespaces are the namespace directories of tier t's root the store
// indexes: its own namespace's if it has one, otherwise every one.
func (s *Store) namespaces(t v1alpha1.Tier) ([]string, error) {
	if s.cfg.Namespace != "" {
		return []string{s.cfg.Namespace}, nil
	}
	root := s.dir(t)
	nss, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("reading the %s tier %s: %w", t, root, err)
	}
	var out []string
	for _, ns := range nss {
		if ns.IsDir() && nodeapi.ValidNamespace(ns.Name()) {
			out = append(out, ns.Name())
		}
	}
	return out, nil
}

// OpenStore creates the tier directories and indexes what they already
// hold. A file without valid metadata (an interrupted copy) is removed.
func OpenStore(cfg StoreConfig, log *slog.Logger) (*Store, error) {
	s := &Store{cfg: cfg, log: log, now: time.Now, entries: map[entryID]*nodeapi.Entry{}, files: map[entryID][]nodeapi.CopyFile{}, noWarm: map[nodeapi.Key]bool{}}
	for _, t := range v1alpha1.NodeTiers() {
		root := s.dir(t)
		if err := os.MkdirAll(root, 0o711); err != nil {
			return nil, fmt.Errorf("creating the %s tier %s: %w", t, root, err)
		}
		if cfg.Namespace != "" {
			// Before any pod of the namespace mounts it: the kubelet
			// would create it root's, 0755 (repaired here if it did).
			if _, err := s.namespaceDir(t, cfg.Namespace); err != nil {
				return nil, err
			}
		}
		if err := s.scan(t); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Store) dir(t v1alpha1.Tier) string {
	if t == v1alpha1.TierHot {
		return s.cfg.HotDir
	}
	return s.cfg.WarmDir
}

// Path is where the copy of k in tier t lives.
func (s *Store) Path(k nodeapi.Key, t v1alpha1.Tier) string {
	return filepath.Join(s.dir(t), k.Namespace, k.Name)
}

func (s *Store) metaPath(k nodeapi.Key, t v1alpha1.Tier) string {
	return filepath.Join(s.dir(t), k.Namespace, nodeapi.CopyMetaName(k.Name))
}

func (s *Store) scan(t v1alpha1.Tier) error {
	root := s.dir(t)
	nss, err := s.namespaces(t)
	if err != nil {
		return err
	}
	for _, ns := range nss {
		files, err := os.ReadDir(filepath.Join(root, ns))
		if errors.Is(err, os.ErrNotExist) {
			continue // the scoped namespace has no copy yet
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", filepath.Join(root, ns), err)
		}
		if err := s.share(filepath.Join(root, ns), s.dirMode(t)); err != nil {
			s.log.Warn("the namespace directory keeps its mode and group; engines running as non-root may not read its copies", "tier", t, "err", err)
		}
		for _, f := range files {
			name := f.Name()
			if strings.HasPrefix(name, ".") {
				if strings.Contains(name, ".tmp-") {
					_ = os.Remove(filepath.Join(root, ns, name))
				}
				continue
			}
			k := nodeapi.Key{Namespace: ns, Name: name}
			var m nodeapi.CopyMeta
			b, err := os.ReadFile(s.metaPath(k, t))
			if err == nil {
				err = json.Unmarshal(b, &m)
			}
			fi, serr := f.Info()
			size := int64(-1)
			if serr == nil && fi.Mode().IsRegular() && len(m.Files) == 0 {
				size = fi.Size()
			}
			if err == nil && serr == nil && fi.IsDir() && len(m.Files) > 0 {
				// A directory copy: every listed file with its size.
				if err = checkDir(s.Path(k, t), m.Files, m.Bytes); err == nil {
					size = m.Bytes
				}
			}
			if err == nil && serr == nil && size == m.Bytes {
				// A digest this agent cannot check (an earlier version's
				// format) makes the copy unverifiable: it goes, and the
				// next wake reads the model's cold copy.
				_, err = arena.ParseDigest(m.Digest)
			}
			if err != nil || serr != nil || size != m.Bytes {
				s.log.Warn("removing a copy without valid metadata", "tier", t, "key", k.String(), "err", errors.Join(err, serr))
				_ = os.RemoveAll(s.Path(k, t))
				_ = os.Remove(s.metaPath(k, t))
				continue
			}
			// A copy an earlier agent version wrote private (0600).
			for _, p := range []string{s.Path(k, t), s.metaPath(k, t)} {
				if err := s.share(p, s.fileMode()); err != nil {
					s.log.Warn("a copy keeps its mode and group; engines running as non-root may not read it", "tier", t, "key", k.String(), "err", err)
				}
			}
			s.entries[entryID{k, t}] = &nodeapi.Entry{Key: k, Tier: t, Bytes: m.Bytes, Digest: m.Digest, Priority: m.Priority, LastUsed: m.LastUsed, VerifiedAt: m.VerifiedAt, SHA256: m.SHA256, Files: len(m.Files)}
			if len(m.Files) > 0 {
				s.files[entryID{k, t}] = m.Files
			}
		}
	}
	return nil
}

// SetNoWarm records whether k's application has no warm tier (tiers.warm
// None; the node agent learns it from the leader's wake reports): its
// entries then carry NoWarm, so an evicted hot copy of k is dropped, never
// demoted (PlanAdmit), and no warm copy of it is written.
func (s *Store) SetNoWarm(k nodeapi.Key, noWarm bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if noWarm {
		s.noWarm[k] = true
		return
	}
	delete(s.noWarm, k)
}

// Entries lists every copy, hot first, then by key: the store's own
// copies and the engines' level-1 offloads in the hot directory (Offload),
// which count against the hot budget and which the store never evicts.
func (s *Store) Entries() []nodeapi.Entry {
	out := s.engineOffloads()
	s.mu.Lock()
	for _, e := range s.entries {
		c := *e
		c.NoWarm = s.noWarm[e.Key]
		out = append(out, c)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b nodeapi.Entry) int {
		if a.Tier != b.Tier {
			if a.Tier == v1alpha1.TierHot {
				return -1
			}
			return 1
		}
		if n := strings.Compare(a.String(), b.String()); n != 0 {
			return n
		}
		if a.Offload != b.Offload {
			if a.Offload {
				return 1
			}
			return -1
		}
		return 0
	})
	return out
}

// engineOffloads lists the engines' level-1 offloads (EngineOffloadName)
// in the hot directory. Engines write and release them without telling
// the agent, so they are read from the directory each time. Bytes are the
// blocks the tmpfs holds for the file (a wake punches them out as it
// reads), at most its size.
func (s *Store) engineOffloads() []nodeapi.Entry {
	root := s.dir(v1alpha1.TierHot)
	nss, err := s.namespaces(v1alpha1.TierHot)
	if err != nil {
		return nil
	}
	var out []nodeapi.Entry
	for _, ns := range nss {
		files, err := os.ReadDir(filepath.Join(root, ns))
		if err != nil {
			continue
		}
		for _, f := range files {
			name, ok := offloadOf(f.Name())
			if !ok || !f.Type().IsRegular() {
				continue
			}
			fi, err := f.Info()
			if err != nil {
				continue // released meanwhile
			}
			bytes := fi.Size()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				bytes = min(bytes, st.Blocks*512)
			}
			out = append(out, nodeapi.Entry{Key: nodeapi.Key{Namespace: ns, Name: name}, Tier: v1alpha1.TierHot, Bytes: bytes, LastUsed: fi.ModTime(), Pinned: true, Offload: true})
		}
	}
	return out
}

// offloadOf is the weights name of an engine's level-1 offload file name.
func offloadOf(file string) (string, bool) {
	name, ok := strings.CutSuffix(strings.TrimPrefix(file, "."), ".level1")
	if !ok || !strings.HasPrefix(file, ".") || (nodeapi.Key{Namespace: "ns", Name: name}).Validate() != nil {
		return "", false
	}
	return name, true
}

// Used is the bytes held in tier t, the engines' level-1 offloads included
// for the hot tier.
func (s *Store) Used(t v1alpha1.Tier) int64 { return usedBy(s.Entries())[t] }

// usedBy sums the bytes of entries per tier.
func usedBy(entries []nodeapi.Entry) map[v1alpha1.Tier]int64 {
	used := map[v1alpha1.Tier]int64{}
	for _, e := range entries {
		used[e.Tier] += e.Bytes
	}
	return used
}

// Lookup returns the copy of k in t.
func (s *Store) Lookup(k nodeapi.Key, t v1alpha1.Tier) (nodeapi.Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[entryID{k, t}]
	if !ok {
		return nodeapi.Entry{}, false
	}
	return *e, true
}

// PutRequest describes an artifact entering a tier.
type PutRequest struct {
	Key      nodeapi.Key
	Tier     v1alpha1.Tier
	Bytes    int64
	Priority int32
	// Digest, when set, must match the bytes written; otherwise the
	// digest of the bytes is recorded.
	Digest string
	// SHA256 is the manifest sha256 the source verified the bytes against
	// (a cold model file), recorded in the copy's metadata; the source
	// fails the copy when they do not match.
	SHA256 string
	// Files, for a directory copy, lay the bytes out: the listed files'
	// bytes concatenated in order (store_dir.go). Empty: one file.
	Files []nodeapi.CopyFile
}

// Put writes size bytes from src into a tier, making room by the budget
// rules of PlanAdmit first, and verifies them while writing.
func (s *Store) Put(req PutRequest, src io.Reader) (nodeapi.Entry, error) {
	return s.put(req, src, nil)
}

// put is Put, never evicting a copy of a key in keep.
func (s *Store) put(req PutRequest, src io.Reader, keep map[nodeapi.Key]bool) (nodeapi.Entry, error) {
	if err := s.CheckKey(req.Key); err != nil {
		return nodeapi.Entry{}, err
	}
	s.admit.Lock()
	defer s.admit.Unlock()
	in := nodeapi.Entry{Key: req.Key, Tier: req.Tier, Bytes: req.Bytes, Priority: req.Priority, LastUsed: s.now()}
	plan, err := PlanAdmit(s.entriesKeeping(keep), s.cfg.Budgets, in)
	if err != nil {
		return nodeapi.Entry{}, err
	}
	if err := s.apply(plan); err != nil {
		return nodeapi.Entry{}, err
	}
	return s.write(req, src)
}

func (s *Store) write(req PutRequest, src io.Reader) (nodeapi.Entry, error) {
	dir, err := s.namespaceDir(req.Tier, req.Key.Namespace)
	if err != nil {
		return nodeapi.Entry{}, err
	}
	path := s.Path(req.Key, req.Tier)
	if len(req.Files) > 0 {
		tmp, d, n, err := s.writeDir(dir, req, src)
		if err != nil {
			return nodeapi.Entry{}, err
		}
		if req.Digest != "" {
			want, err := arena.ParseDigest(req.Digest)
			if err == nil && d != want {
				err = &arena.MismatchError{Source: "the copy into " + string(req.Tier), Want: want, Got: d, Bytes: n}
			}
			if err != nil {
				_ = os.RemoveAll(tmp)
				return nodeapi.Entry{}, err
			}
		}
		return s.place(req, tmp, path, d, n)
	}
	f, err := os.CreateTemp(dir, "."+req.Key.Name+".tmp-*")
	if err != nil {
		return nodeapi.Entry{}, fmt.Errorf("creating a temporary file in %s: %w", dir, err)
	}
	tmp := f.Name()
	fail := func(err error) (nodeapi.Entry, error) {
		_ = f.Close()
		_ = os.Remove(tmp)
		return nodeapi.Entry{}, err
	}
	if err := s.shareFile(f); err != nil {
		return fail(err)
	}
	d, n, err := arena.CopyHash(f, io.LimitReader(src, req.Bytes+1))
	if err != nil {
		return fail(fmt.Errorf("copying %s into the %s tier: %w", req.Key, req.Tier, err))
	}
	if n != req.Bytes {
		return fail(fmt.Errorf("copying %s into the %s tier: got %d bytes, want %d", req.Key, req.Tier, n, req.Bytes))
	}
	if req.Digest != "" {
		want, err := arena.ParseDigest(req.Digest)
		if err != nil {
			return fail(err)
		}
		if d != want {
			return fail(&arena.MismatchError{Source: "the copy into " + string(req.Tier), Want: want, Got: d, Bytes: n})
		}
	}
	if req.Tier == v1alpha1.TierWarm {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("syncing %s: %w", tmp, err))
		}
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("closing %s: %w", tmp, err))
	}
	return s.place(req, tmp, path, d, n)
}

// place records the copy written and verified at tmp (a file, or a
// directory copy) and renames it into place at path, its metadata first.
func (s *Store) place(req PutRequest, tmp, path string, d arena.Digest, n int64) (nodeapi.Entry, error) {
	now := s.now()
	e := nodeapi.Entry{Key: req.Key, Tier: req.Tier, Bytes: n, Digest: d.String(), Priority: req.Priority, LastUsed: now, VerifiedAt: now, SHA256: req.SHA256, Files: len(req.Files)}
	id := entryID{req.Key, req.Tier}
	s.mu.Lock()
	if len(req.Files) > 0 {
		s.files[id] = req.Files
	} else {
		delete(s.files, id)
	}
	s.mu.Unlock()
	if err := s.writeMeta(e); err != nil {
		_ = os.RemoveAll(tmp)
		return nodeapi.Entry{}, err
	}
	if fi, err := os.Lstat(path); err == nil && (fi.IsDir() || len(req.Files) > 0) {
		// A rename replaces a file, not a directory: the copy it
		// replaces (another model under the same name) goes first.
		_ = os.RemoveAll(path)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.RemoveAll(tmp)
		return nodeapi.Entry{}, fmt.Errorf("renaming into %s: %w", path, err)
	}
	s.mu.Lock()
	s.entries[id] = &e
	s.mu.Unlock()
	s.log.Info("artifact stored", "key", req.Key.String(), "tier", req.Tier, "bytes", n, "digest", e.Digest)
	return e, nil
}

func (s *Store) writeMeta(e nodeapi.Entry) error {
	b, _ := json.Marshal(nodeapi.CopyMeta{Digest: e.Digest, Bytes: e.Bytes, Priority: e.Priority, LastUsed: e.LastUsed, VerifiedAt: e.VerifiedAt, SHA256: e.SHA256, Files: s.filesOf(e.Key, e.Tier)})
	return s.writeShared(s.metaPath(e.Key, e.Tier), b, e.Tier == v1alpha1.TierWarm)
}

// apply carries out a plan: demotions copy hot to warm (verified), then
// every evicted copy is deleted.
func (s *Store) apply(plan []nodeapi.Action) error {
	for _, a := range plan {
		e, ok := s.Lookup(a.Key, a.From)
		if !ok {
			continue
		}
		if a.Kind == nodeapi.ActionDemote {
			if _, err := s.copyTier(e, v1alpha1.TierWarm); err != nil {
				s.log.Warn("demotion failed; dropping the hot copy", "key", a.Key.String(), "err", err)
			}
		}
		if err := s.Remove(a.Key, a.From); err != nil {
			return err
		}
		if s.onEvict != nil {
			s.onEvict(a.From, a.Kind)
		}
		s.log.Info("evicted", "key", a.Key.String(), "tier", a.From, "action", a.Kind, "bytes", a.Bytes)
	}
	return nil
}

// copyTier copies e into tier to, verifying against e's digest.
func (s *Store) copyTier(e nodeapi.Entry, to v1alpha1.Tier) (nodeapi.Entry, error) {
	f, err := s.openCopy(e, false)
	if err != nil {
		return nodeapi.Entry{}, err
	}
	defer func() { _ = f.Close() }()
	return s.write(PutRequest{Key: e.Key, Tier: to, Bytes: e.Bytes, Priority: e.Priority, Digest: e.Digest, SHA256: e.SHA256, Files: s.filesOf(e.Key, e.Tier)}, f)
}

// Remove deletes the copy of k in t.
func (s *Store) Remove(k nodeapi.Key, t v1alpha1.Tier) error {
	s.mu.Lock()
	delete(s.entries, entryID{k, t})
	delete(s.files, entryID{k, t})
	s.mu.Unlock()
	for _, p := range []string{s.Path(k, t), s.metaPath(k, t)} {
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", p, err)
		}
	}
	return nil
}

// Promote copies k into tier to from the next slower tier that holds it:
// warm for hot; for warm (or for hot when warm has no copy) the cold copy,
// if given (nil: none). The copy is verified against the digest recorded
// for the source (or want, for a cold source).
func (s *Store) Promote(ctx context.Context, k nodeapi.Key, to v1alpha1.Tier, cold ColdSource, want string, priority int32) (nodeapi.Entry, error) {
	return s.promote(ctx, k, to, cold, want, priority, nil)
}

// entriesKeeping is Entries with the copies of the keys in keep pinned, so
// that an admission planned from it never evicts them.
func (s *Store) entriesKeeping(keep map[nodeapi.Key]bool) []nodeapi.Entry {
	entries := s.Entries()
	for i := range entries {
		if keep[entries[i].Key] {
			entries[i].Pinned = true
		}
	}
	return entries
}

// promote is Promote, never evicting a copy of a key in keep.
func (s *Store) promote(ctx context.Context, k nodeapi.Key, to v1alpha1.Tier, cold ColdSource, want string, priority int32, keep map[nodeapi.Key]bool) (nodeapi.Entry, error) {
	if err := s.CheckKey(k); err != nil {
		return nodeapi.Entry{}, err
	}
	if e, ok := s.Lookup(k, to); ok {
		s.Touch(k)
		return e, nil
	}
	if to == v1alpha1.TierHot {
		if e, ok := s.Lookup(k, v1alpha1.TierWarm); ok {
			s.admit.Lock()
			defer s.admit.Unlock()
			plan, err := PlanAdmit(s.entriesKeeping(keep), s.cfg.Budgets, nodeapi.Entry{Key: k, Tier: to, Bytes: e.Bytes, Priority: max(priority, e.Priority), LastUsed: s.now()})
			if err != nil {
				return nodeapi.Entry{}, err
			}
			if err := s.apply(plan); err != nil {
				return nodeapi.Entry{}, err
			}
			e.Priority = max(priority, e.Priority)
			return s.copyTier(e, to)
		}
	}
	if cold == nil {
		return nodeapi.Entry{}, fmt.Errorf("promoting %s to %s: %w (and no cold copy was given)", k, to, ErrNotFound)
	}
	f, n, err := cold.Open(ctx)
	if err != nil {
		return nodeapi.Entry{}, err
	}
	defer func() { _ = f.Close() }() // read-only
	req := PutRequest{Key: k, Tier: to, Bytes: n, Priority: priority, Digest: want, SHA256: manifestSHA256(cold)}
	if d, ok := cold.(DirSource); ok {
		req.Files = d.CopyFiles()
	}
	return s.put(req, f, keep)
}
