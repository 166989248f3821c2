package arena

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// The restore micro-benchmarks read a file on a tmpfs into a pre-faulted
// arena and verify it, each a different way, to choose FillFile's path.
// MO_ARENA_BENCH_DIR names a directory on the hot tier's tmpfs (mount one
// with huge=within_size to measure what the node agent mounts; default
// /dev/shm) and MO_ARENA_BENCH_SIZE the file's size (default 1GiB):
//
//	MO_ARENA_BENCH_DIR=/mnt/hot go test ./internal/arena -run '^$' -bench Restore -benchtime 5x

func benchFile(b *testing.B) (string, int) {
	b.Helper()
	dir := os.Getenv("MO_ARENA_BENCH_DIR")
	if dir == "" {
		dir = "/dev/shm"
	}
	n := benchSize(b)
	d, err := os.MkdirTemp(dir, "arena-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(d) })
	src, err := New(int64(n), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Free()
	Synthesize(src.Bytes(), 3)
	path := filepath.Join(d, "w")
	if err := WriteFile(path, src.Bytes(), false); err != nil {
		b.Fatal(err)
	}
	return path, int(n)
}

// benchSize is MO_ARENA_BENCH_SIZE (default 1GiB).
func benchSize(b *testing.B) Size {
	b.Helper()
	n := Size(1 << 30)
	if s := os.Getenv("MO_ARENA_BENCH_SIZE"); s != "" {
		if err := n.Set(s); err != nil {
			b.Fatal(err)
		}
	}
	return n
}

// restoreFunc restores chunk i of src (a mapping, or nil for pread from f)
// into dst and returns its chunk digest.
type restoreFunc func(dst, src []byte, f *os.File, off int) uint64

func hashSub(src []byte, sub int, each func(s []byte)) uint64 {
	h := xxh3.New()
	for o := 0; o < len(src); o += sub {
		s := src[o:min(o+sub, len(src))]
		_, _ = h.Write(s)
		each(s)
	}
	return h.Sum64()
}

// How a way reads the file: pread, or out of a mapping populated when it
// is made, or populated chunk by chunk by the workers.
const (
	noMap = iota
	populatedMap
	lazyMap
)

func BenchmarkRestore(b *testing.B) {
	path, n := benchFile(b)
	ways := []struct {
		name    string
		mapping int
		f       restoreFunc
	}{
		{"pread", noMap, func(dst, _ []byte, f *os.File, off int) uint64 {
			_, _ = f.ReadAt(dst, int64(off))
			return 0
		}},
		{"pread+hashdst", noMap, func(dst, _ []byte, f *os.File, off int) uint64 {
			_, _ = f.ReadAt(dst, int64(off))
			return chunkSum(dst)
		}},
		{"map-copy", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			copy(dst, src)
			return 0
		}},
		{"map-copy+hashdst", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			copy(dst, src)
			return chunkSum(dst)
		}},
		{"map-copy2x512K+hashdst", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			// Copies under 1 MiB use cached stores: the hash reads
			// the chunk from the cache.
			mid := len(src) / 2
			copy(dst[:mid], src[:mid])
			copy(dst[mid:], src[mid:])
			return chunkSum(dst)
		}},
		{"map-hashsrc+copy", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			s := chunkSum(src)
			copy(dst, src)
			return s
		}},
		{"maplazy-populate+copy+hashdst", lazyMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			_ = unix.Madvise(src, unix.MADV_POPULATE_READ)
			copy(dst, src)
			return chunkSum(dst)
		}},
		{"map-hashsrc", populatedMap, func(_, src []byte, _ *os.File, _ int) uint64 {
			return chunkSum(src)
		}},
		{"map-fused64K", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			o := 0
			return hashSub(src, 64<<10, func(s []byte) { copy(dst[o:], s); o += len(s) })
		}},
		{"map-fused256K", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			o := 0
			return hashSub(src, 256<<10, func(s []byte) { copy(dst[o:], s); o += len(s) })
		}},
		{"map-copy256K+hashdst", populatedMap, func(dst, src []byte, _ *os.File, _ int) uint64 {
			h := xxh3.New()
			for o := 0; o < len(src); o += 256 << 10 {
				e := min(o+256<<10, len(src))
				copy(dst[o:e], src[o:e])
				_, _ = h.Write(dst[o:e])
			}
			return h.Sum64()
		}},
	}
	for _, huge := range []bool{false, true} {
		pages := PagesSmall
		if huge {
			pages = PagesHuge
		}
		dst, err := New(int64(n), Options{Pages: pages})
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range ways {
			for _, workers := range []int{1, 2, 3} {
				b.Run(fmt.Sprintf("%s/huge=%v/workers=%d", w.name, huge, workers), func(b *testing.B) {
					b.SetBytes(int64(n))
					f, err := os.Open(path)
					if err != nil {
						b.Fatal(err)
					}
					defer func() { _ = f.Close() }()
					for b.Loop() {
						var src []byte
						if w.mapping != noMap {
							flags := unix.MAP_SHARED
							if w.mapping == populatedMap {
								flags |= unix.MAP_POPULATE
							}
							src, err = unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, flags)
							if err != nil {
								b.Fatal(err)
							}
						}
						var wg sync.WaitGroup
						for k := range workers {
							wg.Add(1)
							go func() {
								defer wg.Done()
								for off := k * ChunkSize; off < n; off += workers * ChunkSize {
									end := min(off+ChunkSize, n)
									var s []byte
									if src != nil {
										s = src[off:end]
									}
									_ = w.f(dst.full[off:end], s, f, off)
								}
							}()
						}
						wg.Wait()
						if src != nil {
							_ = unix.Munmap(src)
						}
					}
				})
			}
		}
		dst.Free()
	}
}

