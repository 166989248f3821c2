package arena

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// writeSynth writes n synthetic bytes to a file in dir and returns its path
// and the bytes.
func writeSynth(t *testing.T, dir string, n int64, seed uint64) (string, []byte) {
	t.Helper()
	src := synth(t, n, seed)
	path := filepath.Join(dir, "w")
	if err := WriteFile(path, src.Bytes(), false); err != nil {
		t.Fatal(err)
	}
	return path, src.Bytes()
}

// hugeTmpfs mounts a tmpfs that backs files with huge pages, as the node
// agent mounts the hot tier; it skips the test where it cannot mount one.
func hugeTmpfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m,huge=within_size,mode=0700"); err != nil {
		t.Skipf("cannot mount a huge-page tmpfs (needs CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func TestFillFileMapped(t *testing.T) {
	for _, n := range []int64{1, 4095, ChunkSize + 7, 3 * ChunkSize} {
		path, want := writeSynth(t, t.TempDir(), n, uint64(n))
		dst := synth(t, n, 99) // other bytes, as a reused device region holds
		for _, workers := range []int{1, 2, 3} {
			d, st, err := FillFile(dst, path, FileOptions{Method: ReadMapped, Workers: workers})
			if err != nil {
				t.Fatalf("n=%d workers=%d: %v", n, workers, err)
			}
			if !st.Mapped {
				t.Errorf("n=%d: the fill did not use the mapping", n)
			}
			if !bytes.Equal(dst.Bytes(), want) || d != Sum(want) {
				t.Errorf("n=%d workers=%d: the mapped fill gave other bytes or digest", n, workers)
			}
		}
	}
}

func TestFillFileAutoMapsHugePagedFiles(t *testing.T) {
	n := int64(4 << 20)
	huge, _ := writeSynth(t, hugeTmpfs(t), n, 5)
	small, _ := writeSynth(t, t.TempDir(), n, 5)
	dst := synth(t, n, 6)
	for path, mapped := range map[string]bool{huge: true, small: false} {
		if _, st, err := FillFile(dst, path, FileOptions{}); err != nil || st.Mapped != mapped {
			t.Errorf("%s: mapped %v, want %v (err %v)", path, st.Mapped, mapped, err)
		}
		if _, st, err := FillFile(dst, path, FileOptions{Method: ReadPread}); err != nil || st.Mapped {
			t.Errorf("%s with ReadPread: mapped %v (err %v)", path, st.Mapped, err)
		}
	}
}

func TestFillFileMappedDetectsMismatch(t *testing.T) {
	n := int64(2*ChunkSize + 99)
	path, src := writeSynth(t, t.TempDir(), n, 7)
	want := Sum(src)
	// One byte of the stored copy changes, in the middle chunk.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{src[ChunkSize+5] ^ 0x40}, ChunkSize+5); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	dst := synth(t, n, 8)
	_, st, err := FillFile(dst, path, FileOptions{Method: ReadMapped, Remove: true, Expect: &want})
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("err = %v, want a mismatch", err)
	}
	if !st.Mapped {
		t.Error("the fill did not use the mapping")
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("a fill that failed verification removed the file: %v", err)
	}
}

// A byte changed in the middle of a chunk, or of the last, shorter chunk,
// of the hot tier's file fails the wake: the mapped copy hashes every byte
// it lands, and the digest it returns is of the bytes now in the arena.
func TestFillFileMappedCatchesACorruptByteMidChunk(t *testing.T) {
	n := int64(3*ChunkSize + ChunkSize/2 + 17)
	for _, at := range []int64{ChunkSize + ChunkSize/2 + 3, 3*ChunkSize + ChunkSize/4 + 1} {
		path, src := writeSynth(t, hugeTmpfs(t), n, 21)
		want := Sum(src)
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{src[at] ^ 0x01}, at); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		corrupt := bytes.Clone(src)
		corrupt[at] ^= 0x01
		dst := synth(t, n, 22)
		for _, workers := range []int{1, 2} {
			_, st, err := FillFile(dst, path, FileOptions{Workers: workers, Remove: true, Expect: &want})
			var mm *MismatchError
			if !errors.As(err, &mm) || mm.Got != Sum(corrupt) {
				t.Fatalf("byte %d, %d workers: err = %v, want a mismatch reporting the digest of the corrupted bytes", at, workers, err)
			}
			if !st.Mapped {
				t.Errorf("byte %d: the huge-paged file was not mapped", at)
			}
			if !bytes.Equal(dst.Bytes(), corrupt) {
				t.Errorf("byte %d: the arena does not hold the bytes that were hashed", at)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("byte %d: a wake that failed verification removed the file: %v", at, err)
			}
		}
	}
}

