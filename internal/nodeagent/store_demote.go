package nodeagent

// The store's demotions (an engine's level-1 offload or the agent's hot
// copy, down to the warm tier, verified) and its periodic verification of
// every copy it keeps.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// ErrDigestRequired refuses to demote an engine's offload without the
// digest the engine recorded when it loaded the weights: the warm copy
// could not be verified.
var ErrDigestRequired = errors.New("the digest recorded by the engine is required to verify the warm copy")

// ErrDigestConflict refuses a demotion whose digest is not the one recorded
// for the store's hot copy.
var ErrDigestConflict = errors.New("digest conflict")

// Demote places a verified warm copy of k from the hot tier: from the
// store's own hot copy, or else from the engine's level-1 offload
// (EngineOffloadName) in the namespace's hot directory. The bytes are
// hashed while they are copied and compared with the recorded digest (the
// store's for its own copy; want, required, for the engine's offload; want
// must also match the store's digest when both are known), the warm file is
// fsynced before it is renamed into place, and room is made within the warm
// budget by PlanAdmit's rules. The store's hot copy is removed only after
// the warm copy verified; the engine's offload is left to the engine. A
// warm copy that already holds the digest is kept and reported as
// DemoteWarmHeld; one with another digest is replaced.
func (s *Store) Demote(k nodeapi.Key, want string, priority int32) (nodeapi.Entry, nodeapi.DemoteSource, error) {
	if err := s.CheckKey(k); err != nil {
		return nodeapi.Entry{}, "", err
	}
	if want != "" {
		if _, err := arena.ParseDigest(want); err != nil {
			return nodeapi.Entry{}, "", fmt.Errorf("demoting %s: %w", k, err)
		}
	}
	s.admit.Lock()
	defer s.admit.Unlock()
	hot, haveHot := s.Lookup(k, v1alpha1.TierHot)
	if haveHot && want != "" && hot.Digest != want {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s: %w: the hot copy's recorded digest is %s, the engine's %s; refusing to copy weights that are not the engine's", k, ErrDigestConflict, hot.Digest, want)
	}
	if want == "" && haveHot {
		want = hot.Digest
	}
	if w, ok := s.Lookup(k, v1alpha1.TierWarm); ok {
		if want == "" || w.Digest == want {
			if haveHot {
				if err := s.Remove(k, v1alpha1.TierHot); err != nil {
					return nodeapi.Entry{}, "", err
				}
			}
			s.Touch(k)
			w, _ = s.Lookup(k, v1alpha1.TierWarm)
			return w, nodeapi.DemoteWarmHeld, nil
		}
		s.log.Info("replacing a warm copy with another digest", "key", k.String(), "digest", w.Digest, "want", want)
	}
	src, source := s.Path(k, v1alpha1.TierHot), nodeapi.DemoteFromStore
	if !haveHot {
		src, source = filepath.Join(s.dir(v1alpha1.TierHot), k.Namespace, nodeapi.EngineOffloadName(k.Name)), nodeapi.DemoteFromEngine
		if want == "" {
			return nodeapi.Entry{}, "", fmt.Errorf("demoting %s from the engine's offload: %w", k, ErrDigestRequired)
		}
	}
	if haveHot && hot.Files > 0 {
		return s.demoteDir(hot, priority)
	}
	f, err := os.Open(src)
	if errors.Is(err, os.ErrNotExist) {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s: %w: neither the store's hot copy nor the engine's offload %s exists", k, ErrNotFound, src)
	}
	if err != nil {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s: %w", k, err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s: %w", k, err)
	}
	if haveHot {
		priority = max(priority, hot.Priority)
	}
	in := nodeapi.Entry{Key: k, Tier: v1alpha1.TierWarm, Bytes: fi.Size(), Priority: priority, LastUsed: s.now()}
	plan, err := PlanAdmit(s.Entries(), s.cfg.Budgets, in)
	if err != nil {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s (%d bytes) to the warm tier: %w", k, fi.Size(), err)
	}
	if err := s.apply(plan); err != nil {
		return nodeapi.Entry{}, "", err
	}
	req := PutRequest{Key: k, Tier: v1alpha1.TierWarm, Bytes: fi.Size(), Priority: priority, Digest: want}
	if haveHot {
		req.SHA256 = hot.SHA256 // the model file the hot copy is, if it is one
	}
	e, err := s.write(req, f)
	if err != nil {
		return nodeapi.Entry{}, "", fmt.Errorf("demoting %s from %s: %w", k, src, err)
	}
	if haveHot {
		if err := s.Remove(k, v1alpha1.TierHot); err != nil {
			return e, source, err
		}
	}
	s.log.Info("demoted to the warm tier", "key", k.String(), "from", source, "bytes", e.Bytes, "digest", e.Digest)
	return e, source, nil
}

// Verify re-hashes every copy the store keeps (not the engines' offloads,
// which their engines verify on wake) and compares it with its recorded
// digest. A copy that verifies gets a new VerifiedAt; one that does not, or
// cannot be read, is removed, so that no wake reads it, and is returned
// with Dropped set. Warm copies are read past the page cache (a cached
// page would hide a bad block). Admissions wait for the copy being hashed.
func (s *Store) Verify() []nodeapi.Verification {
	var out []nodeapi.Verification
	for _, e := range s.Entries() {
		if e.Offload {
			continue
		}
		out = append(out, s.verifyOne(e))
	}
	return out
}

func (s *Store) verifyOne(e nodeapi.Entry) nodeapi.Verification {
	s.admit.Lock()
	defer s.admit.Unlock()
	v := nodeapi.Verification{Key: e.Key, Tier: e.Tier, Digest: e.Digest, Time: s.now()}
	cur, ok := s.Lookup(e.Key, e.Tier)
	if !ok || cur.Digest != e.Digest {
		v.Digest, v.Error = cur.Digest, "replaced or removed while verifying"
		return v
	}
	got, err := s.hashCopy(e)
	want, perr := arena.ParseDigest(e.Digest)
	switch {
	case err != nil:
		v.Error = err.Error()
	case perr != nil:
		v.Error = perr.Error()
	case got != want:
		v.Got = got.String()
		v.Error = (&arena.MismatchError{Source: "the " + string(e.Tier) + " copy", Want: want, Got: got, Bytes: e.Bytes}).Error()
	default:
		s.mu.Lock()
		if p, ok := s.entries[entryID{e.Key, e.Tier}]; ok {
			p.VerifiedAt = v.Time
			e = *p
		}
		s.mu.Unlock()
		_ = s.writeMeta(e)
		return v
	}
	v.Dropped = true
	if err := s.Remove(e.Key, e.Tier); err != nil {
		v.Error += "; removing it: " + err.Error()
	}
	s.log.Error("a kept copy no longer verifies: dropped", "key", e.String(), "tier", e.Tier, "digest", e.Digest, "err", v.Error)
	return v
}

// hashFile hashes path, past the page cache when direct: with O_DIRECT
// where the filesystem allows it, else after dropping the file's cached
// pages.
func hashFile(path string, size int64, direct bool) (arena.Digest, error) {
	if direct {
		_ = DropCache(path)
	}
	d, n, err := arena.HashFile(path, direct)
	if err != nil {
		return 0, fmt.Errorf("verifying %s: %w", path, err)
	}
	if n != size {
		return 0, fmt.Errorf("verifying %s: %d bytes, want %d", path, n, size)
	}
	return d, nil
}
