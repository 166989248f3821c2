package arena

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func synth(t *testing.T, n int64, seed uint64) *Arena {
	t.Helper()
	a, err := New(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Free() })
	Synthesize(a.Bytes(), seed)
	return a
}

func TestSynthesizeIsDeterministic(t *testing.T) {
	a, b := make([]byte, 1001), make([]byte, 1001)
	Synthesize(a, 7)
	Synthesize(b, 7)
	if !bytes.Equal(a, b) {
		t.Fatal("same seed gave different bytes")
	}
	Synthesize(b, 8)
	if bytes.Equal(a, b) {
		t.Fatal("different seeds gave the same bytes")
	}
	if bytes.Count(a, []byte{0}) > 50 {
		t.Fatal("synthetic bytes look degenerate")
	}
}

func TestFillFileRoundTrip(t *testing.T) {
	// Sizes around the block size and not a multiple of the O_DIRECT
	// alignment, so the unaligned tail is exercised.
	for _, n := range []int64{0, 1, 4095, 4097, BlockSize, BlockSize + 12345, 3*BlockSize - 1} {
		for i, direct := range []bool{false, true} {
			src := synth(t, n, uint64(n))
			path := filepath.Join(t.TempDir(), "w")
			if err := WriteFile(path, src.Bytes(), true); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("mode %v, want 0600", fi.Mode().Perm())
			}
			// Pre-faulted with one worker, and faulted by two workers.
			dst, err := New(n, Options{NoPopulate: i == 1})
			if err != nil {
				t.Fatal(err)
			}
			d, st, err := FillFile(dst, path, FileOptions{Direct: direct, Workers: i + 1})
			if err != nil {
				t.Fatalf("n=%d direct=%v: %v", n, direct, err)
			}
			if want := Sum(src.Bytes()); d != want {
				t.Errorf("n=%d direct=%v: digest %v, want %v", n, direct, d, want)
			}
			if !bytes.Equal(dst.Bytes(), src.Bytes()) {
				t.Errorf("n=%d direct=%v: bytes differ", n, direct)
			}
			if st.Bytes != n {
				t.Errorf("n=%d: stats bytes %d", n, st.Bytes)
			}
			dst.Free()
		}
	}
}

func TestFillFileSizeMismatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w")
	if err := WriteFile(path, make([]byte, 100), false); err != nil {
		t.Fatal(err)
	}
	a, _ := New(200, Options{})
	defer a.Free()
	if _, _, err := FillFile(a, path, FileOptions{}); err == nil || !strings.Contains(err.Error(), "holds 100 bytes, want 200") {
		t.Fatalf("err = %v", err)
	}
}

func TestFillShortReader(t *testing.T) {
	dst := make([]byte, 10)
	if _, _, err := Fill(dst, bytes.NewReader(make([]byte, 4))); err == nil || !strings.Contains(err.Error(), "after 4 of 10 bytes") {
		t.Fatalf("err = %v", err)
	}
}

func TestDigestString(t *testing.T) {
	d := Sum([]byte("weights"))
	got, err := ParseDigest(d.String())
	if err != nil || got != d {
		t.Fatalf("ParseDigest(%q) = %v, %v", d.String(), got, err)
	}
	for _, bad := range []string{"", "sha256:00", "xxh64:123", "xxh64:zzzzzzzzzzzzzzzz"} {
		if _, err := ParseDigest(bad); err == nil {
			t.Errorf("ParseDigest(%q) succeeded", bad)
		}
	}
	err = error(&MismatchError{Source: "hot", Want: 1, Got: 2, Bytes: 3})
	if !errors.Is(err, ErrMismatch) {
		t.Fatal("MismatchError does not unwrap to ErrMismatch")
	}
}

func TestCopyHash(t *testing.T) {
	src := make([]byte, BlockSize+7)
	Synthesize(src, 1)
	var out bytes.Buffer
	d, n, err := CopyHash(&out, bytes.NewReader(src))
	if err != nil || n != int64(len(src)) || d != Sum(src) || !bytes.Equal(out.Bytes(), src) {
		t.Fatalf("CopyHash: n=%d d=%v err=%v", n, d, err)
	}
}

func TestArenaFree(t *testing.T) {
	a, err := New(1<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a.Bytes()[0] = 1
	a.Free()
	if a.Len() != 0 || a.Bytes() != nil {
		t.Fatal("freed arena still has bytes")
	}
	a.Free() // a second Free does nothing
	var none *Arena
	none.Free()
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]Size{"0": 0, "1048576": 1 << 20, "256MiB": 256 << 20, "0.25GiB": 1 << 28, "4Gi": 4 << 30, "10MB": 10e6, " 1 GiB ": 1 << 30} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "1XB", "99999999TiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded", in)
		}
	}
	for in, want := range map[Size]string{1 << 30: "1GiB", 1 << 28: "256MiB", 3 << 29: "1.5GiB", 100: "100"} {
		if got := in.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int64(in), got, want)
		}
	}
}

