package arena

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const mib = 1 << 20

func openShared(t *testing.T, path string, capacity int64, owner string) *Device {
	t.Helper()
	d, err := OpenSharedDevice(path, capacity, owner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// Two engines (two openings of one device file, as two containers open it)
// share its capacity: what one frees, the other gets, with the bytes the
// first left in it (the pages stay on the device).
func TestSharedDeviceOnePoolForTwoEngines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device")
	a := openShared(t, path, 2*mib, "alpha")
	b := openShared(t, path, 2*mib, "beta")

	wa, err := a.Alloc(mib)
	if err != nil {
		t.Fatal(err)
	}
	copy(wa.Bytes(), "alpha's weights")
	wb, err := b.Alloc(mib)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Alloc(mib)
	if !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("a third MiB of a 2 MiB device: err = %v, want ErrDeviceFull", err)
	}
	if want := "device memory exhausted: need 1MiB, free 0 of 2MiB, held by alpha (1MiB), beta (1MiB)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	regions, err := a.Regions()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Region{{0, mib, "alpha"}, {mib, mib, "beta"}}, regions); diff != "" {
		t.Errorf("regions (-want +got):\n%s", diff)
	}

	wa.Free() // alpha sleeps
	again, err := b.Alloc(mib)
	if err != nil {
		t.Fatalf("beta's wake after alpha's sleep: %v", err)
	}
	if got := string(again.Bytes()[:15]); got != "alpha's weights" {
		t.Errorf("the freed region holds %q, want the bytes alpha left (the same device pages)", got)
	}
	if held, _ := b.Usage(); held != 2*mib {
		t.Errorf("beta holds %d bytes, want %d", held, 2*mib)
	}
	wb.Free()
	again.Free()
	if regions, _ := a.Regions(); len(regions) != 0 {
		t.Errorf("after every free the device holds %v, want nothing", regions)
	}
}

func TestSharedDeviceKeepsItsCapacity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device")
	openShared(t, path, 2*mib, "alpha")
	if _, err := OpenSharedDevice(path, 4*mib, "beta"); err == nil || !strings.Contains(err.Error(), "not the 4MiB asked for") {
		t.Errorf("opening a 2 MiB device as 4 MiB: err = %v, want a capacity mismatch", err)
	}
}

// A device with no capacity grows its file as regions are taken.
func TestSharedDeviceWithoutCapacity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device")
	d := openShared(t, path, 0, "alpha")
	for range 3 {
		if _, err := d.Alloc(mib); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 3*mib {
		t.Errorf("device file after 3 MiB: %v, %v; want 3 MiB", fi, err)
	}
}

// Close gives back what an engine holds, as an engine's restart does.
func TestSharedDeviceCloseFreesRegions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device")
	a, err := OpenSharedDevice(path, mib, "delta")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(mib); err != nil {
		t.Fatal(err)
	}
	b := openShared(t, path, mib, "alpha")
	if _, err := b.Alloc(mib); !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("err = %v, want ErrDeviceFull while delta holds the device", err)
	}
	a.Close()
	if _, err := b.Alloc(mib); err != nil {
		t.Fatalf("after delta closed its device: %v", err)
	}
}

// A process that dies holding a region (killed, no cleanup) does not leak
// it: its lock goes with it, and the next allocation drops its entry.
func TestSharedDeviceProcessDeathFreesItsRegion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "device")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedDeviceHelperProcess$")
	cmd.Env = append(os.Environ(), "ARENA_SHARED_DEVICE="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "held" {
		_ = cmd.Process.Kill()
		t.Fatalf("helper process: %q, %v", line, err)
	}
	d := openShared(t, path, 2*mib, "alpha")
	if _, err := d.Alloc(2 * mib); err == nil || !strings.Contains(err.Error(), "held by crasher (1MiB)") {
		t.Errorf("while the helper holds 1 MiB: err = %v, want the device exhausted, held by crasher", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := d.Alloc(2 * mib); err != nil {
		t.Fatalf("after the helper was killed: %v; want its region back", err)
	}
}

// TestSharedDeviceHelperProcess is the process killed by
// TestSharedDeviceProcessDeathFreesItsRegion; it does nothing otherwise.
func TestSharedDeviceHelperProcess(*testing.T) {
	path := os.Getenv("ARENA_SHARED_DEVICE")
	if path == "" {
		return
	}
	d, err := OpenSharedDevice(path, 2*mib, "crasher")
	if err == nil {
		_, err = d.Alloc(mib)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("held")
	select {}
}

func TestPlace(t *testing.T) {
	tests := []struct {
		name           string
		held           []tableEntry
		size, capacity int64
		want           int64
		fits           bool
	}{
		{"empty", nil, 4, 8, 0, true},
		{"too big", nil, 9, 8, 0, false},
		{"after the last", []tableEntry{{Off: 0, Size: 4}}, 4, 8, 4, true},
		{"in a gap", []tableEntry{{Off: 0, Size: 2}, {Off: 6, Size: 2}}, 4, 8, 2, true},
		{"gap too small, tail too small", []tableEntry{{Off: 0, Size: 2}, {Off: 5, Size: 2}}, 4, 8, 0, false},
		{"unsorted", []tableEntry{{Off: 6, Size: 2}, {Off: 0, Size: 2}}, 4, 8, 2, true},
		{"no capacity grows", []tableEntry{{Off: 0, Size: 8}}, 4, 0, 8, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fits := place(tt.held, tt.size, tt.capacity)
			if fits != tt.fits || (fits && got != tt.want) {
				t.Errorf("place = %d, %v; want %d, %v", got, fits, tt.want, tt.fits)
			}
		})
	}
}
