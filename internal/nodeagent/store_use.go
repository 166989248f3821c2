package nodeagent

// The store's reads of a copy by its user: marking it used (the LRU the
// budgets evict by) and restoring it into an arena (the simulator's
// weights).

import (
	"fmt"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// Touch marks every copy of k as used now (LRU).
func (s *Store) Touch(k nodeapi.Key) {
	s.mu.Lock()
	var touched []nodeapi.Entry
	for id, e := range s.entries {
		if id.Key == k {
			e.LastUsed = s.now()
			touched = append(touched, *e)
		}
	}
	s.mu.Unlock()
	for _, e := range touched {
		_ = s.writeMeta(e)
	}
}

// Restore reads k from the fastest tier holding it into a (which must be
// e.Bytes long), verifying the bytes. Warm reads bypass the page cache.
func (s *Store) Restore(k nodeapi.Key, a *arena.Arena) (nodeapi.Entry, arena.FillStats, error) {
	for _, t := range v1alpha1.NodeTiers() {
		e, ok := s.Lookup(k, t)
		if !ok {
			continue
		}
		if e.Files > 0 {
			return e, arena.FillStats{}, fmt.Errorf("restoring %s: the %s copy is a directory of a model's files, which engines load themselves", k, t)
		}
		want, err := arena.ParseDigest(e.Digest)
		if err != nil {
			return e, arena.FillStats{}, err
		}
		_, st, err := arena.FillFile(a, s.Path(k, t), arena.FileOptions{Direct: t == v1alpha1.TierWarm, Expect: &want})
		if err != nil {
			return e, st, err
		}
		s.mu.Lock()
		if p, ok := s.entries[entryID{k, t}]; ok {
			p.VerifiedAt, p.LastUsed = s.now(), s.now()
			e = *p
		}
		s.mu.Unlock()
		_ = s.writeMeta(e)
		return e, st, nil
	}
	return nodeapi.Entry{}, arena.FillStats{}, fmt.Errorf("restoring %s: %w", k, ErrNotFound)
}
