// Package gctune sets the garbage collector of the data-plane binaries
// (orchestra-gateway, orchestra-dispatcher, orchestra-sim) and of
// make bench-dataplane, which measures them, the same way.
package gctune

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Percent is the data plane's GOGC. Their live heaps are small and they
// allocate per request, so the default 100 spends about a tenth of the CPU
// on collections; 400 collects a quarter as often. docs/dispatcher.md
// ("Garbage collector") has the measurements.
const Percent = 400

// cgroupLimitFiles hold the container's memory limit (cgroup v2, then v1).
var cgroupLimitFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// Apply sets GOGC to Percent and a soft memory limit of 80% of the
// container's (cgroup) memory limit, so that the larger heap target
// collects harder instead of running out of memory. GOGC and GOMEMLIMIT in
// the environment win over both.
func Apply() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	if limit, ok := softLimit(cgroupLimitFiles); ok {
		debug.SetMemoryLimit(limit)
	}
}

// softLimit is 80% of the memory limit in the first readable file of
// files; false when there is none or it says "no limit" ("max", or the
// huge value of cgroup v1).
func softLimit(files []string) (int64, bool) {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || limit <= 0 || limit >= 1<<50 {
			return 0, false
		}
		return limit / 10 * 8, true
	}
	return 0, false
}
