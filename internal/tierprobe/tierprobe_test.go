package tierprobe

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestProbeReadsItsFileIntoTheDestination: the probe reads every byte of
// its file into the caller's destination, with the restore's options, and
// leaves the file as it was (a probe of a tier copy must not consume it).
func TestProbeReadsItsFileIntoTheDestination(t *testing.T) {
	const n = 3<<20 + 4096
	dir := t.TempDir()
	dst, err := arena.New(n, arena.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	p, err := Write("disk", dir, dst, arena.FileOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	p.DropCache = true
	b, err := p.ReadBest(2)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bytes != n || b.BytesPerSecond <= 0 || b.What != "disk" {
		t.Errorf("bandwidth %+v, want %d bytes of disk", b, n)
	}
	if string(dst.Bytes()) != string(want) {
		t.Error("the destination does not hold the file's bytes")
	}

	// A probe of an existing file ignores the options that change it.
	d := arena.Sum(want)
	q := Of("tmpfs", p.Path, dst, arena.FileOptions{Consume: true, Remove: true, Expect: &d})
	clear(dst.Bytes())
	if _, err := q.Read(); err != nil {
		t.Fatal(err)
	}
	q.Hash = true
	clear(dst.Bytes())
	if b, err := q.Read(); err != nil || !strings.Contains(b.Method, "hash") {
		t.Fatalf("hashed probe read: %v, %+v", err, b)
	}
	if string(dst.Bytes()) != string(want) {
		t.Error("the hashed read does not land the file's bytes")
	}
	q.Close()
	if fi, err := os.Stat(p.Path); err != nil || fi.Size() != n {
		t.Fatalf("the probed file changed: %v", err)
	}
	p.Close()
	if _, err := os.Stat(p.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left the probe file Write wrote: %v", err)
	}
}

// TestProbeFailsOnADestinationOfAnotherSize: the probe reads exactly the
// restore's size; a destination of another size is an error, not a
// shorter read.
func TestProbeFailsOnADestinationOfAnotherSize(t *testing.T) {
	dst, err := arena.New(1<<20, arena.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	p, err := Write("disk", t.TempDir(), dst, arena.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	small, err := arena.New(1<<19, arena.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Free()
	p.Dst = small
	if _, err := p.Read(); err == nil {
		t.Error("a read into a destination half the file's size succeeded")
	}
}

func TestAroundBoundAndCheck(t *testing.T) {
	before := nodeapi.Bandwidth{What: "tmpfs", Bytes: 1 << 30, Seconds: 0.1, BytesPerSecond: (1 << 30) / 0.1}
	after := nodeapi.Bandwidth{What: "tmpfs", Bytes: 1 << 30, Seconds: 0.3, BytesPerSecond: (1 << 30) / 0.3}
	got := Around(before, after)
	if got.Bytes != 2<<30 || got.Seconds != 0.4 || got.BytesPerSecond != float64(2<<30)/0.4 {
		t.Errorf("Around = %+v", got)
	}
	if p := Peak(before, after, nodeapi.Bandwidth{}); p.Seconds != 0.1 {
		t.Errorf("Peak = %+v, want the read of 0.1 s", p)
	}
	if b := Bound(1<<30, got); b != 200*time.Millisecond {
		t.Errorf("Bound = %v, want 200ms", b)
	}
	if Bound(1, nodeapi.Bandwidth{}) != 0 {
		t.Error("a bound from no measurement is not 0")
	}
	for _, c := range []struct {
		took   time.Duration
		beaten bool
	}{
		{250 * time.Millisecond, false},
		{196 * time.Millisecond, false}, // within the slack
		{150 * time.Millisecond, true},
	} {
		err := Check("hot wake", c.took, 200*time.Millisecond, 0.05)
		if errors.Is(err, ErrBeaten) != c.beaten {
			t.Errorf("Check(%v) = %v, beaten %v", c.took, err, c.beaten)
		}
	}
}

func TestWriteRateWritesAndRemoves(t *testing.T) {
	src, err := arena.New(1<<20, arena.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	dir := t.TempDir()
	b, err := WriteRate("tmpfs", dir, src)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bytes != 1<<20 || b.BytesPerSecond <= 0 {
		t.Errorf("WriteRate = %+v", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("WriteRate left %d files", len(ents))
	}
}
