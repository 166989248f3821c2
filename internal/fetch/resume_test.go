package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
)

// journals reads the resume state the killed process left behind.
func journals(t *testing.T, dest string) map[string]journal {
	t.Helper()
	out := map[string]journal{}
	root := filepath.Join(dest, metaDir, partialDir)
	// The child creates and removes these files while we walk: a missing
	// one is normal, any other error is not.
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".journal") {
			return nil
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var j journal
		if json.Unmarshal(b, &j) == nil { // a journal caught mid-write is skipped
			out[j.Path] = j
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading journals: %v", err)
	}
	return out
}

// checkSavedHash fails unless the digest state j saved covers only chunks
// j lists as done and is exactly the sha256 state after those bytes.
func checkSavedHash(t *testing.T, j journal, content []byte) {
	t.Helper()
	if j.Hashed == 0 {
		return
	}
	done := map[int]bool{}
	for _, i := range j.Done {
		done[i] = true
	}
	for i := 0; i < j.Hashed; i++ {
		if !done[i] {
			t.Errorf("%s: journal saved the hash of %d chunks but chunk %d is not done (done: %v)", j.Path, j.Hashed, i, j.Done)
			return
		}
	}
	if want := shaState(t, content[:min(int64(j.Hashed)*j.ChunkSize, int64(len(content)))]); string(j.SHAState) != string(want) {
		t.Errorf("%s: saved hash state is not the sha256 state after %d chunks", j.Path, j.Hashed)
	}
}

