//go:build unix && !linux

package localcluster

import "syscall"

// processAttrs puts a component in its own process group, so that stop
// reaches its children.
func processAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func signalGroup(pgid int, sig syscall.Signal) error {
	return syscall.Kill(-pgid, sig)
}
