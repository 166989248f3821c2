package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/checkpoint"
	"github.com/model-orchestra/operator/internal/checkpoint/arena"
)

// snapshotHelperEnv makes bench-tiers the process a snapshot is taken of:
// its value is "<dir>:<bytes>" (runSnapshotHelper).
const snapshotHelperEnv = "MO_BENCH_TIERS_SNAPSHOT_HELPER"

// snapshotSeed seeds the helper's weights.
const snapshotSeed = 11

// snapshot is one process snapshot round trip: a process holding the
// weights dumped into the hot tier's tmpfs, restored, and asked for the
// digest of the weights it holds.
type snapshot struct {
	dump, restore checkpoint.SnapshotStats
	// verify is how long the restored process took to hash its weights
	// and answer.
	verify   time.Duration
	verified bool
}

// bytesPerSecond is the restore's: the weights over criu's restore.
func (s snapshot) bytesPerSecond(n int64) float64 { return float64(n) / s.restore.Seconds }

// runSnapshotHelper holds n bytes of synthetic weights in a huge-page arena,
// as an engine holds its weights, writes "ready", and whenever the file
// "ask" appears in dir writes the digest of the weights it holds to
// "answer". criu dumps it and restores it. It runs until it is killed and
// returns only why it could not start.
func runSnapshotHelper(spec string) error {
	dir, size, ok := strings.Cut(spec, ":")
	n, err := strconv.ParseInt(size, 10, 64)
	if !ok || err != nil {
		return fmt.Errorf("%s=%q: want <dir>:<bytes>", snapshotHelperEnv, spec)
	}
	w, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		return err
	}
	arena.Synthesize(w.Bytes(), snapshotSeed)
	if err := os.WriteFile(filepath.Join(dir, "ready"), nil, 0o600); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "ask")); err == nil {
			_ = os.Remove(filepath.Join(dir, "ask"))
			_ = os.WriteFile(filepath.Join(dir, "answer.tmp"), []byte(arena.Sum(w.Bytes()).String()), 0o600)
			_ = os.Rename(filepath.Join(dir, "answer.tmp"), filepath.Join(dir, "answer"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// measureSnapshot starts a helper holding n bytes of weights, lets it sit
// as an engine would before its sleep, dumps it into the hot tier (RAM,
// like the hot tier's weights), waits the sleep's pause, restores it and
// asks the restored process for the digest of its weights.
func measureSnapshot(c checkpoint.CRIU, n int64, hot string) (snapshot, error) {
	var s snapshot
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	work, err := os.MkdirTemp("", "mo-bench-tiers-snapshot-")
	if err != nil {
		return s, err
	}
	defer func() { _ = os.RemoveAll(work) }()
	images := filepath.Join(hot, "snapshot")
	defer func() { _ = os.RemoveAll(images) }()

	exe, err := os.Executable()
	if err != nil {
		return s, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", snapshotHelperEnv, work, n))
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return s, err
	}
	defer func() { _ = devnull.Close() }()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	if err := cmd.Start(); err != nil {
		return s, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := waitFile(ctx, filepath.Join(work, "ready")); err != nil {
		return s, fmt.Errorf("the snapshot helper never held its weights: %w", err)
	}
	want, err := ask(ctx, work)
	if err != nil {
		return s, err
	}
	time.Sleep(servesFor)

	if s.dump, err = c.Dump(ctx, cmd.Process.Pid, images); err != nil {
		return s, err
	}
	_ = cmd.Wait() // criu dump ends the process
	time.Sleep(asleep)
	if s.restore, err = c.Restore(ctx, images); err != nil {
		return s, err
	}
	defer func() {
		if p, err := os.FindProcess(s.restore.PID); err == nil {
			_ = p.Kill()
		}
	}()
	t := time.Now()
	got, err := ask(ctx, work)
	if err != nil {
		return s, fmt.Errorf("the restored process: %w", err)
	}
	s.verify = time.Since(t)
	if got != want {
		return s, fmt.Errorf("the restored process holds weights %s, want %s", got, want)
	}
	s.verified = true
	return s, nil
}

// ask has the helper in work (or the process restored from it) hash its
// weights and returns the digest.
func ask(ctx context.Context, work string) (arena.Digest, error) {
	answer := filepath.Join(work, "answer")
	_ = os.Remove(answer)
	if err := os.WriteFile(filepath.Join(work, "ask"), nil, 0o600); err != nil {
		return 0, err
	}
	if err := waitFile(ctx, answer); err != nil {
		return 0, fmt.Errorf("no answer: %w", err)
	}
	b, err := os.ReadFile(answer)
	if err != nil {
		return 0, err
	}
	return arena.ParseDigest(string(b))
}

func waitFile(ctx context.Context, path string) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
