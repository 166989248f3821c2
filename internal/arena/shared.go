package arena

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A shared device is one pool of device memory for several processes, the
// engine containers of a seat-group pod: a file on a memory-backed
// directory (an emptyDir with medium Memory), whose byte ranges are the
// regions. Beside it, in the same directory:
//
//   - <file>.lock, locked (flock) by whoever reads or changes the table;
//   - <file>.table, the regions held: offset, size, owner (JSON, replaced
//     whole by a rename, so a crash never leaves half a table).
//
// A process holding a region also holds an open-file-description lock
// (F_OFD_SETLK) on the region's bytes of the device file. The kernel drops
// that lock when the process exits, however it exits, so an entry of the
// table whose bytes nobody locks is a region of a process that died: the
// next allocation drops it. A crash cannot leak the pool.
//
// Regions are fallocated when first used and never punched out: once
// allocated, their pages stay in the file (on the device) across frees,
// and the next holder, in any container of the pod, maps pages that are
// already there. The pages are charged to the memory of the container that
// first touched them.
type sharedPool struct {
	path     string
	capacity int64 // 0: no limit, the file grows
	owner    string
	id       string

	file  *os.File // the device file; this process's region locks are on it
	probe *os.File // a second open file description, to test others' locks
	lock  *os.File // <file>.lock

	regions map[*Arena]tableEntry
}

// tableEntry is one region held, as the table file stores it.
type tableEntry struct {
	Off   int64  `json:"off"`
	Size  int64  `json:"size"`
	Owner string `json:"owner"`
	ID    string `json:"id"`
}

// Region is a region of a shared device and who holds it.
type Region struct {
	Off, Size int64
	Owner     string
}

// OpenSharedDevice opens (creating it if needed) the device file at path,
// shared by every process that opens it, with capacity bytes (0: no limit).
// owner names this process's regions in errors and in Regions (for
// example the engine's model). The capacity is the file's: the first
// opener sets it, and a later opener asking for another fails. Its regions
// are in the pages of the file's filesystem (huge where a tmpfs is mounted
// with huge=), not the huge pages a process's own Device asks for.
func OpenSharedDevice(path string, capacity int64, owner string) (*Device, error) {
	if capacity < 0 {
		return nil, fmt.Errorf("device capacity must not be negative, got %d", capacity)
	}
	capacity = pageRound(capacity)
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	p := &sharedPool{path: path, capacity: capacity, owner: owner, id: hex.EncodeToString(idb[:]), regions: map[*Arena]tableEntry{}}
	var err error
	if p.lock, err = os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("opening the device's lock: %w", err)
	}
	if p.file, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		p.close()
		return nil, fmt.Errorf("opening the device file: %w", err)
	}
	if p.probe, err = os.Open(path); err != nil {
		p.close()
		return nil, fmt.Errorf("opening the device file: %w", err)
	}
	err = p.locked(func(t []tableEntry) ([]tableEntry, error) {
		fi, err := p.file.Stat()
		if err != nil {
			return nil, err
		}
		switch {
		case fi.Size() == 0 && capacity > 0:
			return t, p.file.Truncate(capacity)
		case capacity > 0 && fi.Size() != capacity:
			return nil, fmt.Errorf("device file %s holds %s, not the %s asked for", path, Size(fi.Size()), Size(capacity))
		}
		return t, nil
	})
	if err != nil {
		p.close()
		return nil, err
	}
	return &Device{capacity: capacity, held: map[*Arena]*Arena{}, shared: p}, nil
}

func (p *sharedPool) close() {
	for _, f := range []*os.File{p.lock, p.file, p.probe} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// locked runs change on the table under the pool's lock, with the regions
// of dead processes dropped, and writes the table it returns (when it
// differs).
func (p *sharedPool) locked(change func([]tableEntry) ([]tableEntry, error)) error {
	if err := unix.Flock(int(p.lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking the device: %w", err)
	}
	defer func() { _ = unix.Flock(int(p.lock.Fd()), unix.LOCK_UN) }()
	t, err := p.readTable()
	if err != nil {
		return err
	}
	live := slices.DeleteFunc(slices.Clone(t), func(e tableEntry) bool { return !p.heldByAnyone(e) })
	next, err := change(slices.Clone(live))
	if err != nil {
		return err
	}
	if slices.Equal(next, t) {
		return nil
	}
	return p.writeTable(next)
}

// heldByAnyone is true while some process holds e's lock.
func (p *sharedPool) heldByAnyone(e tableEntry) bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: e.Off, Len: e.Size}
	if err := unix.FcntlFlock(p.probe.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return true // cannot tell: keep it
	}
	return lk.Type != unix.F_UNLCK
}

func (p *sharedPool) readTable() ([]tableEntry, error) {
	b, err := os.ReadFile(p.path + ".table")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the device's table: %w", err)
	}
	var t []tableEntry
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("reading the device's table %s: %w", p.path+".table", err)
	}
	return t, nil
}

