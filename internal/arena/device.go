package arena

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// ErrDeviceFull is returned when a Device has no room for an allocation.
var ErrDeviceFull = errors.New("device memory exhausted")

// Device is memory that, once faulted in, stays with the process, as an
// accelerator's memory stays on the device. An engine's weights are a
// region of it; releasing the region (Arena.Free) gives it back to the
// device, not to the kernel, and the next allocation that fits gets it
// back already faulted in. That is what a GPU does with vLLM's sleep: the
// CUDA allocator unmaps the weights' memory, but the memory stays on the
// device, where the wake (or another engine on the same GPU) maps it
// again, and the host never takes it back. A restore into a region then
// pays the copy and the hash, not the kernel's (or, in a VM, the host's)
// faults. Regions are pre-faulted when first mapped, in huge pages, as an
// accelerator maps its memory in large pages: the slower fault is paid once,
// at load, and every restore into the region gains (an O_DIRECT read lands
// in the disk's largest requests, a copy in one page table entry per 2 MiB).
// A Device is safe for concurrent use.
type Device struct {
	capacity int64

	mu     sync.Mutex
	mapped int64             // bytes of all regions, held or free
	free   []*Arena          // regions released and not unmapped
	held   map[*Arena]*Arena // handed-out arena → its region

	// shared, when set, is the pool of several processes this device is
	// (OpenSharedDevice); free, held and the capacity check are then the
	// pool's.
	shared *sharedPool
}

// NewDevice returns a device of capacity bytes (0: no limit; regions are
// mapped as allocations need them and kept).
func NewDevice(capacity int64) *Device {
	return &Device{capacity: capacity, held: map[*Arena]*Arena{}}
}

// Alloc returns an arena of n bytes backed by a region of the device: the
// smallest free region that fits, else a new region, mapped and pre-faulted
// now. When a new region would exceed the capacity, free regions are
// unmapped first; when it still does not fit, Alloc fails with
// ErrDeviceFull. The arena's bytes are whatever the region last held.
func (d *Device) Alloc(n int64) (*Arena, error) {
	if n < 0 {
		return nil, fmt.Errorf("arena size must not be negative, got %d", n)
	}
	size := pageRound(n)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shared != nil {
		return d.shared.alloc(d, n)
	}
	best := -1
	for i, r := range d.free {
		if int64(len(r.full)) >= size && (best < 0 || len(r.full) < len(d.free[best].full)) {
			best = i
		}
	}
	var region *Arena
	if best >= 0 {
		region = d.free[best]
		d.free = slices.Delete(d.free, best, best+1)
	} else {
		if d.capacity > 0 && d.mapped+size > d.capacity {
			d.trimLocked(d.mapped + size - d.capacity)
		}
		if d.capacity > 0 && d.mapped+size > d.capacity {
			return nil, fmt.Errorf("%w: %d bytes wanted, %d of %d held", ErrDeviceFull, n, d.mapped, d.capacity)
		}
		var err error
		if region, err = New(size, Options{Pages: PagesHuge}); err != nil {
			return nil, err
		}
		d.mapped += size
	}
	a := &Arena{full: region.full, n: n, faulted: true, dev: d}
	d.held[a] = region
	return a, nil
}

// release gives a's region back to the device.
func (d *Device) release(a *Arena) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shared != nil {
		d.shared.release(d, a)
		return
	}
	if r, ok := d.held[a]; ok {
		delete(d.held, a)
		d.free = append(d.free, r)
	}
}

// trimLocked unmaps free regions, largest first, until want bytes are
// unmapped or none is left.
func (d *Device) trimLocked(want int64) {
	slices.SortFunc(d.free, func(a, b *Arena) int { return len(b.full) - len(a.full) })
	for want > 0 && len(d.free) > 0 {
		r := d.free[0]
		d.free = d.free[1:]
		want -= int64(len(r.full))
		d.mapped -= int64(len(r.full))
		r.Free()
	}
}

// Trim unmaps every free region, returning its memory to the kernel. A
// shared device keeps its free regions in its file: Trim does nothing.
func (d *Device) Trim() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.trimLocked(d.mapped)
}

// Usage reports the bytes of the device's regions: held by arenas, and
// mapped in all (held and free). For a shared device, both are this
// process's regions (see Regions for the whole pool).
func (d *Device) Usage() (held, mapped int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.held {
		held += int64(len(r.full))
	}
	if d.shared != nil {
		held = d.mapped // a shared device maps only the regions held
	}
	return held, d.mapped
}
