package nodeagent

import (
	"github.com/model-orchestra/operator/api/v1alpha1"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"testing"
)

func TestParseMountInfo(t *testing.T) {
	for line, want := range map[string]mountInfo{
		"36 35 0:33 / /dev/shm rw,relatime shared:5 - tmpfs tmpfs rw,size=24684092k":                        {"/dev/shm", "tmpfs", "rw,size=24684092k"},
		"99 30 0:51 / /mnt/hot\\040tier rw,nosuid - tmpfs tmpfs rw,size=8388608k,mode=700,huge=within_size": {"/mnt/hot tier", "tmpfs", "rw,size=8388608k,mode=700,huge=within_size"},
		"1 0 252:0 / / rw - ext4 /dev/vda rw,discard":                                                       {"/", "ext4", "rw,discard"},
	} {
		got, ok := parseMountInfo(line)
		if !ok || got != want {
			t.Errorf("parseMountInfo(%q) = %+v, %v; want %+v", line, got, ok, want)
		}
	}
	if _, ok := parseMountInfo("garbage"); ok {
		t.Error("parsed garbage")
	}
}

// MountHotTier mounts a huge-page tmpfs that HugePagesOf and the report
// see; where the test cannot mount (not root), it checks the error says
// what is missing.
func TestMountHotTier(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hot")
	mounted, err := MountHotTier(dir, 16<<20)
	if os.Geteuid() != 0 {
		if err == nil {
			t.Fatal("a non-root mount succeeded")
		}
		t.Skipf("not root: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if !mounted {
		t.Fatal("a fresh directory was not mounted")
	}
	if got := HugePagesOf(filepath.Join(dir, "team-a")); got != HotTierHugePages {
		t.Errorf("HugePagesOf = %q, want %q", got, HotTierHugePages)
	}
	if r := tierReport(dir, v1alpha1.TierHot, 1<<20, 0, 0); r.Filesystem != "tmpfs" || r.HugePages != HotTierHugePages || r.Warning != "" {
		t.Errorf("report %+v", r)
	}
	// A second call finds the mount point and leaves it.
	if again, err := MountHotTier(dir, 16<<20); err != nil || again {
		t.Errorf("second mount: %v %v", again, err)
	}
	if got := HugePagesOf(t.TempDir()); got == HotTierHugePages {
		t.Errorf("a directory off the mount reports %q", got)
	}
}