// BenchmarkMapPopulate is the cost of mapping the tier file, populated.
func BenchmarkMapPopulate(b *testing.B) {
	path, n := benchFile(b)
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	b.SetBytes(int64(n))
	for b.Loop() {
		m, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			b.Fatal(err)
		}
		_ = unix.Munmap(m)
	}
}

// BenchmarkHashInCache compares XXH3 of a 1 MiB chunk in one call with the
// streaming hasher fed 64 KiB pieces, on bytes in the cache.
func BenchmarkHashInCache(b *testing.B) {
	buf := make([]byte, ChunkSize)
	Synthesize(buf, 1)
	b.Run("Hash", func(b *testing.B) {
		b.SetBytes(ChunkSize)
		for b.Loop() {
			_ = chunkSum(buf)
		}
	})
	b.Run("Hasher64K", func(b *testing.B) {
		b.SetBytes(ChunkSize)
		for b.Loop() {
			_ = hashSub(buf, 64<<10, func([]byte) {})
		}
	})
}

// BenchmarkDirectRead reads a file on a disk with O_DIRECT into a
// pre-faulted arena: raw (ReadFile) and verified (FillFile), by reader
// count. MO_ARENA_BENCH_DISK_DIR names a directory on the disk (default
// /var/tmp).
func BenchmarkDirectRead(b *testing.B) {
	dir := os.Getenv("MO_ARENA_BENCH_DISK_DIR")
	if dir == "" {
		dir = "/var/tmp"
	}
	b.Setenv("MO_ARENA_BENCH_DIR", dir)
	path, n := benchFile(b)
	dst, err := New(int64(n), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Free()
	for _, workers := range []int{1, 2, 4, 8} {
		for _, verified := range []bool{false, true} {
			b.Run(fmt.Sprintf("workers=%d/verified=%v", workers, verified), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					opts := FileOptions{Direct: true, Workers: workers}
					var st FillStats
					if verified {
						_, st, err = FillFile(dst, path, opts)
					} else {
						st, err = ReadFile(dst, path, opts)
					}
					if err != nil || !st.Direct {
						b.Fatalf("direct %v: %v", st.Direct, err)
					}
				}
			})
		}
	}
}

