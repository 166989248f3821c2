package nodeagent

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

func testStore(t *testing.T, b nodeapi.Budgets) (*Store, StoreConfig) {
	t.Helper()
	cfg := StoreConfig{HotDir: filepath.Join(t.TempDir(), "hot"), WarmDir: filepath.Join(t.TempDir(), "warm"), Budgets: b}
	s, err := OpenStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	clock := t0
	s.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	return s, cfg
}

func blob(n int, seed uint64) []byte {
	b := make([]byte, n)
	arena.Synthesize(b, seed)
	return b
}

func put(t *testing.T, s *Store, name string, tier v1alpha1.Tier, b []byte, prio int32) nodeapi.Entry {
	t.Helper()
	e, err := s.Put(PutRequest{Key: nodeapi.Key{Namespace: "team-a", Name: name}, Tier: tier, Bytes: int64(len(b)), Priority: prio}, bytes.NewReader(b))
	if err != nil {
		t.Fatalf("put %s: %v", name, err)
	}
	return e
}

type placed struct {
	Name string
	Tier v1alpha1.Tier
}

func placement(s *Store) []placed {
	var out []placed
	for _, e := range s.Entries() {
		out = append(out, placed{e.Name, e.Tier})
	}
	return out
}

func TestStoreBudgetsEvictionAndDemotion(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 3 << 10, Warm: 4 << 10})
	a, b, c := blob(1<<10, 1), blob(1<<10, 2), blob(2<<10, 3)
	put(t, s, "a", v1alpha1.TierHot, a, 0)
	put(t, s, "b", v1alpha1.TierHot, b, 5)
	s.Touch(nodeapi.Key{Namespace: "team-a", Name: "a"}) // a is now more recent, but b has the higher priority
	put(t, s, "c", v1alpha1.TierHot, c, 5)
	// c needs 1 KiB more: a (priority 0) goes first, demoted to warm.
	if diff := cmp.Diff([]placed{{"b", v1alpha1.TierHot}, {"c", v1alpha1.TierHot}, {"a", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Fatalf("placement (-want +got):\n%s", diff)
	}
	if s.Used(v1alpha1.TierHot) > cfg.Budgets.Hot {
		t.Fatalf("hot tier holds %d bytes over its %d budget", s.Used(v1alpha1.TierHot), cfg.Budgets.Hot)
	}
	got, err := os.ReadFile(s.Path(nodeapi.Key{Namespace: "team-a", Name: "a"}, v1alpha1.TierWarm))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("the demoted copy is not the bytes: %v", err)
	}
	if _, err := os.Stat(s.Path(nodeapi.Key{Namespace: "team-a", Name: "a"}, v1alpha1.TierHot)); !os.IsNotExist(err) {
		t.Fatalf("the hot copy of a survived its eviction: %v", err)
	}
	fi, err := os.Stat(filepath.Join(cfg.HotDir, "team-a"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("namespace dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	// A low priority artifact never evicts higher ones.
	if _, err := s.Put(PutRequest{Key: nodeapi.Key{Namespace: "team-a", Name: "d"}, Tier: v1alpha1.TierHot, Bytes: 2 << 10, Priority: 1}, bytes.NewReader(blob(2<<10, 4))); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("low-priority put: %v, want ErrNoRoom", err)
	}
}

// TestStoreEvictsWithoutAWarmTier: a hot copy of an application without a
// warm tier (SetNoWarm) that must make room is dropped, though the warm
// tier has room: no warm copy is written for it. Told it has one again,
// its next eviction demotes it.
func TestStoreEvictsWithoutAWarmTier(t *testing.T) {
	s, _ := testStore(t, nodeapi.Budgets{Hot: 1 << 10, Warm: 4 << 10})
	a := nodeapi.Key{Namespace: "team-a", Name: "a"}
	s.SetNoWarm(a, true)
	put(t, s, "a", v1alpha1.TierHot, blob(1<<10, 1), 0)
	put(t, s, "b", v1alpha1.TierHot, blob(1<<10, 2), 0)
	if diff := cmp.Diff([]placed{{"b", v1alpha1.TierHot}}, placement(s)); diff != "" {
		t.Errorf("placement without a warm tier for a (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(s.Path(a, v1alpha1.TierWarm)); !os.IsNotExist(err) {
		t.Errorf("a warm copy of a was written (stat: %v)", err)
	}
	s.SetNoWarm(a, false)
	put(t, s, "a", v1alpha1.TierHot, blob(1<<10, 1), 0)
	if diff := cmp.Diff([]placed{{"a", v1alpha1.TierHot}, {"b", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Errorf("placement with warm tiers (-want +got):\n%s", diff)
	}
	put(t, s, "c", v1alpha1.TierHot, blob(1<<10, 3), 0)
	if diff := cmp.Diff([]placed{{"c", v1alpha1.TierHot}, {"a", v1alpha1.TierWarm}, {"b", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Errorf("placement once a has a warm tier again (-want +got):\n%s", diff)
	}
}

func TestStoreRestoreVerifiesAndReopens(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20})
	w := blob(100<<10+3, 7)
	e := put(t, s, "w", v1alpha1.TierWarm, w, 0)
	if e.Digest != arena.Sum(w).String() {
		t.Fatalf("digest %s, want %s", e.Digest, arena.Sum(w))
	}
	hot, err := s.Promote(t.Context(), nodeapi.Key{Namespace: "team-a", Name: "w"}, v1alpha1.TierHot, nil, "", 0)
	if err != nil || hot.Tier != v1alpha1.TierHot {
		t.Fatalf("promote warm→hot: %+v %v", hot, err)
	}
	a, _ := arena.New(int64(len(w)), arena.Options{})
	defer a.Free()
	got, _, err := s.Restore(nodeapi.Key{Namespace: "team-a", Name: "w"}, a)
	if err != nil || got.Tier != v1alpha1.TierHot || !bytes.Equal(a.Bytes(), w) {
		t.Fatalf("restore: %+v %v", got, err)
	}

	// Corrupt the hot copy: the restore must fail, naming the mismatch.
	p := s.Path(nodeapi.Key{Namespace: "team-a", Name: "w"}, v1alpha1.TierHot)
	bad := append([]byte(nil), w...)
	bad[5] ^= 0xff
	if err := os.WriteFile(p, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Restore(nodeapi.Key{Namespace: "team-a", Name: "w"}, a); !errors.Is(err, arena.ErrMismatch) {
		t.Fatalf("restore of a corrupt copy: %v, want ErrMismatch", err)
	}

	// A leftover temporary file and a file without metadata are cleaned
	// on reopen; the valid copies are indexed again.
	_ = os.WriteFile(filepath.Join(cfg.WarmDir, "team-a", ".x.tmp-1"), []byte("partial"), 0o600)
	_ = os.WriteFile(filepath.Join(cfg.WarmDir, "team-a", "orphan"), []byte("?"), 0o600)
	// A copy an earlier agent wrote with a digest format this one cannot
	// check (xxh64) cannot be verified: it goes too.
	old := put(t, s, "old", v1alpha1.TierWarm, blob(4<<10, 9), 0)
	mp := s.metaPath(old.Key, v1alpha1.TierWarm)
	m, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mp, bytes.Replace(m, []byte(old.Digest), []byte("xxh64:0123456789abcdef"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := OpenStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]placed{{"w", v1alpha1.TierHot}, {"w", v1alpha1.TierWarm}}, placement(s2)); diff != "" {
		t.Fatalf("reopened placement (-want +got):\n%s", diff)
	}
	for _, f := range []string{".x.tmp-1", "orphan", "old", ".old.meta.json"} {
		if _, err := os.Stat(filepath.Join(cfg.WarmDir, "team-a", f)); !os.IsNotExist(err) {
			t.Errorf("%s survived the reopen", f)
		}
	}
}

func TestStorePromoteFromColdChecksTheDigest(t *testing.T) {
	s, _ := testStore(t, nodeapi.Budgets{Hot: 1 << 20, Warm: 1 << 20})
	w := blob(64<<10, 9)
	cold := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(cold, w, 0o600); err != nil {
		t.Fatal(err)
	}
	k := nodeapi.Key{Namespace: "team-a", Name: "m"}
	if _, err := s.Promote(t.Context(), k, v1alpha1.TierWarm, ColdFile(cold), arena.Sum([]byte("other")).String(), 0); !errors.Is(err, arena.ErrMismatch) {
		t.Fatalf("promote with a wrong digest: %v, want ErrMismatch", err)
	}
	if _, ok := s.Lookup(k, v1alpha1.TierWarm); ok {
		t.Fatal("a mismatching copy was admitted")
	}
	if _, err := s.Promote(t.Context(), k, v1alpha1.TierWarm, ColdFile(cold), arena.Sum(w).String(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Promote(t.Context(), k, v1alpha1.TierHot, nil, "", 0); err != nil {
		t.Fatalf("warm→hot: %v", err)
	}
	if diff := cmp.Diff([]placed{{"m", v1alpha1.TierHot}, {"m", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Fatalf("placement (-want +got):\n%s", diff)
	}
	if _, err := s.Promote(t.Context(), nodeapi.Key{Namespace: "team-a", Name: "absent"}, v1alpha1.TierHot, nil, "", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("promote of an unknown artifact: %v", err)
	}
}

// offload writes b as an engine's level-1 offload of name in team-a's hot
// directory, as the simulator does.
func offload(t *testing.T, cfg StoreConfig, name string, b []byte) string {
	t.Helper()
	dir := filepath.Join(cfg.HotDir, "team-a")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, nodeapi.EngineOffloadName(name))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestStoreDemotesAnEngineOffloadVerified(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 4 << 10, Warm: 3 << 10})
	w := blob(2<<10, 7)
	src := offload(t, cfg, "m", w)
	digest := arena.Sum(w).String()

	e, from, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, digest, 0)
	if err != nil {
		t.Fatal(err)
	}
	if from != nodeapi.DemoteFromEngine || e.Tier != v1alpha1.TierWarm || e.Digest != digest || e.Bytes != int64(len(w)) || e.VerifiedAt.IsZero() {
		t.Fatalf("demotion %+v from %s, want a verified warm copy of the engine's offload", e, from)
	}
	got, err := os.ReadFile(filepath.Join(cfg.WarmDir, "team-a", "m"))
	if err != nil || !bytes.Equal(got, w) {
		t.Fatalf("warm copy: %v (equal %v)", err, bytes.Equal(got, w))
	}
	if _, err := os.Stat(src); err != nil {
		t.Errorf("the engine's offload is the engine's to release, but it is gone: %v", err)
	}
	// A second demotion finds the digest in the warm tier already.
	if _, from, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, digest, 0); err != nil || from != nodeapi.DemoteWarmHeld {
		t.Errorf("demoting again: %s, %v; want the warm copy kept", from, err)
	}
	// The index survives a restart: the warm copy has its metadata.
	s2, err := OpenStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if e2, ok := s2.Lookup(nodeapi.Key{Namespace: "team-a", Name: "m"}, v1alpha1.TierWarm); !ok || e2.Digest != digest {
		t.Errorf("after a restart the warm copy is %+v (%v)", e2, ok)
	}
}

func TestStoreDemotionOfItsHotCopyReleasesIt(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 4 << 10, Warm: 4 << 10})
	w := blob(1<<10, 8)
	put(t, s, "m", v1alpha1.TierHot, w, 2)
	if _, _, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, arena.Sum(blob(1<<10, 9)).String(), 0); !errors.Is(err, ErrDigestConflict) {
		t.Errorf("demoting the hot copy with another digest than its recorded one: %v, want ErrDigestConflict", err)
	}
	if _, ok := s.Lookup(nodeapi.Key{Namespace: "team-a", Name: "m"}, v1alpha1.TierHot); !ok {
		t.Fatal("a refused demotion removed the hot copy")
	}
	e, from, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, "", 0)
	if err != nil || from != nodeapi.DemoteFromStore || e.Priority != 2 {
		t.Fatalf("demotion %+v from %s: %v; want the store's hot copy, its priority kept", e, from, err)
	}
	if diff := cmp.Diff([]placed{{"m", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Errorf("placement (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(cfg.HotDir, "team-a", "m")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the hot copy is still on disk after the demotion: %v", err)
	}
}

func TestStoreDemotionRefusesBadDigestsAndRespectsTheBudget(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 4 << 10, Warm: 3 << 10})
	old := blob(2<<10, 1)
	put(t, s, "old", v1alpha1.TierWarm, old, 0)
	w := blob(2<<10, 9)
	offload(t, cfg, "m", w)

	if _, _, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, "", 0); !errors.Is(err, ErrDigestRequired) {
		t.Errorf("demoting an offload without the engine's digest: %v, want ErrDigestRequired", err)
	}
	wrong := arena.Sum(blob(2<<10, 10)).String()
	if _, _, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, wrong, 0); !errors.Is(err, arena.ErrMismatch) {
		t.Fatalf("demoting bytes that do not hash to the digest: %v, want a mismatch", err)
	}
	if _, ok := s.Lookup(nodeapi.Key{Namespace: "team-a", Name: "m"}, v1alpha1.TierWarm); ok {
		t.Fatal("a copy that failed verification entered the warm tier")
	}
	if _, err := os.Stat(filepath.Join(cfg.WarmDir, "team-a", "m")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a copy that failed verification is on disk: %v", err)
	}
	// A higher-priority copy is never evicted for it.
	put(t, s, "old", v1alpha1.TierWarm, old, 5)
	if _, _, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, arena.Sum(w).String(), 0); !errors.Is(err, ErrNoRoom) {
		t.Errorf("demoting past the warm budget: %v, want ErrNoRoom", err)
	}
	// With the same priority the least recently used copy makes room.
	put(t, s, "old", v1alpha1.TierWarm, old, 0)
	if _, _, err := s.Demote(nodeapi.Key{Namespace: "team-a", Name: "m"}, arena.Sum(w).String(), 0); err != nil {
		t.Fatal(err)
	}
	// The engine's offload stays in the hot tier until the engine releases it.
	if diff := cmp.Diff([]placed{{"m", v1alpha1.TierHot}, {"m", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Errorf("placement (-want +got):\n%s", diff)
	}
	if used := s.Used(v1alpha1.TierWarm); used > cfg.Budgets.Warm {
		t.Errorf("warm tier holds %d bytes, budget %d", used, cfg.Budgets.Warm)
	}
}

// The engines' level-1 offloads are written into the hot directory without
// the agent: they still count against the hot budget (the tmpfs holds
// them), are listed as offloads, and are never evicted for the agent's
// copies; once the engine releases one, its room is the agent's again.
func TestStoreCountsEngineOffloadsInTheHotBudget(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 3 << 10, Warm: 8 << 10})
	src := offload(t, cfg, "sleeper", blob(2<<10, 9))
	if got := s.Used(v1alpha1.TierHot); got != 2<<10 {
		t.Fatalf("hot use with a 2 KiB engine offload = %d, want %d", got, 2<<10)
	}
	want := []nodeapi.Entry{{Key: nodeapi.Key{Namespace: "team-a", Name: "sleeper"}, Tier: v1alpha1.TierHot, Bytes: 2 << 10, Pinned: true, Offload: true}}
	if diff := cmp.Diff(want, s.Entries(), cmpopts.IgnoreFields(nodeapi.Entry{}, "LastUsed")); diff != "" {
		t.Fatalf("entries (-want +got):\n%s", diff)
	}

	// 2 KiB more would exceed the 3 KiB budget, and the offload is not
	// the agent's to evict.
	_, err := s.Put(PutRequest{Key: nodeapi.Key{Namespace: "team-a", Name: "b"}, Tier: v1alpha1.TierHot, Bytes: 2 << 10}, bytes.NewReader(blob(2<<10, 2)))
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("admitting 2 KiB next to a 2 KiB offload under a 3 KiB budget: %v, want ErrNoRoom", err)
	}
	put(t, s, "a", v1alpha1.TierHot, blob(1<<10, 1), 0)
	if got := s.Used(v1alpha1.TierHot); got > cfg.Budgets.Hot {
		t.Fatalf("hot tier holds %d bytes over its %d budget", got, cfg.Budgets.Hot)
	}
	// A copy of higher priority evicts the agent's copy, not the offload.
	_, err = s.Put(PutRequest{Key: nodeapi.Key{Namespace: "team-a", Name: "c"}, Tier: v1alpha1.TierHot, Bytes: 1 << 10, Priority: 5}, bytes.NewReader(blob(1<<10, 3)))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]placed{{"c", v1alpha1.TierHot}, {"sleeper", v1alpha1.TierHot}, {"a", v1alpha1.TierWarm}}, placement(s)); diff != "" {
		t.Fatalf("placement (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("the engine's offload was touched: %v", err)
	}

	// The engine wakes and releases it: the room is the agent's again.
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	put(t, s, "b", v1alpha1.TierHot, blob(2<<10, 2), 5)
	if got := s.Used(v1alpha1.TierHot); got != 3<<10 {
		t.Fatalf("hot use after the offload was released = %d, want %d", got, 3<<10)
	}
}

