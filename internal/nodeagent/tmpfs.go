package nodeagent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// HotTierHugePages is the tmpfs huge= option the node agent mounts the hot
// tier with: files are backed by 2 MiB pages where they span them, so
// reading a copy back walks 512 times fewer pages than with the default
// 4 KiB shmem pages, and the pages a consumed level-1 offload frees are the
// 2 MiB blocks the woken arena faults in next.
const HotTierHugePages = "within_size"

// MountHotTier mounts a tmpfs of size bytes with huge=within_size and mode
// 0700 at dir, unless dir already is a mount point (then it is used as it
// is, and HugePagesOf reports its option). It needs CAP_SYS_ADMIN in the
// host's mount namespace; without it the error says so and the agent keeps
// the directory as it is.
func MountHotTier(dir string, size int64) (mounted bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("creating the hot tier directory: %w", err)
	}
	if isMountPoint(dir) {
		return false, nil
	}
	opts := fmt.Sprintf("size=%d,huge=%s,mode=0700", size, HotTierHugePages)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		if errors.Is(err, unix.EPERM) {
			return false, fmt.Errorf("mounting a tmpfs (%s) at %s: %w: the node role needs CAP_SYS_ADMIN to mount the hot tier; mount it on the node instead, or leave --mount-hot-tier off", opts, dir, err)
		}
		return false, fmt.Errorf("mounting a tmpfs (%s) at %s: %w", opts, dir, err)
	}
	return true, nil
}

// isMountPoint is true when dir is the root of a mount.
func isMountPoint(dir string) bool {
	m, ok := mountOf(dir)
	return ok && m.point == filepath.Clean(dir)
}

type mountInfo struct {
	point, fstype, superOpts string
}

// mountOf finds the mount holding path in /proc/self/mountinfo: the
// longest mount point that is a prefix of path.
func mountOf(path string) (mountInfo, bool) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return mountInfo{}, false
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountInfo{}, false
	}
	defer func() { _ = f.Close() }()
	var best mountInfo
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok := parseMountInfo(sc.Text())
		if !ok || !within(abs, m.point) {
			continue
		}
		if !found || len(m.point) >= len(best.point) {
			best, found = m, true
		}
	}
	return best, found
}

// parseMountInfo reads one line of /proc/self/mountinfo:
// id parent major:minor root mountpoint opts [optional...] - fstype source superopts.
func parseMountInfo(line string) (mountInfo, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 5 || sep < 0 || sep+3 >= len(fields) {
		return mountInfo{}, false
	}
	return mountInfo{point: unescapeMount(fields[4]), fstype: fields[sep+1], superOpts: fields[sep+3]}, true
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func within(path, dir string) bool {
	if dir == "/" {
		return true
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// HugePagesOf is the huge= option of the tmpfs holding path ("never" for a
// tmpfs without it; "" when path is not on a tmpfs).
func HugePagesOf(path string) string {
	m, ok := mountOf(path)
	if !ok || m.fstype != "tmpfs" {
		return ""
	}
	for _, o := range strings.Split(m.superOpts, ",") {
		if v, ok := strings.CutPrefix(o, "huge="); ok {
			return v
		}
	}
	return "never"
}
