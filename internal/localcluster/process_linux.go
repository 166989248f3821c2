package localcluster

import "syscall"

// processAttrs puts a component in its own process group, so that stop
// reaches its children, and kills it when the process that started it dies.
func processAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func signalGroup(pgid int, sig syscall.Signal) error {
	return syscall.Kill(-pgid, sig)
}
