package main

import (
	"os"
	"os/signal"
	"syscall"
)

// stopWithParent makes the death of our parent a SIGTERM to us, so that
// the dev stack stops in order (forwarder, generator, Kafka, platform,
// PostgreSQL) instead of running on as an orphan. It matters under
// `go run ./cmd/devstack`: a SIGTERM to go run kills it at once without
// passing the signal on to us. Call it once the SIGTERM handler is in place.
func stopWithParent() {
	parent := os.Getppid()
	const prSetPdeathsig = 1
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetPdeathsig, uintptr(syscall.SIGTERM), 0); errno != 0 {
		return
	}
	// The parent may have died before the call: we were reparented.
	if os.Getppid() != parent {
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}

// keepStoppingOnSIGTERM catches (and drops) SIGTERMs while the stack stops.
// The parent-death signal comes once per exiting thread of the parent that
// had been our parent (Linux hands us to the next thread, then to init), so
// a dying go run sends several; with the default action the second would
// kill us halfway through stopping, leaving PostgreSQL running. A handler,
// unlike SIG_IGN, is not inherited by the processes started meanwhile.
func keepStoppingOnSIGTERM() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM)
}