func TestFillFileConsume(t *testing.T) {
	n := int64(3*BlockSize + 4321)
	src := synth(t, n, 3)
	want := Sum(src.Bytes())
	path := filepath.Join(t.TempDir(), "w")
	if err := WriteFile(path, src.Bytes(), false); err != nil {
		t.Fatal(err)
	}

	// A wrong digest: the fill fails and the file is whole again.
	wrong := want + 1
	dst, _ := New(n, Options{NoPopulate: true})
	defer dst.Free()
	if _, _, err := FillFile(dst, path, FileOptions{Consume: true, Expect: &wrong, Workers: 2}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("err = %v, want a mismatch", err)
	}
	back, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(back, src.Bytes()) {
		t.Fatalf("after a failed consuming fill the file differs (err %v)", err)
	}

	// The right digest: the bytes arrive and the file's blocks are released.
	dst2, _ := New(n, Options{NoPopulate: true})
	defer dst2.Free()
	d, _, err := FillFile(dst2, path, FileOptions{Consume: true, Expect: &want, Workers: 2})
	if err != nil || d != want || !bytes.Equal(dst2.Bytes(), src.Bytes()) {
		t.Fatalf("consuming fill: %v %v", d, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= n/2 {
		t.Errorf("the consumed file still holds %d of %d bytes", st.Blocks*512, n)
	}

	if _, _, err := FillFile(dst2, path, FileOptions{Consume: true}); err == nil {
		t.Error("consuming without a digest succeeded")
	}
}

func TestHasherMatchesSum(t *testing.T) {
	src := make([]byte, 3*ChunkSize+17)
	Synthesize(src, 9)
	for _, n := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, len(src)} {
		b := src[:n]
		// Written in uneven pieces that straddle chunk boundaries.
		for _, piece := range []int{1 << 10, ChunkSize, ChunkSize + 333, 7 << 20} {
			h := NewHasher()
			for off := 0; off < n; off += piece {
				_, _ = h.Write(b[off:min(off+piece, n)])
			}
			if got, want := h.Sum(), Sum(b); got != want {
				t.Errorf("n=%d piece=%d: hasher %v, Sum %v", n, piece, got, want)
			}
		}
	}
	// One changed byte in any chunk changes the digest.
	want := Sum(src)
	for _, at := range []int{0, ChunkSize, len(src) - 1} {
		src[at] ^= 1
		if Sum(src) == want {
			t.Errorf("flipping byte %d kept the digest", at)
		}
		src[at] ^= 1
	}
}

func TestDeviceKeepsMemoryAcrossFree(t *testing.T) {
	d := NewDevice(3 << 20)
	a, err := d.Alloc(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	a.Bytes()[12345] = 42
	if held, mapped := d.Usage(); held != 2<<20 || mapped != 2<<20 {
		t.Fatalf("usage held %d mapped %d", held, mapped)
	}
	a.Free()
	if held, mapped := d.Usage(); held != 0 || mapped != 2<<20 {
		t.Fatalf("after Free: usage held %d mapped %d; want the region kept", held, mapped)
	}
	// The next allocation that fits gets the same memory back, bytes and all.
	b, err := d.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 1<<20 || b.Bytes()[12345] != 42 {
		t.Fatal("the released region was not reused")
	}
	// No room for a second region while b holds the first.
	if _, err := d.Alloc(2 << 20); !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("err = %v, want ErrDeviceFull", err)
	}
	c, err := d.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b.Free()
	c.Free()
	// A larger request unmaps free regions to make room.
	e, err := d.Alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, mapped := d.Usage(); mapped != 3<<20 {
		t.Errorf("mapped %d after making room, want %d", mapped, 3<<20)
	}
	e.Free()
	d.Trim()
	if _, mapped := d.Usage(); mapped != 0 {
		t.Errorf("mapped %d after Trim", mapped)
	}
}

func TestFillFileRemove(t *testing.T) {
	n := int64(2*ChunkSize + 99)
	src := synth(t, n, 4)
	want := Sum(src.Bytes())
	path := filepath.Join(t.TempDir(), "w")
	if err := WriteFile(path, src.Bytes(), false); err != nil {
		t.Fatal(err)
	}
	dst, _ := New(n, Options{})
	defer dst.Free()
	wrong := want + 1
	if _, _, err := FillFile(dst, path, FileOptions{Remove: true, Expect: &wrong}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("err = %v, want a mismatch", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a fill that failed verification removed the file: %v", err)
	}
	if _, _, err := FillFile(dst, path, FileOptions{Remove: true, Expect: &want}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the verified fill left the file: %v", err)
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("bytes differ")
	}
}

func TestParallelCallsEachIndexOnce(t *testing.T) {
	for _, c := range []struct{ units, workers int }{{0, 2}, {1, 2}, {5, 1}, {7, 2}, {64, 3}, {3, 8}} {
		var mu sync.Mutex
		seen := map[int]int{}
		Parallel(c.units, c.workers, func(i int) {
			mu.Lock()
			seen[i]++
			mu.Unlock()
		})
		if len(seen) != c.units {
			t.Errorf("%d units on %d workers: %d indexes called, want %d", c.units, c.workers, len(seen), c.units)
		}
		for i, k := range seen {
			if i < 0 || i >= c.units || k != 1 {
				t.Errorf("%d units on %d workers: index %d called %d times", c.units, c.workers, i, k)
			}
		}
	}
}
