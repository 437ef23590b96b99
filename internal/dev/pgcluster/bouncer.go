package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// BouncerBin is where Debian's pgbouncer package installs the pooler.
const BouncerBin = "/usr/sbin/pgbouncer"

// BouncerConfig describes a PgBouncer in front of a server.
type BouncerConfig struct {
	// Dir holds its configuration, log and pid file; created when missing.
	Dir string
	// ServerPort is the PostgreSQL server's port on 127.0.0.1; every
	// database name is passed through to it.
	ServerPort int
	// PoolMode is session, transaction (default) or statement.
	PoolMode string
	// PoolSize is the server connections per database and user (default 20).
	PoolSize int
	// OSUser runs it when the caller is root (env PG_OS_USER, else
	// DefaultOSUser), as PostgreSQL itself.
	OSUser string
}

// Bouncer is a running PgBouncer: trust authentication, listening on
// 127.0.0.1; the user postgres may use its admin console (database
// pgbouncer: SHOW STATS, SHOW CLIENTS).
type Bouncer struct {
	cfg  BouncerConfig
	Port int
	cmd  *exec.Cmd
	done chan struct{}
}

// StartBouncer writes a configuration into cfg.Dir and runs pgbouncer in the
// foreground as a child process, waiting until it accepts connections. Stop
// it with Stop.
func StartBouncer(ctx context.Context, cfg BouncerConfig) (*Bouncer, error) {
	if cfg.Dir == "" || cfg.ServerPort == 0 {
		return nil, errors.New("pgcluster: a bouncer needs Dir and ServerPort")
	}
	if _, err := os.Stat(BouncerBin); err != nil {
		return nil, fmt.Errorf("pgcluster: %s not found (sudo apt-get install pgbouncer): %w", BouncerBin, err)
	}
	if cfg.PoolMode == "" {
		cfg.PoolMode = "transaction"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 20
	}
	osUser, dir, err := userAndDir(cfg.OSUser, cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.OSUser, cfg.Dir = osUser, dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	b := &Bouncer{cfg: cfg, Port: port, done: make(chan struct{})}
	// With trust authentication the users must still be listed.
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
admin_users = postgres
stats_users = postgres
logfile = %s
pidfile = %s
log_connections = 0
log_disconnections = 0
; SHOW STATS totals are refreshed every stats period
stats_period = 1
`, cfg.ServerPort, port, filepath.Join(dir, "userlist.txt"), cfg.PoolMode, cfg.PoolSize, b.LogPath(), filepath.Join(dir, "pgbouncer.pid"))
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		return nil, err
	}
	b.cmd = exec.Command(BouncerBin, "-q", iniPath)
	b.cmd.Dir = dir
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		cred, err := ensureOSUser(cfg.OSUser)
		if err != nil {
			return nil, err
		}
		b.cmd.SysProcAttr.Credential = cred
		c := &Cluster{cfg: Config{Dir: dir, OSUser: cfg.OSUser}, cred: cred}
		if err := c.chown(dir); err != nil {
			return nil, err
		}
		if err := c.ensureTraversable(filepath.Dir(dir)); err != nil {
			return nil, err
		}
	}
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return nil, err
	}
	b.cmd.Stdout, b.cmd.Stderr = out, out
	if err := b.cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("pgcluster: starting pgbouncer: %w", err)
	}
	go func() {
		_ = b.cmd.Wait()
		out.Close()
		close(b.done)
	}()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := WaitReady(waitCtx, port); err != nil {
		b.Stop()
		log, _ := os.ReadFile(b.LogPath())
		return nil, fmt.Errorf("pgcluster: pgbouncer did not listen on %d: %w\n%s", port, err, tail(log, 2000))
	}
	return b, nil
}

// DSN is a connection string for database db through the bouncer, as user
// postgres.
func (b *Bouncer) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", b.Port, db)
}

// AdminDSN is the admin console's connection string (simple protocol only).
func (b *Bouncer) AdminDSN() string {
	return b.DSN("pgbouncer") + "&default_query_exec_mode=simple_protocol"
}

// LogPath is the bouncer's log file.
func (b *Bouncer) LogPath() string { return filepath.Join(b.cfg.Dir, "pgbouncer.log") }

// Log is what the bouncer logged so far.
func (b *Bouncer) Log() string {
	log, _ := os.ReadFile(b.LogPath())
	out, _ := os.ReadFile(filepath.Join(b.cfg.Dir, "stdout.log"))
	return string(log) + string(out)
}

// Stop terminates the bouncer (by its pid) and waits for it.
func (b *Bouncer) Stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

// Pid is the bouncer's process id.
func (b *Bouncer) Pid() int { return b.cmd.Process.Pid }
