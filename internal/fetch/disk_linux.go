package fetch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// freeBytes returns the bytes an unprivileged user may still write on the
// filesystem holding dir.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil //nolint:unconvert // Bsize is int32 on 386
}

// allocatedBytes is how much disk the file at p already occupies.
func allocatedBytes(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// reserve allocates size bytes for f so that the download cannot run out of
// space half way. Filesystems without fallocate get a sparse file instead.
func reserve(f *os.File, size int64) error {
	if size == 0 {
		return nil
	}
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return err
	}
	return f.Truncate(size)
}

// lockDir takes an exclusive advisory lock on <dir>/lock, waiting (and
// calling wait once) while another fetcher holds it. The returned function
// releases it.
func lockDir(ctx context.Context, dir string, wait func()) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	waited := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				// Closing the descriptor releases the lock anyway; the file is
				// never written, so neither error matters.
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close() // lock file is never written
			if errors.Is(err, syscall.ENOLCK) || errors.Is(err, syscall.ENOTSUP) {
				return func() {}, nil // filesystem without locks: proceed unlocked
			}
			return nil, err
		}
		if !waited {
			wait()
			waited = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close() // lock file is never written
			return nil, ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

var lockPoll = 500 * time.Millisecond

// startWriteback asks the kernel to start writing [off, off+n) of f to
// disk without waiting for it. Best effort: an fsync follows anyway.
func startWriteback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
