package outboxdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// ConnConfig says where to listen. The Listener dials its own dedicated
	// connection from a copy: LISTEN belongs to a session, so a pooled
	// connection would lose it. Required.
	ConnConfig *pgx.ConnConfig
	// Channel is the channel to LISTEN on. Default NotifyChannel.
	Channel string
	// MinBackoff is the first wait before reconnecting after the connection
	// was lost or could not be made; each further failure doubles it, up to
	// MaxBackoff, and a successful LISTEN starts again from MinBackoff.
	// Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// HealthCheckInterval is how long the Listener waits for a notification
	// before it pings the server, so that a connection that died silently
	// (no RST, for example after a network partition) is noticed and replaced
	// instead of waiting forever; and at most half the server's
	// idle_session_timeout, which would end the session. Default 30s.
	HealthCheckInterval time.Duration
	// OnListen, when set, is called each time LISTEN takes effect: at start
	// and after every reconnection.
	OnListen func()
	// OnNotify, when set, is given each notification's payload before the
	// wake-up; wake false leaves the wake-up out, for a notification that
	// announces no row (a pause shared with every instance, PauseNotice).
	OnNotify func(payload string) (wake bool)
	// OnError, when set, is called with each connection failure before the
	// Listener backs off and reconnects. Cancellation of Run's context is not
	// reported. The errors never contain a password.
	OnError func(error)
}

// Listener keeps a LISTEN open on one channel and turns notifications into
// wake-ups. It is what lets a dispatcher claim a new row within milliseconds
// of its commit instead of at the next poll.
type Listener struct {
	cfg  ListenerConfig
	wake chan struct{}
}

// NewListener returns a Listener; Run starts it.
func NewListener(cfg ListenerConfig) *Listener {
	cfg.Channel = cmp.Or(cfg.Channel, NotifyChannel)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 100*time.Millisecond)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, 5*time.Second), cfg.MinBackoff)
	cfg.HealthCheckInterval = cmp.Or(cfg.HealthCheckInterval, 30*time.Second)
	return &Listener{cfg: cfg, wake: make(chan struct{}, 1)}
}

// Wake receives a value after notifications on the channel; several
// notifications before a receive make one wake-up. It also fires after every
// (re)LISTEN, because notifications sent while the connection was down are
// lost and the receiver should look for work it may have missed.
func (l *Listener) Wake() <-chan struct{} { return l.wake }

// Run listens until ctx is done, reconnecting and listening again with
// backoff whenever the connection is lost. It returns when ctx is done.
func (l *Listener) Run(ctx context.Context) {
	wait := l.cfg.MinBackoff
	for {
		listened, err := l.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			wait = l.cfg.MinBackoff
		}
		if l.cfg.OnError != nil {
			l.cfg.OnError(err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(wait*2, l.cfg.MaxBackoff)
	}
}

// runOnce connects, listens and forwards notifications until the connection
// fails or ctx is done. listened says whether LISTEN took effect.
func (l *Listener) runOnce(ctx context.Context) (listened bool, err error) {
	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(connectCtx, l.cfg.ConnConfig.Copy())
	cancel()
	if err != nil {
		return false, fmt.Errorf("connecting to listen for notifications: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	interval := l.cfg.HealthCheckInterval
	if limit := idleSessionTimeout(ctx, conn); limit > 0 {
		interval = min(interval, limit/2)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.cfg.Channel}.Sanitize()); err != nil {
		return false, fmt.Errorf("listening on channel %s: %w", l.cfg.Channel, err)
	}
	// The wake-up first: whoever OnListen tells that the LISTEN took effect
	// finds it pending.
	l.signal()
	if l.cfg.OnListen != nil {
		l.cfg.OnListen()
	}

	for {
		waitCtx, cancel := context.WithTimeout(ctx, interval)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			if l.cfg.OnNotify == nil || l.cfg.OnNotify(n.Payload) {
				l.signal()
			}
			continue
		case ctx.Err() != nil:
			return true, ctx.Err()
		case pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded):
			// Quiet for a while: make sure the connection is still alive. A
			// timed-out wait leaves the connection usable.
			pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pingCtx)
			cancel()
			if err != nil && ctx.Err() == nil {
				return true, fmt.Errorf("checking the notification connection: %w", err)
			}
			continue
		default:
			return true, fmt.Errorf("waiting for notifications: %w", err)
		}
	}
}

// idleSessionTimeout is how long the server lets conn's session sit idle
// before it ends it (idle_session_timeout, which an administrator may set
// for the role or the database), 0 for no limit or when the server does
// not say. A listening session is idle between notifications: with a limit
// below the health check's interval, the server ended it between pings and
// the Listener reconnected, warning, every few seconds.
func idleSessionTimeout(ctx context.Context, conn *pgx.Conn) time.Duration {
	var ms int64
	if err := conn.QueryRow(ctx, "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_session_timeout'").Scan(&ms); err != nil {
		return 0 // before PostgreSQL 14 there is no such limit
	}
	return time.Duration(ms) * time.Millisecond
}

func (l *Listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
