package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
	"github.com/model-orchestra/operator/internal/fetch/s3test"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

func measure(n int64, hot, disk string, criu nodeagent.CRIU) (row, error) {
	r := row{size: n}
	// The baselines copy and read into memory of the kind a restore lands
	// in, a device region: pre-faulted, in huge pages. memcpy copies
	// between one pair of at most memcpyBytes, kept for the run, so every
	// copy uses the same pages (far larger than any cache, it copies at
	// the speed of larger ones); reads land in an arena as large as the
	// file, made for the reads around a stage and freed before the next,
	// so the hot tier's offload finds the free huge pages the node would
	// give it.
	m := min(n, memcpyBytes)
	// At most memcpy's source and three copies of the weights are held
	// at once: the engine's region, its offload and the probe's region.
	if need := m + 3*n + (2 << 30); memAvailable() < need {
		r.skipped = fmt.Sprintf("skipped: %s available, %s needed", arena.Size(memAvailable()), arena.Size(need))
		return r, nil
	}
	// The engine's own device: its memory is mapped and faulted in when
	// first used, kept while the engine sleeps, and unmapped when it is
	// done. Its first region, kept for the run, is the tier probe's
	// destination (a restore lands in a region of the same device) and
	// memcpy's.
	dev := arena.NewDevice(0)
	defer dev.Trim()
	dst, err := dev.Alloc(n)
	if err != nil {
		return r, err
	}
	defer dst.Free()
	src, err := arena.New(m, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return r, err
	}
	defer src.Free()
	arena.Synthesize(src.Bytes(), 2)
	r.hashedCopy = measureHashedCopy(dst, src)
	// Fresh memory as a wake finds it: freed, then left alone as long as
	// the engine sleeps.
	if err := freeAndWait(n); err != nil {
		return r, err
	}
	if r.fresh, err = nodeagent.MeasureFault(n); err != nil {
		return r, err
	}
	if err := measureReads(&r, n, disk); err != nil {
		return r, err
	}
	runtime.GC()
	if err := measureSim(&r, n, hot, disk, dev, src, dst); err != nil {
		return r, err
	}
	if criu.Report.CheckPassed {
		s, err := measureSnapshot(criu, n, hot)
		if err != nil {
			return r, fmt.Errorf("process snapshot: %w", err)
		}
		r.snap = &s
	}
	return r.withRatios(), nil
}

// measureReads measures the disk's read and the S3 fake's, each into one
// arena of n bytes in huge pages (reference columns, not bounds: the
// bounds are the tier probes around each wake).
func measureReads(r *row, n int64, disk string) error {
	dst, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return err
	}
	defer dst.Free()
	if r.disk1, r.disk2, err = measureDisk(disk, dst); err != nil {
		return err
	}
	r.disk = nodeagent.Peak(r.disk1, r.disk2)
	r.s3, err = measureS3(dst)
	return err
}

// measureHashedCopy copies src into dst with arena.VerifiedCopy, the hot
// restore's copy and hash of each chunk.
func measureHashedCopy(dst, src *arena.Arena) nodeapi.Bandwidth {
	n := src.Len()
	start := time.Now()
	_ = arena.VerifiedCopy(dst.Bytes(), src.Bytes())
	t := time.Since(start)
	return nodeapi.Bandwidth{What: "memcpy + XXH3", Bytes: n, Seconds: t.Seconds(), BytesPerSecond: float64(n) / t.Seconds(),
		Method: fmt.Sprintf("copy and hash each 1 MiB chunk (arena.VerifiedCopy), %d threads", arena.DefaultWorkers())}
}

// measureDisk writes a probe as large as a on the disk and reads it as
// rawReads does.
func measureDisk(dir string, a *arena.Arena) (one, restore nodeapi.Bandwidth, err error) {
	path, err := nodeagent.WriteProbe(dir, a.Len())
	if err != nil {
		return one, restore, fmt.Errorf("writing a %d-byte probe in %s: %w", a.Len(), dir, err)
	}
	defer func() { _ = os.Remove(path) }()
	return rawReads(a, "disk", path, false)
}

// freeAndWait touches n bytes, frees them and waits as long as an engine
// sleeps, so the fresh-memory probe gets the pages a wake would get.
func freeAndWait(n int64) error {
	a, err := arena.New(n, arena.Options{})
	if err != nil {
		return err
	}
	a.Free()
	time.Sleep(asleep)
	return nil
}

// measureS3 GETs an object as large as dst from the in-repo S3 fake over
// loopback into dst.
func measureS3(dst *arena.Arena) (nodeapi.Bandwidth, error) {
	n := dst.Len()
	src, err := arena.New(n, arena.Options{})
	if err != nil {
		return nodeapi.Bandwidth{}, err
	}
	defer src.Free()
	arena.Synthesize(src.Bytes(), 5)
	s := s3test.New("")
	defer s.Close()
	s.Put("models", "w.bin", fetchtest.Bytes(src.Bytes()))
	clear(dst.Bytes()[:4096]) // an earlier read left other bytes there
	t := time.Now()
	resp, err := http.Get(s.URL() + "/models/w.bin")
	if err != nil {
		return nodeapi.Bandwidth{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nodeapi.Bandwidth{}, fmt.Errorf("s3 fake answered %d", resp.StatusCode)
	}
	if _, err := io.ReadFull(resp.Body, dst.Bytes()); err != nil {
		return nodeapi.Bandwidth{}, err
	}
	d := time.Since(t)
	if !bytes.Equal(dst.Bytes()[:4096], src.Bytes()[:4096]) {
		return nodeapi.Bandwidth{}, errors.New("s3 fake returned other bytes")
	}
	return nodeapi.Bandwidth{What: "s3 fake", Bytes: n, Seconds: d.Seconds(), BytesPerSecond: float64(n) / d.Seconds(), Method: "HTTP GET over loopback"}, nil
}

// rawReads reads the file at path with O_DIRECT, without hashing, with one
// reader and with the restore's readers, in that order or, after the
// wake, in reverse: each way then sits on average as close to the wake.
func rawReads(a *arena.Arena, what, path string, reverse bool) (one, restore nodeapi.Bandwidth, err error) {
	readOne := func() error {
		one, err = tierprobe.Of(what, path, a, arena.FileOptions{Direct: true, Workers: 1}).Read()
		return err
	}
	readRestore := func() error {
		restore, err = tierprobe.Of(what, path, a, arena.FileOptions{Direct: true}).Read()
		return err
	}
	order := []func() error{readOne, readRestore}
	if reverse {
		slices.Reverse(order)
	}
	for _, read := range order {
		if err := read(); err != nil {
			return one, restore, err
		}
	}
	return one, restore, nil
}
