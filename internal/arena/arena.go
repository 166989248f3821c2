// Package arena moves model weights between memory and files at the speed of
// the bytes, and verifies every byte it moves.
//
// An Arena is anonymous memory outside the Go heap (mmap), so Free really
// returns the memory to the kernel (the Go heap would keep it). Its page size
// follows how it is used (Options.Pages). Memory faulted in once and kept (a
// Device's regions, which stand in for an accelerator's memory, and the
// destinations a benchmark measures against) is in transparent huge pages:
// each 2 MiB is physically contiguous, so an O_DIRECT read lands in requests
// as large as the disk takes (4 KiB pages scattered by earlier use cap a
// request at the device's segment count, 254 pages, about 1 MiB on a virtio
// disk) and a copy walks one page table entry per 2 MiB. Memory faulted in
// for one wake and returned at the next sleep is in huge pages too, except in
// a virtual machine whose balloon reports free pages to the host: there the
// free 2 MiB blocks a huge page needs are the ones the guest has handed back,
// and each costs the host's faults again, so 4 KiB pages, taken from blocks
// the host never saw, fault in several times faster. An arena is either
// pre-faulted when it is made, or faulted block by block by the fill that
// writes it, so getting the memory overlaps reading into it. A Device keeps
// regions of such memory faulted in across sleeps, as an accelerator keeps
// its memory. FillFile copies a file into an arena from several workers, out
// of a populated mapping where the file is in huge pages and with pread(2) or
// O_DIRECT otherwise, each worker hashing every 1 MiB chunk it moves while
// the chunk is in its core (in the arena's cache lines after a read, in
// registers as it copies out of the mapping), so every restored byte is
// verified as it lands.
package arena

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// Arena is a block of anonymous memory. It is not safe for concurrent Free.
type Arena struct {
	full []byte // page-rounded mapping
	n    int64
	// faulted is true once every page has been faulted in (New without
	// NoPopulate, or a fill that touched every block).
	faulted bool
	// dev, when set, is the Device whose region this arena is: Free gives
	// the region back to it.
	dev *Device
}

// pageRound rounds n up to a multiple of the page size.
func pageRound(n int64) int64 {
	p := int64(os.Getpagesize())
	return (n + p - 1) &^ (p - 1)
}

// Pages chooses an arena's page size.
type Pages int

const (
	// PagesAuto asks for huge pages unless FreePageReporting: for memory
	// faulted in for one use and returned after it.
	PagesAuto Pages = iota
	// PagesSmall never asks for huge pages: small buffers, reused.
	PagesSmall
	// PagesHuge always asks for huge pages (MADV_HUGEPAGE, best effort):
	// memory faulted in once and kept while many reads and copies land in
	// it. Where the balloon reports free pages the fault costs several
	// times more, once.
	PagesHuge
)

// Options tune how an arena is allocated.
type Options struct {
	// Pages is the page size the arena asks for.
	Pages Pages
	// NoPopulate skips pre-faulting: FillFile then faults each block just
	// before it reads into it, on the worker that reads it, and counts the
	// faults in the copy time.
	NoPopulate bool
}

// New maps n bytes of zeroed anonymous memory. Huge pages and pre-faulting
// are best effort: a kernel without them still gets a working arena.
func New(n int64, opts Options) (*Arena, error) {
	if n < 0 {
		return nil, fmt.Errorf("arena size must not be negative, got %d", n)
	}
	if n == 0 {
		return &Arena{}, nil
	}
	size := pageRound(n)
	if int64(int(size)) != size {
		return nil, fmt.Errorf("arena of %d bytes does not fit the address space", n)
	}
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mapping a %d-byte arena: %w", n, err)
	}
	if opts.Pages == PagesHuge || (opts.Pages == PagesAuto && !FreePageReporting()) {
		_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advisory; THP may be off
	}
	a := &Arena{full: b, n: n}
	if !opts.NoPopulate {
		if err := populate(b); err != nil {
			_ = unix.Munmap(b)
			return nil, fmt.Errorf("pre-faulting a %d-byte arena: %w", n, err)
		}
		a.faulted = true
	}
	return a, nil
}

// populate faults b's pages in for writing.
func populate(b []byte) error {
	err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 5.14 lack it: touch one byte per page instead.
		p := os.Getpagesize()
		for i := 0; i < len(b); i += p {
			b[i] = 0
		}
		return nil
	}
	return err
}

// Bytes returns the arena's n bytes (none for a nil arena).
func (a *Arena) Bytes() []byte {
	if a == nil {
		return nil
	}
	return a.full[:a.n]
}

// Len is the arena's size in bytes (0 for a nil arena).
func (a *Arena) Len() int64 {
	if a == nil {
		return 0
	}
	return a.n
}

// Free unmaps the arena, or gives it back to its Device; its bytes must not
// be used afterwards. Freeing a nil or freed arena does nothing.
func (a *Arena) Free() {
	if a == nil || a.full == nil {
		return
	}
	if a.dev != nil {
		a.dev.release(a)
	} else {
		_ = unix.Munmap(a.full) // unmapping a mapping we made cannot fail
	}
	a.full, a.n = nil, 0
}

var freePageReporting = sync.OnceValue(func() bool {
	features, _ := filepath.Glob("/sys/bus/virtio/drivers/virtio_balloon/virtio*/features")
	for _, f := range features {
		// VIRTIO_BALLOON_F_REPORTING is feature bit 5; the file lists
		// the bits as characters, bit 0 first.
		if b, err := os.ReadFile(f); err == nil && len(b) > 5 && b[5] == '1' {
			return true
		}
	}
	return false
})

// FreePageReporting is true in a virtual machine whose virtio balloon
// reports free memory to the host (VIRTIO_BALLOON_F_REPORTING): free blocks
// of 2 MiB and more go back to the host about two seconds after they are
// freed, and faulting them in again costs a host fault per page.
func FreePageReporting() bool { return freePageReporting() }
