package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// TestOneLiveStackPerDirectory: a second stack on a live stack's directory
// is refused with the live one's pid, and never told to stop its
// PostgreSQL; once the first stops, the directory is free again.
func TestOneLiveStackPerDirectory(t *testing.T) {
	t.Parallel()
	root := testinputs.ModuleRoot(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := Start(ctx, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Stop()

	_, err = Start(ctx, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
	if !errors.Is(err, ErrLiveStack) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second start: %v, want ErrLiveStack naming pid %d", err, os.Getpid())
	}
	if strings.Contains(err.Error(), "pg_ctl") {
		t.Errorf("the refusal advises stopping the live PostgreSQL: %v", err)
	}
	if !first.PG.Running() {
		t.Fatal("the refused start stopped the live stack's PostgreSQL")
	}

	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	// The kernel frees the lock when the last copy of its descriptor is
	// closed. A child that another test of this package is starting holds
	// a copy from its fork to its exec (close-on-exec), which on a loaded
	// machine can outlast Stop by a moment: allow a few seconds.
	var again *Stack
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		again, err = Start(ctx, Config{Dir: dir, WorkDir: root, NoForwarder: true, NoGenerator: true})
		if err == nil || !errors.Is(err, ErrLiveStack) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("start after the first stopped: %v", err)
	}
	if err := again.Stop(); err != nil {
		t.Error(err)
	}
}
