package localcluster

// Tear-down of the real node: stopping its processes, then undoing every
// change to the host that the owner record lists, in an order that works
// whether the cluster stopped cleanly or crashed. Someone who debugs a
// machine left dirty starts here.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// componentBinaries are the executables whose processes teardown may kill
// when their command line names the cluster's work directory.
var componentBinaries = map[string]bool{
	"etcd": true, "kube-apiserver": true, "kube-controller-manager": true, "kube-scheduler": true,
	"kwok": true, "kubelet": true, "kube-proxy": true, "coredns": true,
	"containerd": true, "containerd-shim-runc-v2": true, "containerd-shim": true, "devcluster": true,
}

// stop ends the node side: DNS, kube-proxy and kubelet, then the pods (by
// cgroup) and containerd. Shims are reaped by cleanupHost. The control plane is stopped by the caller.
func (n *realNode) stop(c *Cluster, procs []*process) error {
	for _, name := range []string{"coredns", "kube-proxy", "kubelet"} {
		for _, p := range procs {
			if p.Name == name {
				p.stop(stopGrace)
			}
		}
	}
	killPods()
	for _, p := range procs {
		if p.Name == "containerd" {
			p.stop(stopGrace)
		}
	}
	return nil
}

// cleanupHost undoes the host changes and removes the owner record.
func (n *realNode) cleanupHost(workDir string) error {
	if n.owner.WorkDir == "" {
		n.owner.WorkDir = workDir
	}
	if err := cleanupOwner(n.owner); err != nil {
		return err
	}
	return nil
}

// release drops the machine-wide lock.
func (n *realNode) release() {
	if n.lock != nil {
		_ = syscall.Flock(int(n.lock.Fd()), syscall.LOCK_UN)
		_ = n.lock.Close()
		n.lock = nil
	}
}

// cleanupOwner undoes what o records, in an order that works whether the
// processes were stopped cleanly or crashed: kill leftovers, unmount,
// remove network state, restore sysctls, remove paths, drop the record.
func cleanupOwner(o Owner) error {
	var errs []error
	killPods()
	if o.WorkDir != "" {
		reapProcesses(o.WorkDir)
		errs = append(errs, unmountUnder(o.WorkDir))
	}
	errs = append(errs, unmountUnder("/run/containerd"), unmountUnder("/var/lib/kubelet"))
	errs = append(errs, removeNetns())
	removeCgroups()
	errs = append(errs, cleanupIPTables())
	if link, err := net.InterfaceByName(bridgeName); err == nil && link != nil {
		if out, err := exec.Command("ip", "link", "del", bridgeName).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w: %s", bridgeName, err, out))
		}
	}
	if o.AddedAddress && hasLoopbackAddress() {
		if out, err := exec.Command("ip", "addr", "del", nodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("removing %s from lo: %w: %s", nodeIP, err, out))
		}
	}
	for key, v := range o.Sysctls {
		if cur, err := readSysctl(key); err == nil && cur != v {
			errs = append(errs, writeSysctl(key, v))
		}
	}
	for _, p := range o.CreatedPaths {
		errs = append(errs, os.RemoveAll(p))
	}
	if err := os.Remove(OwnerFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killPods kills every process in the pods' cgroups (kubelet's cgroupfs
// driver puts them under /kubepods in each hierarchy).
func killPods() {
	for round := 0; round < 10; round++ {
		found := false
		for _, root := range kubepodsCgroups() {
			_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil //nolint:nilerr // cgroups vanish while we walk; skip them
				}
				data, _ := os.ReadFile(path)
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
						found = true
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		if !found {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func kubepodsCgroups() []string {
	var roots []string
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/kubepods")
	}
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	return append(roots, matches...)
}

// removeCgroups removes the (now empty) pod cgroups, deepest first.
func removeCgroups() {
	for _, root := range kubepodsCgroups() {
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// reapProcesses kills leftover component processes (containerd shims in
// particular, which outlive containerd by design) whose command line names
// workDir. Only the cluster's own binaries are considered, so a shell or a
// kubectl that mentions the directory is left alone.
func reapProcesses(workDir string) {
	for _, pid := range ProcessesUsing(workDir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && len(ProcessesUsing(workDir)) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
}

// ProcessesUsing lists the component processes (by executable name) whose
// command line names a file inside dir, except the calling process.
func ProcessesUsing(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || !componentBinaries[filepath.Base(strings.TrimSuffix(exe, " (deleted)"))] {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		// Arguments name files inside dir; the separator keeps
		// /tmp/localcluster-1 from matching /tmp/localcluster-12.
		if strings.Contains(string(cmdline), filepath.Clean(dir)+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	prefix := filepath.Clean(dir)
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == prefix || strings.HasPrefix(mp, prefix+"/") {
			points = append(points, mp)
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount decodes the octal escapes of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeNetns removes the network namespaces the CRI made for pods.
func removeNetns() error {
	matches, _ := filepath.Glob("/run/netns/cni-*")
	var errs []error
	for _, m := range matches {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
		if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupIPTables removes the KUBE-* chains (kubelet, kube-proxy) and
// CNI-* chains (bridge, portmap) and every rule that jumps to them, for
// IPv4 and IPv6.
func cleanupIPTables() error {
	var errs []error
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(ipt); err != nil {
			continue
		}
		for _, table := range []string{"nat", "filter", "mangle", "raw"} {
			errs = append(errs, cleanupTable(ipt, table))
		}
	}
	return errors.Join(errs...)
}

func isOwnChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// OwnIPTablesChains lists the KUBE-*/CNI-* chains left in the given
// iptables binary's tables, as "table/chain".
func OwnIPTablesChains(ipt string) []string {
	var out []string
	for _, table := range []string{"nat", "filter", "mangle", "raw"} {
		rules, err := exec.Command(ipt, "-w", "-t", table, "-S").Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(rules), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "-N" && isOwnChain(f[1]) {
				out = append(out, table+"/"+f[1])
			}
		}
	}
	return out
}

func cleanupTable(ipt, table string) error {
	out, err := exec.Command(ipt, "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil //nolint:nilerr // the table does not exist here: nothing to clean
	}
	var chains []string
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		args := splitRule(line)
		if len(args) < 2 {
			continue
		}
		switch args[0] {
		case "-N":
			if isOwnChain(args[1]) {
				chains = append(chains, args[1])
			}
		case "-A":
			if isOwnChain(args[1]) {
				continue // goes with the chain
			}
			for i := 2; i+1 < len(args); i++ {
				if (args[i] == "-j" || args[i] == "-g") && isOwnChain(args[i+1]) {
					del := append([]string{"-w", "-t", table, "-D"}, args[1:]...)
					if out, err := exec.Command(ipt, del...).CombinedOutput(); err != nil {
						errs = append(errs, fmt.Errorf("%s %s: %w: %s", ipt, strings.Join(del, " "), err, out))
					}
					break
				}
			}
		}
	}
	for _, ch := range chains {
		_ = exec.Command(ipt, "-w", "-t", table, "-F", ch).Run()
	}
	for _, ch := range chains {
		if out, err := exec.Command(ipt, "-w", "-t", table, "-X", ch).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", ipt, table, ch, err, out))
		}
	}
	return errors.Join(errs...)
}

// splitRule splits a line of `iptables -S` into arguments, honouring the
// double quotes around comments.
func splitRule(line string) []string {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			have = true
		case ch == '"':
			inQuote = !inQuote
			have = true
		case ch == ' ' && !inQuote:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
			have = true
		}
	}
	if have {
		args = append(args, cur.String())
	}
	return args
}
