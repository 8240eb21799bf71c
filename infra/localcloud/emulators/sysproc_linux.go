package emulators

import "syscall"

// sysProcAttr puts the emulator in a process group of its own, which stop
// kills as a whole, and has the kernel kill it should this process die
// without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
