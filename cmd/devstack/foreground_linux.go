package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// takeForeground moves this process into a process group of its own and
// makes it the terminal's foreground group, so that Ctrl-C reaches only the
// dev stack (which then stops its children in order) and not make or go
// run, which would otherwise die of the SIGINT: make would exit non-zero,
// and go run exits 1 once interrupted whatever we return. It does nothing
// unless stdin is a terminal we own the foreground of. The returned
// function gives the terminal back.
func takeForeground() (restore func()) {
	noop := func() {}
	fd := int(os.Stdin.Fd())
	fg, err := tcgetpgrp(fd)
	if err != nil || fg != syscall.Getpgrp() {
		return noop // not a terminal, or running in the background
	}
	if err := syscall.Setpgid(0, 0); err != nil {
		return noop
	}
	// A process outside the foreground group that sets it gets SIGTTOU.
	signal.Ignore(syscall.SIGTTOU)
	if err := tcsetpgrp(fd, syscall.Getpgrp()); err != nil {
		_ = syscall.Setpgid(0, fg)
		return noop
	}
	return func() { _ = tcsetpgrp(fd, fg) }
}

func tcgetpgrp(fd int) (int, error) {
	var pgrp int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); errno != 0 {
		return 0, errno
	}
	return int(pgrp), nil
}

func tcsetpgrp(fd, pgrp int) error {
	p := int32(pgrp)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&p))); errno != 0 {
		return errno
	}
	return nil
}
