package checkpoint

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/internal/checkpoint/arena"
)

func testStore(t *testing.T, b Budgets) (*Store, StoreConfig) {
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

func put(t *testing.T, s *Store, name string, tier Tier, b []byte, prio int32) Entry {
	t.Helper()
	e, err := s.Put(PutRequest{Key: Key{"team-a", name}, Tier: tier, Bytes: int64(len(b)), Priority: prio}, bytes.NewReader(b))
	if err != nil {
		t.Fatalf("put %s: %v", name, err)
	}
	return e
}

type placed struct {
	Name string
	Tier Tier
}

func placement(s *Store) []placed {
	var out []placed
	for _, e := range s.Entries() {
		out = append(out, placed{e.Name, e.Tier})
	}
	return out
}

func TestStoreBudgetsEvictionAndDemotion(t *testing.T) {
	s, cfg := testStore(t, Budgets{Hot: 3 << 10, Warm: 4 << 10})
	a, b, c := blob(1<<10, 1), blob(1<<10, 2), blob(2<<10, 3)
	put(t, s, "a", TierHot, a, 0)
	put(t, s, "b", TierHot, b, 5)
	s.Touch(Key{"team-a", "a"}) // a is now more recent, but b has the higher priority
	put(t, s, "c", TierHot, c, 5)
	// c needs 1 KiB more: a (priority 0) goes first, demoted to warm.
	if diff := cmp.Diff([]placed{{"b", TierHot}, {"c", TierHot}, {"a", TierWarm}}, placement(s)); diff != "" {
		t.Fatalf("placement (-want +got):\n%s", diff)
	}
	if s.Used(TierHot) > cfg.Budgets.Hot {
		t.Fatalf("hot tier holds %d bytes over its %d budget", s.Used(TierHot), cfg.Budgets.Hot)
	}
	got, err := os.ReadFile(s.Path(Key{"team-a", "a"}, TierWarm))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("the demoted copy is not the bytes: %v", err)
	}
	if _, err := os.Stat(s.Path(Key{"team-a", "a"}, TierHot)); !os.IsNotExist(err) {
		t.Fatalf("the hot copy of a survived its eviction: %v", err)
	}
	fi, err := os.Stat(filepath.Join(cfg.HotDir, "team-a"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("namespace dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	// A low priority artifact never evicts higher ones.
	if _, err := s.Put(PutRequest{Key: Key{"team-a", "d"}, Tier: TierHot, Bytes: 2 << 10, Priority: 1}, bytes.NewReader(blob(2<<10, 4))); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("low-priority put: %v, want ErrNoRoom", err)
	}
}

func TestStoreRestoreVerifiesAndReopens(t *testing.T) {
	s, cfg := testStore(t, Budgets{Hot: 1 << 20, Warm: 1 << 20})
	w := blob(100<<10+3, 7)
	e := put(t, s, "w", TierWarm, w, 0)
	if e.Digest != arena.Sum(w).String() {
		t.Fatalf("digest %s, want %s", e.Digest, arena.Sum(w))
	}
	hot, err := s.Promote(Key{"team-a", "w"}, TierHot, "", "", 0)
	if err != nil || hot.Tier != TierHot {
		t.Fatalf("promote warm→hot: %+v %v", hot, err)
	}
	a, _ := arena.New(int64(len(w)), arena.Options{})
	defer a.Free()
	got, _, err := s.Restore(Key{"team-a", "w"}, a)
	if err != nil || got.Tier != TierHot || !bytes.Equal(a.Bytes(), w) {
		t.Fatalf("restore: %+v %v", got, err)
	}

	// Corrupt the hot copy: the restore must fail, naming the mismatch.
	p := s.Path(Key{"team-a", "w"}, TierHot)
	bad := append([]byte(nil), w...)
	bad[5] ^= 0xff
	if err := os.WriteFile(p, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Restore(Key{"team-a", "w"}, a); !errors.Is(err, arena.ErrMismatch) {
		t.Fatalf("restore of a corrupt copy: %v, want ErrMismatch", err)
	}

	// A leftover temporary file and a file without metadata are cleaned
	// on reopen; the valid copies are indexed again.
	_ = os.WriteFile(filepath.Join(cfg.WarmDir, "team-a", ".x.tmp-1"), []byte("partial"), 0o600)
	_ = os.WriteFile(filepath.Join(cfg.WarmDir, "team-a", "orphan"), []byte("?"), 0o600)
	s2, err := OpenStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]placed{{"w", TierHot}, {"w", TierWarm}}, placement(s2)); diff != "" {
		t.Fatalf("reopened placement (-want +got):\n%s", diff)
	}
	for _, f := range []string{".x.tmp-1", "orphan"} {
		if _, err := os.Stat(filepath.Join(cfg.WarmDir, "team-a", f)); !os.IsNotExist(err) {
			t.Errorf("%s survived the reopen", f)
		}
	}
}

func TestStorePromoteFromColdChecksTheDigest(t *testing.T) {
	s, _ := testStore(t, Budgets{Hot: 1 << 20, Warm: 1 << 20})
	w := blob(64<<10, 9)
	cold := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(cold, w, 0o600); err != nil {
		t.Fatal(err)
	}
	k := Key{"team-a", "m"}
	if _, err := s.Promote(k, TierWarm, cold, arena.Sum([]byte("other")).String(), 0); !errors.Is(err, arena.ErrMismatch) {
		t.Fatalf("promote with a wrong digest: %v, want ErrMismatch", err)
	}
	if _, ok := s.Lookup(k, TierWarm); ok {
		t.Fatal("a mismatching copy was admitted")
	}
	if _, err := s.Promote(k, TierWarm, cold, arena.Sum(w).String(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Promote(k, TierHot, "", "", 0); err != nil {
		t.Fatalf("warm→hot: %v", err)
	}
	if diff := cmp.Diff([]placed{{"m", TierHot}, {"m", TierWarm}}, placement(s)); diff != "" {
		t.Fatalf("placement (-want +got):\n%s", diff)
	}
	if _, err := s.Promote(Key{"team-a", "absent"}, TierHot, "", "", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("promote of an unknown artifact: %v", err)
	}
}

func TestKeyValidate(t *testing.T) {
	for _, k := range []Key{{"", "x"}, {"Team", "x"}, {"ns", ""}, {"ns", "../x"}, {"ns", ".hidden"}, {"ns", "a/b"}} {
		if err := k.Validate(); err == nil {
			t.Errorf("%+v is valid", k)
		}
	}
	if err := (Key{"team-a", "model.gguf"}).Validate(); err != nil {
		t.Error(err)
	}
}
