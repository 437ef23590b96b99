package protection

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// minPoolToKeepOne is the smallest pool of which the gate keeps a
// connection for itself: below it, the claims, renewals and result writes
// would be left one or none, and the gate shares the pool with them.
const minPoolToKeepOne = 3

// errGateStopped is the answer to a statement after Stop.
var errGateStopped = errors.New("the platform gate is stopped")

// session runs the gate's statements (the read of the shared state every
// second, the writes of the breaker, a Retry-After pause and the probes) on
// a connection of the stream's pool that the gate keeps for itself, one
// statement at a time. On connections shared with the data path the read
// queued behind claims and result writes whenever the pool was busy (every
// request in flight answered 429 at once, each reply sharing its pause),
// and an instance kept sending for seconds during a pause the others had
// shared (docs/guarantees.md #13: every instance follows the shared state
// within a second).
type session struct {
	mu   sync.Mutex
	pool *pgxpool.Pool
	keep bool
	conn *pgxpool.Conn
}

func newSession(pool *pgxpool.Pool) *session {
	return &session{pool: pool, keep: pool.Config().MaxConns >= minPoolToKeepOne}
}

// do runs fn on the gate's connection, taking it from the pool first when
// it has none (at the first statement, or after an error gave it back).
func (s *session) do(ctx context.Context, fn func(q outboxdb.Querier) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.pool == nil:
		return errGateStopped
	case !s.keep:
		return fn(s.pool)
	case s.conn == nil:
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		s.conn = c
	}
	err := fn(s.conn)
	if err != nil {
		// Back to the pool, which closes it if the error broke it (a
		// restarted server, a statement cut short); the next statement
		// takes a healthy one.
		s.conn.Release()
		s.conn = nil
	}
	return err
}

// close gives the connection back, after the statement under way if any.
func (s *session) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Release()
		s.conn = nil
	}
	s.pool = nil
}
