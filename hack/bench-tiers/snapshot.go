package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/sim"
)

// snapshotHelperEnv makes bench-tiers the process a snapshot is taken of,
// a simulator: its value is "<port>:<bytes>:<hot dir>" (runSnapshotHelper).
const snapshotHelperEnv = "MO_BENCH_TIERS_SNAPSHOT_HELPER"

// snapshot is one process snapshot round trip: a simulator holding the
// weights dumped into the hot tier's tmpfs and restored; the restored
// simulator then sleeps at level 1 and wakes, which hashes the weights it
// holds against the digest it took at its load.
type snapshot struct {
	dump, restore nodeagent.SnapshotStats
	// verify is the restored simulator's level-1 sleep and wake; a
	// snapshot is only kept when that wake verified.
	verify time.Duration
}

// bytesPerSecond is the restore's: the weights over criu's restore.
func (s snapshot) bytesPerSecond(n int64) float64 { return float64(n) / s.restore.Seconds }

// runSnapshotHelper runs a simulator, as orchestra-sim does, holding n
// bytes of synthetic weights in its device pool and listening on port with
// sleep mode on. criu dumps it and restores it. It runs until it is killed
// and returns only why it could not start or serve.
func runSnapshotHelper(spec string) error {
	parts := strings.SplitN(spec, ":", 3)
	if len(parts) != 3 {
		return fmt.Errorf("%s=%q: want <port>:<bytes>:<hot dir>", snapshotHelperEnv, spec)
	}
	n, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", snapshotHelperEnv, spec, err)
	}
	cfg := sim.Default()
	cfg.Addr = "127.0.0.1:" + parts[0]
	cfg.Model = "sim-snapshot"
	cfg.Weights = sim.Weights{Bytes: n, Seed: 11}
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: parts[2]}
	return sim.Run(context.Background(), cfg, slog.New(slog.DiscardHandler))
}

// measureSnapshot starts a simulator holding n bytes of weights, lets it
// serve as an engine does before its sleep, dumps it into the hot tier
// (RAM, like the hot tier's weights), waits the sleep's pause, restores
// it, and has the restored simulator verify its weights with a level-1
// sleep and wake.
func measureSnapshot(c nodeagent.CRIU, n int64, hot string) (snapshot, error) {
	var s snapshot
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	images := filepath.Join(hot, "snapshot")
	defer func() { _ = os.RemoveAll(images) }()
	simHot, err := os.MkdirTemp(hot, "snapshot-sim-")
	if err != nil {
		return s, err
	}
	defer func() { _ = os.RemoveAll(simHot) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return s, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	url := fmt.Sprintf("http://127.0.0.1:%d", port)

	exe, err := os.Executable()
	if err != nil {
		return s, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d:%s", snapshotHelperEnv, port, n, simHot))
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return s, err
	}
	defer func() { _ = devnull.Close() }()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // criu needs the session leader in the snapshot's pid namespace
	if err := cmd.Start(); err != nil {
		return s, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := waitServing(ctx, url); err != nil {
		return s, fmt.Errorf("the simulator to snapshot: %w", err)
	}
	if _, err := firstToken(url); err != nil {
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
	defer killAndWait(s.restore.PID)
	if err := waitServing(ctx, url); err != nil {
		return s, fmt.Errorf("the restored simulator: %w", err)
	}
	t := time.Now()
	resp, err := http.Post(url+"/sleep?level=1", "", nil)
	if err != nil {
		return s, err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("the restored simulator's level-1 sleep: %s", resp.Status)
	}
	rep, err := wake(url)
	if err != nil {
		return s, fmt.Errorf("the restored simulator's wake: %w", err)
	}
	s.verify = time.Since(t)
	if rep.Bytes != n { // wake fails an unverified wake
		return s, fmt.Errorf("the restored simulator's wake verified %d of %d bytes", rep.Bytes, n)
	}
	return s, nil
}

// waitServing waits until the simulator at url answers.
func waitServing(ctx context.Context, url string) error {
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /health: %s", resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not serving on %s: %w", url, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// killAndWait kills the restored process (criu's, not a child of ours) and
// waits until it is gone, so its memory is free before the next run.
func killAndWait(pid int) {
	if syscall.Kill(pid, syscall.SIGKILL) != nil {
		return
	}
	for range 500 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
