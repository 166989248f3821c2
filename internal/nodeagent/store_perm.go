package nodeagent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Who may read the copies. The node agent owns every namespace directory
// of its tiers and every file in them. With StoreConfig.Group set, a
// namespace directory of the warm tier is mode 0750, one of the hot tier
// 3770 (below), and a copy and its metadata 0640, all of that group: the engines and sidecars that load the copies (model
// copies of Ollama and llama.cpp) run as their images' own non-root user
// with the group as a supplementary group, and read them without owning
// them or any capability. Without a group both are private to the agent
// (0700 and 0600). What keeps one namespace's pods from another's copies
// is that a pod mounts only its own namespace's directory of each tier;
// the mode only decides which users inside those pods may read it.
//
// The agent changes the group of what it owns to a group it is a member
// of, which needs no CAP_CHOWN: the chart runs it with the group as a
// supplementary group. It repairs at start and before each write what an
// earlier agent version wrote (0700 and 0600, without the group) and a
// namespace directory the kubelet created first for a pod's hostPath
// volume (root's, 0755).
//
// The hot tier's namespace directory is also where a sleeping engine
// writes its level-1 offload (EngineOffloadName: the simulator, as the
// non-root user of its image with the group): with the group it is
// group-writable, setgid (what the engine creates there has the group, so
// the agent reads it back to demote it) and sticky (a member of the group
// removes or replaces only what it owns, never the agent's copies). Only
// the sleeping simulator's engine container mounts it writable; every
// other container mounts it read-only.

func (s *Store) dirMode(t v1alpha1.Tier) os.FileMode {
	switch {
	case s.cfg.Group > 0 && t == v1alpha1.TierHot:
		return os.ModeSetgid | os.ModeSticky | 0o770
	case s.cfg.Group > 0:
		return 0o750
	}
	return 0o700
}

func (s *Store) fileMode() os.FileMode {
	if s.cfg.Group > 0 {
		return 0o640
	}
	return 0o600
}

// share gives path (a namespace directory or a file in one) mode and the
// store's group, if it has one: the group first, as a change of group may
// clear the setgid bit.
func (s *Store) share(path string, mode os.FileMode) error {
	if s.cfg.Group > 0 {
		if err := os.Lchown(path, -1, s.cfg.Group); err != nil {
			return fmt.Errorf("setting the group of %s to %d (the agent must own it and run with the group): %w", path, s.cfg.Group, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("setting the mode of %s to %v: %w", path, mode, err)
	}
	return nil
}

// namespaceDir creates the namespace's directory of tier t, or repairs its
// mode and group.
func (s *Store) namespaceDir(t v1alpha1.Tier, ns string) (string, error) {
	dir := filepath.Join(s.dir(t), ns)
	if err := os.MkdirAll(dir, s.dirMode(t).Perm()); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	return dir, s.share(dir, s.dirMode(t))
}

// shareFile gives an open file the store's file mode and group, before it
// is renamed into place.
func (s *Store) shareFile(f *os.File) error {
	if err := f.Chmod(s.fileMode()); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", f.Name(), err)
	}
	if s.cfg.Group > 0 {
		if err := f.Chown(-1, s.cfg.Group); err != nil {
			return fmt.Errorf("setting the group of %s to %d (the agent must run with the group): %w", f.Name(), s.cfg.Group, err)
		}
	}
	return nil
}

// writeShared writes b to path atomically (a temporary file renamed into
// place) with the store's file mode and group from the start, so that a
// reader never finds it private; with sync it fsyncs the file first.
func (s *Store) writeShared(path string, b []byte, sync bool) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating a temporary file beside %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := s.shareFile(f); err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", f.Name(), err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("renaming into %s: %w", path, err)
	}
	if sync {
		if d, err := os.Open(filepath.Dir(path)); err == nil {
			_ = d.Sync()
			_ = d.Close()
		}
	}
	return nil
}
