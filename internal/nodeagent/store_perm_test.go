package nodeagent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// modeAndGroup is a file's permission bits and group.
func modeAndGroup(t *testing.T, path string) (os.FileMode, int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode() & (os.ModePerm | os.ModeSetgid | os.ModeSticky), int(fi.Sys().(*syscall.Stat_t).Gid)
}

func wantModeAndGroup(t *testing.T, path string, mode os.FileMode, gid int) {
	t.Helper()
	if m, g := modeAndGroup(t, path); m != mode || g != gid {
		t.Errorf("%s: mode %v group %d, want %v group %d", path, m, g, mode, gid)
	}
}

// With a copy group, what the agent writes is readable by the group and
// no one else: the namespace directories 0750 (warm) and 3770 (hot: setgid
// and sticky, for the engines' level-1 offloads), copies and metadata 0640,
// in both tiers, through a put, a promotion, a touch and a demotion; and
// what an earlier agent version or the kubelet left (private copies, a
// root directory of mode 0755) is repaired when the store opens.
func TestStoreSharesCopiesWithItsGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's group to one the test is not a member of needs root")
	}
	const gid = 4242 // numeric: no such group needs to exist
	hot, warm := filepath.Join(t.TempDir(), "hot"), filepath.Join(t.TempDir(), "warm")

	// An earlier agent's private copy, in a namespace directory the kubelet
	// then made 0755 (root's).
	old, err := OpenStore(StoreConfig{HotDir: hot, WarmDir: warm, Budgets: nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b := blob(4096, 1)
	k := nodeapi.Key{Namespace: "team-a", Name: "old"}
	if _, err := old.Put(PutRequest{Key: k, Tier: v1alpha1.TierWarm, Bytes: int64(len(b))}, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	nsWarm := filepath.Join(warm, "team-a")
	wantModeAndGroup(t, nsWarm, 0o700, 0)
	wantModeAndGroup(t, old.Path(k, v1alpha1.TierWarm), 0o600, 0)
	wantModeAndGroup(t, old.metaPath(k, v1alpha1.TierWarm), 0o600, 0)
	if err := os.Chmod(nsWarm, 0o755); err != nil {
		t.Fatal(err)
	}

	s, err := OpenStore(StoreConfig{HotDir: hot, WarmDir: warm, Namespace: "team-a", Group: gid, Budgets: nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	nsHot := filepath.Join(hot, "team-a")
	wantModeAndGroup(t, nsHot, os.ModeSetgid|os.ModeSticky|0o770, gid)
	wantModeAndGroup(t, nsWarm, 0o750, gid)
	for _, p := range []string{s.Path(k, v1alpha1.TierWarm), s.metaPath(k, v1alpha1.TierWarm)} {
		wantModeAndGroup(t, p, 0o640, gid)
	}

	// New copies: put, promoted, touched (the metadata is rewritten),
	// demoted.
	n := nodeapi.Key{Namespace: "team-a", Name: "new"}
	if _, err := s.Put(PutRequest{Key: n, Tier: v1alpha1.TierHot, Bytes: int64(len(b))}, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Promote(t.Context(), k, v1alpha1.TierHot, nil, "", 0); err != nil {
		t.Fatal(err)
	}
	s.Touch(n)
	if _, _, err := s.Demote(n, "", 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		k nodeapi.Key
		t v1alpha1.Tier
	}{{k, v1alpha1.TierHot}, {k, v1alpha1.TierWarm}, {n, v1alpha1.TierWarm}} {
		for _, p := range []string{s.Path(c.k, c.t), s.metaPath(c.k, c.t)} {
			wantModeAndGroup(t, p, 0o640, gid)
		}
	}
	s.Touch(k)
	wantModeAndGroup(t, s.metaPath(k, v1alpha1.TierHot), 0o640, gid)
	// Nothing else is left beside them (no temporary file).
	for _, dir := range []string{nsHot, nsWarm} {
		files, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if m, g := modeAndGroup(t, filepath.Join(dir, f.Name())); f.Name() != wakesFile && (m != 0o640 || g != gid) {
				t.Errorf("%s/%s: mode %v group %d", dir, f.Name(), m, g)
			}
		}
	}
}

// Without a group the copies stay private to the agent, as before.
func TestStoreWithoutGroupKeepsCopiesPrivate(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20})
	e := put(t, s, "w", v1alpha1.TierHot, blob(1024, 2), 0)
	wantModeAndGroup(t, filepath.Join(cfg.HotDir, "team-a"), 0o700, os.Getegid())
	wantModeAndGroup(t, s.Path(e.Key, v1alpha1.TierHot), 0o600, os.Getegid())
	wantModeAndGroup(t, s.metaPath(e.Key, v1alpha1.TierHot), 0o600, os.Getegid())
}
