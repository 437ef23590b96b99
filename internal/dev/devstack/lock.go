package devstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
)

// lockName is the file under Dir whose lock a live stack holds.
const lockName = "devstack.lock"

// ErrLiveStack is the error of Start when another stack runs in the same
// directory.
var ErrLiveStack = errors.New("another dev stack is running in this directory")

// lockDir takes the directory's lock for the life of the stack: one live
// stack per directory, since both would run the same PostgreSQL cluster.
// The lock is the kernel's (flock), so a stack that was killed leaves none
// behind; the file records the holder's pid for the message.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		holder := "its pid is in " + path
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf("pid %d; stop it with Ctrl-C in its terminal, or kill -TERM %d", pid, pid)
			}
		}
		return nil, fmt.Errorf("%w: %s (%s). Use that one (its addresses are in its first lines), "+
			"or run this one in another directory: go run ./cmd/devstack -data <dir>", ErrLiveStack, dir, holder)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// unlock releases the lock (closing the file does).
func unlock(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// stopHint is the command that stops a leftover dev PostgreSQL server: one
// that a stack which was killed (not stopped) left running. It is only
// given when no live stack holds the directory's lock.
func stopHint(dir string) string {
	binDir, err := pgcluster.FindBinDir(dir)
	if err != nil {
		binDir = "<PostgreSQL bin directory>"
	}
	pgCtl := filepath.Join(binDir, "pg_ctl")
	if os.Geteuid() == 0 {
		return fmt.Sprintf("runuser -u %s -- %s stop -m fast -D %s", orDefault(os.Getenv("PG_OS_USER"), pgcluster.DefaultOSUser), pgCtl, dir)
	}
	return fmt.Sprintf("%s stop -m fast -D %s", pgCtl, dir)
}