func (p *sharedPool) writeTable(t []tableEntry) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	tmp := p.path + ".table." + p.id
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the device's table: %w", err)
	}
	if err := os.Rename(tmp, p.path+".table"); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing the device's table: %w", err)
	}
	return nil
}

// place finds the lowest offset where size bytes fit between the regions
// of t (sorted by offset here), within capacity (0: no limit).
func place(t []tableEntry, size, capacity int64) (int64, bool) {
	slices.SortFunc(t, func(a, b tableEntry) int { return cmp.Compare(a.Off, b.Off) })
	var at int64
	for _, e := range t {
		if e.Off-at >= size {
			return at, true
		}
		at = max(at, e.Off+e.Size)
	}
	if capacity == 0 || capacity-at >= size {
		return at, true
	}
	return 0, false
}

// exhausted explains a failed allocation: what was asked, what is free and
// who holds the rest.
func exhausted(t []tableEntry, n, capacity int64) error {
	var held int64
	by := map[string]int64{}
	var owners []string
	for _, e := range t {
		held += e.Size
		if _, ok := by[e.Owner]; !ok {
			owners = append(owners, e.Owner)
		}
		by[e.Owner] += e.Size
	}
	slices.Sort(owners)
	parts := make([]string, len(owners))
	for i, o := range owners {
		parts[i] = fmt.Sprintf("%s (%s)", o, Size(by[o]))
	}
	holders := "nobody"
	if len(parts) > 0 {
		holders = strings.Join(parts, ", ")
	}
	return fmt.Errorf("%w: need %s, free %s of %s, held by %s", ErrDeviceFull, Size(n), Size(capacity-held), Size(capacity), holders)
}

// alloc takes a region of n bytes for d. The caller holds d.mu.
func (p *sharedPool) alloc(d *Device, n int64) (*Arena, error) {
	size := pageRound(n)
	if size == 0 {
		return &Arena{}, nil
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("arena of %d bytes does not fit the address space", n)
	}
	var e tableEntry
	err := p.locked(func(t []tableEntry) ([]tableEntry, error) {
		off, ok := place(t, size, p.capacity)
		if !ok {
			return nil, exhausted(t, n, p.capacity)
		}
		// Allocate the pages now, so a full tmpfs is an error here
		// rather than a SIGBUS in the copy.
		if err := unix.Fallocate(int(p.file.Fd()), 0, off, size); err != nil {
			return nil, fmt.Errorf("allocating %s of the device file at %d: %w", Size(size), off, err)
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: size}
		if err := unix.FcntlFlock(p.file.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			return nil, fmt.Errorf("locking the device region at %d: %w", off, err)
		}
		e = tableEntry{Off: off, Size: size, Owner: p.owner, ID: p.id}
		return append(t, e), nil
	})
	if err != nil {
		return nil, err
	}
	b, err := unix.Mmap(int(p.file.Fd()), e.Off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err == nil {
		if err = populate(b); err != nil {
			_ = unix.Munmap(b)
		}
	}
	if err != nil {
		p.drop(e)
		return nil, fmt.Errorf("mapping %s of the device: %w", Size(size), err)
	}
	a := &Arena{full: b, n: n, faulted: true, dev: d}
	p.regions[a] = e
	d.mapped += size
	return a, nil
}

// release gives a's region back to the pool. The caller holds d.mu.
func (p *sharedPool) release(d *Device, a *Arena) {
	e, ok := p.regions[a]
	if !ok {
		return
	}
	delete(p.regions, a)
	_ = unix.Munmap(a.full)
	d.mapped -= e.Size
	p.drop(e)
}

// drop removes e from the table and unlocks its bytes.
func (p *sharedPool) drop(e tableEntry) {
	_ = p.locked(func(t []tableEntry) ([]tableEntry, error) {
		return slices.DeleteFunc(t, func(x tableEntry) bool { return x.ID == e.ID && x.Off == e.Off }), nil
	})
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: e.Off, Len: e.Size}
	_ = unix.FcntlFlock(p.file.Fd(), unix.F_OFD_SETLK, &lk)
}

// Regions lists the regions of a shared device that live processes hold,
// by offset; nil for a device of one process.
func (d *Device) Regions() ([]Region, error) {
	if d.shared == nil {
		return nil, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Region
	err := d.shared.locked(func(t []tableEntry) ([]tableEntry, error) {
		slices.SortFunc(t, func(a, b tableEntry) int { return cmp.Compare(a.Off, b.Off) })
		for _, e := range t {
			out = append(out, Region{Off: e.Off, Size: e.Size, Owner: e.Owner})
		}
		return t, nil
	})
	return out, err
}

// Close gives back every region this process holds and closes the device
// file. Arenas of the device must not be used afterwards. Closing a
// device of one process unmaps its free regions.
func (d *Device) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shared == nil {
		d.trimLocked(d.mapped)
		return
	}
	for a := range d.shared.regions {
		d.shared.release(d, a)
		a.full, a.n = nil, 0
	}
	d.shared.close()
}