func TestKilledDownloadResumesWithoutRefetchingFinishedChunks(t *testing.T) {
	fx := newRepoFixture("acme/resume").
		add("a.safetensors", safetensorsBytes(fetchtest.Random(4<<20, 11)), true).
		add("b.safetensors", safetensorsBytes(fetchtest.Random(4<<20, 12)), true)
	hub := startHub(t, fx)
	hub.Faults.Throttle(20 * time.Millisecond) // ~3 MB/s per connection: slow enough to kill mid-way
	cfg := testConfig(t, "hf://acme/resume", hub.URL())
	cfg.Concurrency = 3
	total := totalSize(fx.files)

	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // a no-op once the child is killed below

	// Kill once at least one chunk is durably recorded and ranges are in flight.
	eventually(t, 30*time.Second, func() error {
		select {
		case err := <-exited:
			t.Fatalf("child finished before it could be killed (%v):\n%s", err, stderr.String())
		default:
		}
		done := 0
		for _, j := range journals(t, cfg.Dest) {
			done += len(j.Done)
		}
		if served := hub.Stats.BytesServed(); done == 0 || served < 3<<20 {
			return fmt.Errorf("%d chunks recorded and %d bytes served, want at least 1 and %d", done, served, 3<<20)
		}
		return nil
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed child: %v", <-exited) // Wait reports the SIGKILL we sent
	// Let the server notice the dead connections before counting.
	servedBeforeKill := waitQuiet(hub.Stats.BytesServed)
	killed := journals(t, cfg.Dest)
	var recorded int64
	for _, j := range killed {
		recorded += int64(len(j.Done)) * cfg.ChunkSize
		checkSavedHash(t, j, fx.files[j.Path])
	}
	if got := readTree(t, cfg.Dest); len(got) != 0 {
		for p, b := range got {
			if string(b) != string(fx.files[p]) {
				t.Errorf("killed run left a half-written %s under its final name", p)
			}
		}
	}
	t.Logf("killed after %d bytes served, %d bytes in finished chunks", servedBeforeKill, recorded)

	hub.Faults.Throttle(0)
	hub.Stats.Reset()
	if _, err := runFetch(t, cfg, Options{}); err != nil {
		t.Fatalf("resumed run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)

	// No chunk the killed run had recorded is requested again.
	for _, seg := range hub.Stats.Segments() {
		j, ok := killed[seg.Path]
		if !ok {
			continue
		}
		for _, idx := range j.Done {
			lo, hi := int64(idx)*j.ChunkSize, int64(idx+1)*j.ChunkSize
			if seg.Start < hi && seg.Start+seg.N > lo {
				t.Errorf("resumed run fetched %s bytes %d-%d again, chunk %d was finished", seg.Path, seg.Start, seg.Start+seg.N, idx)
			}
		}
	}
	// At most one chunk per in-flight range is downloaded twice.
	servedAfter := hub.Stats.BytesServed()
	if limit := total + int64(cfg.Concurrency)*cfg.ChunkSize; servedBeforeKill+servedAfter > limit {
		t.Errorf("served %d + %d bytes for a %d-byte repository, more than one chunk per range (limit %d)",
			servedBeforeKill, servedAfter, total, limit)
	}
}

func TestCanceledRunKeepsFinishedChunks(t *testing.T) {
	fx := newRepoFixture("acme/cancel").add("w.safetensors", safetensorsBytes(fetchtest.Random(4<<20, 21)), true)
	hub := startHub(t, fx)
	hub.Faults.Throttle(20 * time.Millisecond)
	cfg := testConfig(t, "hf://acme/cancel", hub.URL())
	cfg.Concurrency = 2
	defer func(d time.Duration) { syncEvery = d }(syncEvery)
	syncEvery = 20 * time.Millisecond

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // also when the wait below fails
	errc := make(chan error, 1)
	go func() {
		_, err := Run(ctx, cfg, Options{Logger: testLogger(t)})
		errc <- err
	}()
	// Cancel once the background fsync has made a chunk durable and the
	// journal holds a hash state.
	eventually(t, 20*time.Second, func() error {
		select {
		case err := <-errc:
			t.Fatalf("run ended (%v) before any chunk became durable", err)
		default:
		}
		if j := journals(t, cfg.Dest)["w.safetensors"]; len(j.Durable) == 0 || j.Hashed == 0 {
			return fmt.Errorf("journal has %d durable chunks and %d hashed, want both above 0", len(j.Durable), j.Hashed)
		}
		return nil
	})
	cancel()
	err := <-errc
	if ExitCode(err) != ExitCanceled {
		t.Fatalf("err = %v (exit %d), want exit %d", err, ExitCode(err), ExitCanceled)
	}
	j := journals(t, cfg.Dest)["w.safetensors"]
	if len(j.Done) == 0 {
		t.Fatalf("no finished chunk recorded on cancel")
	}
	if len(j.Durable) == 0 || j.BootID != bootID() {
		t.Errorf("journal records no fsynced chunk or a wrong boot id: %+v", j)
	}
	checkSavedHash(t, j, fx.files["w.safetensors"])
	waitQuiet(hub.Stats.BytesServed)
	hub.Faults.Throttle(0)
	hub.Stats.Reset()
	res, err := runFetch(t, cfg, Options{})
	if err != nil {
		t.Fatalf("resumed run: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if want := totalSize(fx.files) - int64(len(j.Done))*cfg.ChunkSize; hub.Stats.BytesServed() > want {
		t.Errorf("resumed run downloaded %d bytes, want at most %d", hub.Stats.BytesServed(), want)
	}
	if res.Downloaded > totalSize(fx.files) {
		t.Errorf("Downloaded = %d", res.Downloaded)
	}
}

// waitQuiet polls counter until it stops changing for 100ms and returns it.
func waitQuiet(counter func() int64) int64 {
	last, since := counter(), time.Now()
	for time.Since(since) < 100*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
		if n := counter(); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}

// TestResumeAfterRebootTrustsOnlyDurableChunks writes the state a node crash
// leaves: the journal lists chunks 0-2 as written but only chunk 0 as
// fsynced, and the page cache holding chunks 1-2 is gone (zeros on disk).
func TestResumeAfterRebootTrustsOnlyDurableChunks(t *testing.T) {
	content := safetensorsBytes(fetchtest.Random(5<<20, 71))
	fx := newRepoFixture("acme/reboot").add("w.safetensors", content, true)
	for _, tc := range []struct {
		name        string
		boot        string
		wantRefetch []int64 // chunk offsets fetched again
	}{
		{"after a reboot", "another-boot", []int64{1 << 20, 2 << 20}},
		{"same boot", bootID(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hub := startHub(t, fx)
			cfg := testConfig(t, "hf://acme/reboot", hub.URL())
			d := &downloader{cfg: cfg, dest: cfg.Dest}
			part, jpath := d.partPaths("w.safetensors")
			if err := os.MkdirAll(filepath.Dir(part), 0o755); err != nil {
				t.Fatal(err)
			}
			disk := make([]byte, len(content))
			copy(disk, content[:1<<20]) // chunk 0 durable
			if tc.boot == bootID() {
				copy(disk, content[:3<<20]) // same boot: chunks 1-2 still in the page cache
			}
			if err := os.WriteFile(part, disk, 0o644); err != nil {
				t.Fatal(err)
			}
			j := journal{Version: journalVersion, Path: "w.safetensors", Size: int64(len(content)),
				SHA256: fetchtest.SHA256(fetchtest.Bytes(content)), ChunkSize: cfg.ChunkSize,
				Done: []int{0, 1, 2}, Durable: []int{0}, BootID: tc.boot}
			b, _ := json.Marshal(j)
			if err := os.WriteFile(jpath, b, 0o644); err != nil {
				t.Fatal(err)
			}

			if _, err := runFetch(t, cfg, Options{}); err != nil {
				t.Fatalf("Run: %v", err)
			}
			assertTree(t, cfg.Dest, fx.files)
			fetched := map[int64]bool{}
			for _, seg := range hub.Stats.Segments() {
				fetched[seg.Start/cfg.ChunkSize*cfg.ChunkSize] = true
			}
			if fetched[0] {
				t.Errorf("durable chunk 0 fetched again")
			}
			for _, off := range tc.wantRefetch {
				if !fetched[off] {
					t.Errorf("chunk at %d not fetched again", off)
				}
			}
			if tc.wantRefetch == nil && (fetched[1<<20] || fetched[2<<20]) {
				t.Errorf("same boot: written chunks 1-2 fetched again")
			}
		})
	}
}
