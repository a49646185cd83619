package redisproc

import "syscall"

// sysProcAttr kills the server if the process that started it dies without cleaning up.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