// Verify re-hashes every kept copy: one that still matches gets a new
// verification time; one whose bytes changed on the node (a bad block, a
// stray write) is dropped, so that no wake reads it, and reported.
func TestStoreVerifyDropsCopiesThatNoLongerMatch(t *testing.T) {
	s, cfg := testStore(t, nodeapi.Budgets{Hot: 8 << 10, Warm: 8 << 10})
	good := put(t, s, "good", v1alpha1.TierWarm, blob(2<<10, 1), 0)
	bad := put(t, s, "bad", v1alpha1.TierHot, blob(2<<10, 2), 0)
	offload(t, cfg, "sleeper", blob(1<<10, 3)) // the engine's: its wake verifies it
	// One byte of the hot copy flips on the node.
	f, err := os.OpenFile(s.Path(bad.Key, v1alpha1.TierHot), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff ^ blob(2<<10, 2)[100]}, 100); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	got := s.Verify()
	ignore := cmpopts.IgnoreFields(nodeapi.Verification{}, "Time", "Got", "Error")
	want := []nodeapi.Verification{
		{Key: bad.Key, Tier: v1alpha1.TierHot, Digest: bad.Digest, Dropped: true},
		{Key: good.Key, Tier: v1alpha1.TierWarm, Digest: good.Digest},
	}
	if diff := cmp.Diff(want, got, ignore); diff != "" {
		t.Fatalf("verifications (-want +got):\n%s", diff)
	}
	if !strings.Contains(got[0].Error, "hash mismatch") || got[0].Got == "" || got[1].Error != "" {
		t.Errorf("the dropped copy should name the mismatch and its new digest, the good one no error: %+v", got)
	}
	if _, ok := s.Lookup(bad.Key, v1alpha1.TierHot); ok {
		t.Error("the copy that no longer verifies is still indexed")
	}
	if _, err := os.Stat(s.Path(bad.Key, v1alpha1.TierHot)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copy that no longer verifies is still on disk: %v", err)
	}
	if e, _ := s.Lookup(good.Key, v1alpha1.TierWarm); !e.VerifiedAt.After(good.VerifiedAt) {
		t.Errorf("the good copy's verification time %v did not move past %v", e.VerifiedAt, good.VerifiedAt)
	}
	if _, err := os.Stat(filepath.Join(cfg.HotDir, "team-a", nodeapi.EngineOffloadName("sleeper"))); err != nil {
		t.Errorf("the engine's offload was touched: %v", err)
	}
}
