//go:build !linux

package emulators

import "syscall"

// sysProcAttr puts the emulator in a process group of its own, which stop
// kills as a whole.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