// BenchmarkFillFile is the restore itself: FillFile from the tier file into
// a pre-faulted arena, each way.
func BenchmarkFillFile(b *testing.B) {
	path, n := benchFile(b)
	dst, err := New(int64(n), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Free()
	for _, m := range []struct {
		name   string
		method ReadMethod
	}{{"auto", ReadAuto}, {"pread", ReadPread}, {"mapped", ReadMapped}} {
		b.Run(m.name, func(b *testing.B) {
			b.SetBytes(int64(n))
			var st FillStats
			for b.Loop() {
				if _, st, err = FillFile(dst, path, FileOptions{Method: m.method}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(map[bool]float64{false: 0, true: 1}[st.Mapped], "mapped")
		})
	}
}

// chunkWay copies one chunk of src into dst and returns its chunk digest.
type chunkWay struct {
	name string
	f    func(dst, src []byte) uint64
}

func fusedDst(sub int) chunkWay {
	return chunkWay{fmt.Sprintf("copy%dK+hashdst", sub>>10), func(dst, src []byte) uint64 {
		h := xxh3.New()
		for o := 0; o < len(src); o += sub {
			e := min(o+sub, len(src))
			copy(dst[o:e], src[o:e])
			_, _ = h.Write(dst[o:e])
		}
		return h.Sum64()
	}}
}

// cachedCopy copies the chunk in sub-blocks under 1 MiB, which Go copies
// with cached stores, then hashes the whole chunk in one call while it is
// in the cache.
func cachedCopy(sub int) chunkWay {
	return chunkWay{fmt.Sprintf("copy%dK+hash1Mdst", sub>>10), func(dst, src []byte) uint64 {
		for o := 0; o < len(src); o += sub {
			e := min(o+sub, len(src))
			copy(dst[o:e], src[o:e])
		}
		return chunkSum(dst)
	}}
}

func fusedSrc(sub int) chunkWay {
	return chunkWay{fmt.Sprintf("hashsrc%dK+copy", sub>>10), func(dst, src []byte) uint64 {
		h := xxh3.New()
		for o := 0; o < len(src); o += sub {
			e := min(o+sub, len(src))
			_, _ = h.Write(src[o:e])
			copy(dst[o:e], src[o:e])
		}
		return h.Sum64()
	}}
}

// benchArenas maps two pre-faulted n-byte arenas for the length of the
// benchmark, the first holding Synthesize(seed).
func benchArenas(b *testing.B, n int, seed uint64) (src, dst *Arena) {
	b.Helper()
	for _, a := range []**Arena{&src, &dst} {
		var err error
		if *a, err = New(int64(n), Options{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup((*a).Free)
	}
	Synthesize(src.Bytes(), seed)
	return src, dst
}

// BenchmarkVerifiedCopy copies between two pre-faulted arenas in 1 MiB
// chunks on DefaultWorkers goroutines, each way of verifying the chunk,
// next to the plain copy it is measured against: hash the destination
// after a 1 MiB (non-temporal) copy, hash the source before or after
// the copy (copyThenHash), the copy fused with the hash (copyChunk, what
// FillFile does where it can), copy in sub-blocks (cached
// stores) and hash the chunk in one call, and the streaming hash fed each
// sub-block right after its copy (destination) or right before it
// (source). Build the
// test binary and run it several times with -test.count 1, so the ways
// interleave:
//
//	go test -c -o /tmp/arena.test ./internal/arena
//	for i in 1 2 3 4 5; do /tmp/arena.test -test.run '^$' -test.bench VerifiedCopy -test.benchtime 4x; done
func BenchmarkVerifiedCopy(b *testing.B) {
	n := int(benchSize(b))
	src, dst := benchArenas(b, n, 4)
	ways := []chunkWay{
		{"memcpy", func(dst, src []byte) uint64 { copy(dst, src); return 0 }},
		{"copy1M+hashdst", func(dst, src []byte) uint64 { copy(dst, src); return chunkSum(dst) }},
		{"hashsrc1M+copy1M", func(dst, src []byte) uint64 { s := chunkSum(src); copy(dst, src); return s }},
		{"copy1M+hashsrc", copyThenHash},
		{"fused", copyChunk},
		cachedCopy(512 << 10),
		fusedDst(16 << 10), fusedDst(64 << 10), fusedSrc(64 << 10),
	}
	runs := make([]way, len(ways))
	for i, w := range ways {
		runs[i] = way{w.name, func() { parallelChunks(dst.full[:n], src.full[:n], w.f) }}
	}
	interleave(b, n, runs)
}

// BenchmarkFusedCopyHash copies 256 MiB between two pre-faulted arenas in
// 1 MiB chunks on one goroutine: the plain copy, the copy then the hash of
// the source (copyThenHash) and the copy fused with the hash (copyChunk),
// interleaved; the shares are of the plain copy's bandwidth.
//
//	go test ./internal/arena -run '^$' -bench FusedCopyHash -benchtime 20x
func BenchmarkFusedCopyHash(b *testing.B) {
	const n = 256 << 20
	src, dst := benchArenas(b, n, 5)
	chunked := func(f func(dst, src []byte) uint64) func() {
		return func() {
			for off := 0; off < n; off += ChunkSize {
				_ = f(dst.full[off:off+ChunkSize], src.full[off:off+ChunkSize])
			}
		}
	}
	b.Logf("fused copy and hash: %v", fusedAvailable())
	interleave(b, n, []way{
		{"memcpy", chunked(func(dst, src []byte) uint64 { copy(dst, src); return 0 })},
		{"copy-then-hash", chunked(copyThenHash)},
		{"fused", chunked(copyChunk)},
	})
}

// parallelChunks runs f on every chunk of src and dst as the restore's
// workers take them (eachChunk).
func parallelChunks(dst, src []byte, f func(dst, src []byte) uint64) {
	eachChunk(len(src), func(_, off, end int) { _ = f(dst[off:end], src[off:end]) })
}

// way is one thing a benchmark round does.
type way struct {
	name string
	run  func()
}

// interleave runs every way once per round, starting one way later each
// round, so that the machine's load, which moves from second to second on
// a shared machine, weighs on all of them alike. For each way it reports
// the median over rounds of the first way's time ÷ its time in the same
// round (its bandwidth as a share of the first way's) and its median
// bandwidth in GB/s.
func interleave(b *testing.B, n int, ways []way) {
	b.Helper()
	secs := make([][]float64, len(ways))
	round := 0
	for b.Loop() {
		for k := range ways {
			i := (round + k) % len(ways)
			t := time.Now()
			ways[i].run()
			secs[i] = append(secs[i], time.Since(t).Seconds())
		}
		round++
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	for i, w := range ways {
		share := make([]float64, len(secs[i]))
		for r := range share {
			share[r] = secs[0][r] / secs[i][r]
		}
		b.ReportMetric(median(share), w.name+"/"+ways[0].name)
		b.ReportMetric(float64(n)/median(secs[i])/1e9, w.name+"-GB/s")
	}
}

// BenchmarkHotRestore is the hot tier's wake next to what bounds it, in one
// run: memcpy between two pre-faulted arenas (1 MiB chunks, DefaultWorkers
// goroutines), a copy hashing each chunk in the destination after it, the
// copy then the hash of the source (copyThenHash), the verified copy
// FillFile's mapped path does (copyChunk, fused where it can be), between
// the same arenas, and FillFile itself from the tier file into the
// destination arena, mapped. Point MO_ARENA_BENCH_DIR at a tmpfs mounted
// with huge=within_size, as the node agent mounts the hot tier.
func BenchmarkHotRestore(b *testing.B) {
	path, n := benchFile(b)
	src, dst := benchArenas(b, n, 3)
	want := Sum(src.Bytes())
	copyWay := func(f func(dst, src []byte) uint64) func() {
		return func() { parallelChunks(dst.full[:n], src.full[:n], f) }
	}
	interleave(b, n, []way{
		{"memcpy", copyWay(func(dst, src []byte) uint64 { copy(dst, src); return 0 })},
		{"copy+hashdst", copyWay(func(dst, src []byte) uint64 { copy(dst, src); return chunkSum(dst) })},
		{"copy+hashsrc", copyWay(copyThenHash)},
		{"verified-copy", copyWay(copyChunk)},
		{"fill", func() {
			// ReadAuto maps a file in huge pages; ReadMapped maps any,
			// so a tmpfs without huge= measures the mapping in 4 KiB
			// pages.
			_, st, err := FillFile(dst, path, FileOptions{Method: ReadMapped, Expect: &want})
			if err != nil {
				b.Fatal(err)
			}
			if !st.Mapped {
				b.Fatal("the tier file could not be mapped")
			}
		}},
	})
}