func TestVerifiedCopy(t *testing.T) {
	for _, n := range []int64{0, 1, ChunkSize - 1, ChunkSize, 3*ChunkSize + 5} {
		src := synth(t, n, 31)
		dst := synth(t, n, 32)
		if d := VerifiedCopy(dst.Bytes(), src.Bytes()); d != Sum(src.Bytes()) {
			t.Errorf("n=%d: digest %s, want %s", n, d, Sum(src.Bytes()))
		}
		if !bytes.Equal(dst.Bytes(), src.Bytes()) {
			t.Errorf("n=%d: the copy differs from its source", n)
		}
	}
}

func TestFillFileFallsBackToPreadWhenMappingFails(t *testing.T) {
	orig := mapFile
	mapFile = func(int, int) ([]byte, error) { return nil, unix.ENODEV }
	t.Cleanup(func() { mapFile = orig })
	n := int64(ChunkSize + 3)
	path, src := writeSynth(t, t.TempDir(), n, 9)
	want := Sum(src)
	dst := synth(t, n, 10)
	d, st, err := FillFile(dst, path, FileOptions{Method: ReadMapped, Expect: &want})
	if err != nil || d != want || !bytes.Equal(dst.Bytes(), src) {
		t.Fatalf("fill after a failed mapping: %v %v", d, err)
	}
	if st.Mapped {
		t.Error("stats say mapped, but the mapping failed")
	}
}

func TestMappedReadOfFileTruncatedUnderIt(t *testing.T) {
	n := int64(4 * ChunkSize)
	path, _ := writeSynth(t, t.TempDir(), n, 11)
	r, err := openReader(path, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fi, err := r.buffered.Stat()
	if err != nil {
		t.Fatal(err)
	}
	r.mapIfWorth(ReadMapped, fi)
	if r.mapped == nil {
		t.Fatal("not mapped")
	}
	// Another writer cuts the file in half after it was mapped: reading
	// its missing pages faults, and the fault is an error, not a crash.
	if err := os.Truncate(path, n/2); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, ChunkSize)
	// Both the plain copy (ReadFile) and the hashed one (FillFile).
	for _, sums := range [][]uint64{nil, make([]uint64, 1)} {
		if _, err := r.read(buf, 3*ChunkSize, sums); err == nil || !strings.Contains(err.Error(), "changed under the read") {
			t.Fatalf("hashed %v: err = %v, want the fault reported", sums != nil, err)
		}
	}
	if m, err := r.read(buf, 0, nil); err != nil || m != ChunkSize {
		t.Fatalf("read of the part still there: %d %v", m, err)
	}
}

func TestFillFileConsumesMappedHugePagedFile(t *testing.T) {
	n := int64(8*ChunkSize + 4321)
	path, src := writeSynth(t, hugeTmpfs(t), n, 12)
	want := Sum(src)
	dst, err := New(n, Options{NoPopulate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	d, st, err := FillFile(dst, path, FileOptions{Consume: true, Expect: &want})
	if err != nil || d != want || !bytes.Equal(dst.Bytes(), src) {
		t.Fatalf("consuming mapped fill: %v %v", d, err)
	}
	if !st.Mapped {
		t.Error("the huge-paged file was not mapped")
	}
	var fst unix.Stat_t
	if err := unix.Stat(path, &fst); err != nil {
		t.Fatal(err)
	}
	if fst.Blocks*512 >= n/2 {
		t.Errorf("the consumed file still holds %d of %d bytes", fst.Blocks*512, n)
	}
}

// TestWriteFileIntoATmpfs writes a tier file of several huge pages into a
// huge-page tmpfs (through the mapping writeHuge advises) and reads the
// same bytes back; a file larger than the tmpfs is an error naming the
// full tmpfs, and leaves nothing behind.
func TestWriteFileIntoATmpfs(t *testing.T) {
	dir := hugeTmpfs(t) // 64 MiB
	src := synth(t, 5*hugeBlock+123, 31)
	path := filepath.Join(dir, "weights")
	if err := WriteFile(path, src.Bytes(), false); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src.Bytes()) {
		t.Fatal("the file read back differs from the bytes written")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}

	big := synth(t, 80<<20, 32)
	err = WriteFile(filepath.Join(dir, "too-big"), big.Bytes(), false)
	if err == nil || !strings.Contains(err.Error(), "full, or out of memory") {
		t.Fatalf("writing 80 MiB into a 64 MiB tmpfs: %v; want an error saying the tmpfs is full", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("after the failed write the tmpfs holds %d entries, want only the first file", len(entries))
	}
}
