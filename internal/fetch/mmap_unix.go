//go:build linux || darwin || freebsd

package fetch

import (
	"errors"
	"os"
	"runtime/debug"
	"syscall"
)

// mapWindow bounds how much of a file is mapped at once.
const mapWindow = 64 << 20

// hashMapped feeds [start, end) of f to write straight from the page cache
// through a read-only memory map, a window at a time, and returns how far
// it got. It fails with errNoMap when a window cannot be mapped (the rest
// can be read instead). A page that cannot be read (an I/O error, the file
// truncated by someone else) faults; that fault becomes an error instead
// of killing the process.
func hashMapped(f *os.File, start, end int64, write func([]byte)) (int64, error) {
	page := int64(os.Getpagesize())
	for off := start; off < end; {
		base := off &^ (page - 1)
		n := min(end-base, mapWindow)
		if err := hashWindow(f, base, int(n), int(off-base), write); err != nil {
			return off, err
		}
		off = base + n
	}
	return end, nil
}

func hashWindow(f *os.File, base int64, n, skip int, write func([]byte)) (err error) {
	m, err := syscall.Mmap(int(f.Fd()), base, n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return errNoMap
	}
	defer func() { _ = syscall.Munmap(m) }() // unmapping a mapping we made cannot fail
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			err = errors.New("memory fault reading the mapped file (I/O error, or the file was truncated)")
		}
	}()
	write(m[skip:])
	return nil
}
