package fetch

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
)

// writeJournalFixture leaves the partial file and journal a killed run
// would: the file at its full size, prefix written at its start.
func writeJournalFixture(t *testing.T, d *downloader, j journal, prefix []byte) {
	t.Helper()
	part, jpath := d.partPaths(j.Path)
	if err := os.MkdirAll(filepath.Dir(part), 0o755); err != nil {
		t.Fatal(err)
	}
	disk := make([]byte, j.Size)
	copy(disk, prefix)
	if err := os.WriteFile(part, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jpath, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// shaState is the serialized sha256 state after b, as the journal saves it.
func shaState(t *testing.T, b []byte) []byte {
	t.Helper()
	h := sha256.New()
	h.Write(b)
	s, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestHashStreamFollowsWritesInAnyOrder writes a file the way workers do
// (chunks in parallel, each from its start in pieces of random size) and
// checks the streamed digest, the digest states offered to the journal, and
// how many bytes had to be read back from the file.
func TestHashStreamFollowsWritesInAnyOrder(t *testing.T) {
	const chunk = 1 << 20
	content := fetchtest.Random(5*chunk+12345, 7)
	sum := sha256.Sum256(content)
	for _, tc := range []struct {
		name    string
		writers int
		order   []int // chunks in the order they are started
		resumed int   // chunks the journal already hashed and lists as done
		// noReadBack: every byte must be hashed from the writers' buffers
		// (one range writing at the hash frontier), none read back.
		noReadBack bool
	}{
		{name: "one range, in order", writers: 1, order: []int{0, 1, 2, 3, 4, 5}, noReadBack: true},
		{name: "one range, backwards", writers: 1, order: []int{5, 4, 3, 2, 1, 0}},
		{name: "four ranges", writers: 4, order: []int{0, 1, 2, 3, 4, 5}},
		{name: "four ranges, shuffled", writers: 4, order: []int{3, 0, 5, 1, 4, 2}},
		{name: "resumed after two hashed chunks", writers: 1, order: []int{2, 3, 4, 5}, resumed: 2, noReadBack: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.ChunkSize = chunk
			d := &downloader{cfg: cfg, dest: t.TempDir(), log: slog.New(slog.DiscardHandler), progress: newTracker()}
			rf := RemoteFile{Path: "w.bin", Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}
			if tc.resumed > 0 {
				// The state a previous run journaled, with its chunks on disk.
				j := journal{Version: journalVersion, Path: rf.Path, Size: rf.Size, SHA256: rf.SHA256, ChunkSize: chunk,
					BootID: bootID(), Hashed: tc.resumed, SHAState: shaState(t, content[:tc.resumed*chunk])}
				for i := 0; i < tc.resumed; i++ {
					j.Done = append(j.Done, i)
				}
				writeJournalFixture(t, d, j, content[:tc.resumed*chunk])
			}
			ft, err := d.prepare(rf)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = ft.fh.Close() }()
			if len(ft.pending) != len(tc.order) {
				t.Fatalf("prepare: %d chunks pending, want %d", len(ft.pending), len(tc.order))
			}

			hashed := make(chan error, 1)
			go func() { hashed <- ft.hs.run(context.Background()) }()
			jobs := make(chan int)
			var wg sync.WaitGroup
			for w := 0; w < tc.writers; w++ {
				wg.Add(1)
				go func(seed uint64) {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, 1))
					for c := range jobs {
						off, end := ft.chunkRange(c)
						for off < end {
							n := min(int64(1+r.IntN(bufSize)), end-off)
							bp := d.getBuf()
							copy(*bp, content[off:off+n])
							if _, err := ft.fh.WriteAt((*bp)[:n], off); err != nil {
								t.Error(err)
								return
							}
							if !ft.wrote(off, bp, int(n)) {
								d.putBuf(bp)
							}
							off += n
						}
					}
				}(uint64(w))
			}
			for _, c := range tc.order {
				jobs <- c
			}
			close(jobs)
			wg.Wait()
			if err := <-hashed; err != nil {
				t.Fatalf("hasher: %v", err)
			}

			if got := hex.EncodeToString(ft.hs.h.sha.Sum(nil)); got != rf.SHA256 {
				t.Errorf("streamed sha256 %s, want %s", got, rf.SHA256)
			}
			if tc.noReadBack && ft.hs.readBack != 0 {
				t.Errorf("read back %d bytes, want none", ft.hs.readBack)
			}
			// Every chunk is done now: the journal gets the final state.
			s, ok := ft.hs.saveable(ft.nchunks)
			if !ok || s.chunks != ft.nchunks || string(s.sha) != string(shaState(t, content)) {
				t.Errorf("saveable(%d) = %d chunks, ok %v; want the state after the whole file", ft.nchunks, s.chunks, ok)
			}
		})
	}
}

// TestHashStreamOffersOnlyStatesOfRecordedChunks checks the journal never
// gets a digest state covering a chunk it does not list as done.
func TestHashStreamOffersOnlyStatesOfRecordedChunks(t *testing.T) {
	const chunk = 1 << 20
	content := fetchtest.Random(3*chunk, 9)
	cfg := Default()
	cfg.ChunkSize = chunk
	d := &downloader{cfg: cfg, dest: t.TempDir(), log: slog.New(slog.DiscardHandler), progress: newTracker()}
	ft, err := d.prepare(RemoteFile{Path: "w.bin", Size: int64(len(content))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ft.fh.Close() }()
	hashed := make(chan error, 1)
	go func() { hashed <- ft.hs.run(context.Background()) }()
	for off := int64(0); off < int64(len(content)); off += bufSize {
		bp := d.getBuf()
		copy(*bp, content[off:off+bufSize])
		if _, err := ft.fh.WriteAt(*bp, off); err != nil {
			t.Fatal(err)
		}
		ft.wrote(off, bp, bufSize)
	}
	if err := <-hashed; err != nil {
		t.Fatal(err)
	}
	// All three chunks are hashed, but the journal lists only the first.
	ft.mu.Lock()
	s, ok := ft.hs.saveable(1)
	ft.mu.Unlock()
	if !ok || s.chunks != 1 || string(s.sha) != string(shaState(t, content[:chunk])) {
		t.Errorf("with 1 chunk recorded: state of %d chunks (ok %v), want the state after chunk 0", s.chunks, ok)
	}
	ft.mu.Lock()
	s, ok = ft.hs.saveable(3)
	ft.mu.Unlock()
	if !ok || s.chunks != 3 || string(s.sha) != string(shaState(t, content)) {
		t.Errorf("with 3 chunks recorded: state of %d chunks (ok %v), want the state after the file", s.chunks, ok)
	}
}
