package streamdb

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// Connect is the Connect of a component that holds the stream's pool from
// its first Connect to its Close, in *pool and *closed, both guarded by the
// component's mu. Closed, it ends the component (service.ErrEndOfInput);
// already holding the pool (called again after a lost connection), it only
// waits for the database to answer (Recheck); else it opens the pool (Open,
// which may wait long) without holding mu, so that Close is not blocked
// meanwhile. If Close came first the pool is released at once; otherwise it
// is stored and opened, when not nil, runs with mu still held, so that what
// the component starts with the pool is in place before Close can see it.
func (h *DB) Connect(ctx context.Context, mu sync.Locker, pool **pgxpool.Pool, closed *bool, opened func(*pgxpool.Pool)) error {
	mu.Lock()
	held, isClosed := *pool, *closed
	mu.Unlock()
	if isClosed {
		return service.ErrEndOfInput
	}
	if held != nil {
		return h.Recheck(ctx, held)
	}
	p, err := h.Open(ctx)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if *closed {
		h.Release()
		return service.ErrEndOfInput
	}
	*pool = p
	if opened != nil {
		opened(p)
	}
	return nil
}
