// Package pgcluster runs a private PostgreSQL server from the Debian packages,
// for tests and the dev stack: initdb into a directory, pg_ctl start on a free
// loopback port, stop, restart. PostgreSQL refuses to run as root, so when the
// process is root the server runs as a dedicated system user (created if
// missing).
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forwarder/forwarder/internal/dev/childproc"
)

// DefaultOSUser runs the server when the caller is root.
const DefaultOSUser = "forwarder-pg"

// Config describes a cluster. Zero values pick defaults.
type Config struct {
	// Dir is the data directory; an existing cluster in it is reused.
	Dir string
	// Port to listen on, 127.0.0.1 only; 0 picks a free port (and keeps the
	// one recorded by a previous run of the same Dir when it is free).
	Port int
	// BinDir holds initdb, pg_ctl and postgres (default FindBinDir: env
	// PG_BIN_DIR, else the newest PostgreSQL ≥ MinVersion installed).
	BinDir string
	// OSUser runs the server when the caller is root (env PG_OS_USER, else DefaultOSUser).
	OSUser string
	// Durable keeps fsync on. Without it a killed server still loses nothing
	// it acknowledged (the WAL is written to the OS at commit), only an OS
	// crash could. synchronous_commit stays on either way: with it off, a
	// server stopped in "immediate" mode loses commits it confirmed, which
	// would make crash tests lie.
	Durable bool
	// Settings are extra postgresql.conf parameters.
	Settings map[string]string
}

// Cluster is a running (or stopped) private PostgreSQL server.
type Cluster struct {
	cfg  Config
	Port int
	cred *syscall.Credential
}

// Start initialises cfg.Dir when it holds no cluster yet and starts the
// server, waiting until it accepts connections.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("pgcluster: Dir is required")
	}
	osUser, dir, err := userAndDir(cfg.OSUser, cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.OSUser, cfg.Dir = osUser, dir
	if cfg.BinDir == "" {
		if cfg.BinDir, err = FindBinDir(cfg.Dir); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.BinDir, "pg_ctl")); err != nil {
		return nil, fmt.Errorf("pgcluster: PostgreSQL binaries not found in %s: %w", cfg.BinDir, err)
	}
	c := &Cluster{cfg: cfg}
	if os.Geteuid() == 0 {
		cred, err := ensureOSUser(cfg.OSUser)
		if err != nil {
			return nil, err
		}
		c.cred = cred
	}
	if err := c.initdb(ctx); err != nil {
		return nil, err
	}
	c.Port = cfg.Port
	if c.Port == 0 {
		c.Port = c.previousPort()
	}
	if c.Port == 0 || !childproc.PortFree(c.Port) {
		if c.Port, err = freePort(); err != nil {
			return nil, err
		}
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Dir is the cluster's data directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// DSN is a superuser connection string for database db.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

func (c *Cluster) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(c.cfg.Dir, "PG_VERSION")); err == nil {
		if err := c.chown(c.cfg.Dir); err != nil {
			return err
		}
		return c.ensureTraversable(filepath.Dir(c.cfg.Dir))
	}
	if err := os.MkdirAll(c.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: creating %s: %w", c.cfg.Dir, err)
	}
	if err := c.chown(c.cfg.Dir); err != nil {
		return err
	}
	if err := c.ensureTraversable(filepath.Dir(c.cfg.Dir)); err != nil {
		return err
	}
	out, err := c.command(ctx, "initdb", "-D", c.cfg.Dir, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: initdb %s: %w\n%s", c.cfg.Dir, err, out)
	}
	return nil
}

// Start starts a stopped cluster on its port.
func (c *Cluster) Start(ctx context.Context) error {
	opts := []string{
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port=" + strconv.Itoa(c.Port),
		"-c", "unix_socket_directories=" + c.cfg.Dir,
		"-c", "max_connections=300",
	}
	if !c.cfg.Durable {
		opts = append(opts, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	for k, v := range c.cfg.Settings {
		opts = append(opts, "-c", k+"="+v)
	}
	logFile := filepath.Join(c.cfg.Dir, "server.log")
	out, err := c.command(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.cfg.Dir, "-l", logFile,
		"-o", strings.Join(quoteAll(opts), " ")).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("pgcluster: starting server on port %d: %w\n%s\n%s", c.Port, err, out, tail(log, 2000))
	}
	_ = os.WriteFile(filepath.Join(c.cfg.Dir, "forwarder.port"), []byte(strconv.Itoa(c.Port)), 0o644)
	return nil
}

// Stop shuts the server down. Mode is "fast" (disconnect clients, clean
// shutdown) or "immediate" (like a crash: recovery runs on the next start).
func (c *Cluster) Stop(mode string) error {
	if mode == "" {
		mode = "fast"
	}
	out, err := c.command(context.Background(), "pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", c.cfg.Dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: stopping server: %w\n%s", err, out)
	}
	return nil
}

// StartStandby makes a streaming standby of c (which must be running) in
// dir, with pg_basebackup -R (a standby.signal and primary_conninfo), and
// starts it on a port of its own, as c's OS user. settings are extra
// postgresql.conf parameters of the standby.
func (c *Cluster) StartStandby(ctx context.Context, dir string, settings map[string]string) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := c.ensureTraversable(parent); err != nil {
		return nil, err
	}
	if c.cred != nil {
		// pg_basebackup, run as the server's user, creates dir in parent.
		if err := os.Chown(parent, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	cmd := c.command(ctx, "pg_basebackup", "-D", dir, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port),
		"-U", "postgres", "-R", "-X", "stream", "-c", "fast")
	cmd.Dir = parent
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgcluster: pg_basebackup of the server on port %d into %s: %w\n%s", c.Port, dir, err, out)
	}
	// The base backup copied the primary's recorded port.
	_ = os.Remove(filepath.Join(dir, "forwarder.port"))
	return Start(ctx, Config{Dir: dir, BinDir: c.cfg.BinDir, OSUser: c.cfg.OSUser, Durable: c.cfg.Durable, Settings: settings})
}

// EnableTLS turns TLS on in a running server (ssl=on, reloaded) with the
// given certificate and private key, written into its data directory as
// its OS user's, the key readable by it alone, as PostgreSQL requires. The
// reload is asynchronous: the caller waits until a TLS connection works.
func (c *Cluster) EnableTLS(ctx context.Context, certPEM, keyPEM []byte) error {
	for name, b := range map[string][]byte{"tls-server.crt": certPEM, "tls-server.key": keyPEM} {
		path := filepath.Join(c.cfg.Dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if c.cred != nil {
			if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fmt.Errorf("pgcluster: %w", err)
			}
		}
	}
	conf := "ssl = on\nssl_cert_file = 'tls-server.crt'\nssl_key_file = 'tls-server.key'\n"
	f, err := os.OpenFile(filepath.Join(c.cfg.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if out, err := c.command(ctx, "pg_ctl", "reload", "-D", c.cfg.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: reloading with TLS on: %w\n%s", err, out)
	}
	return nil
}

// Promote makes a standby the primary (pg_ctl promote), waiting until it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "promote", "-w", "-t", "60", "-D", c.cfg.Dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: promoting the standby on port %d: %w\n%s", c.Port, err, out)
	}
	return nil
}

// Running reports whether the server's postmaster is up.
func (c *Cluster) Running() bool {
	return c.command(context.Background(), "pg_ctl", "status", "-D", c.cfg.Dir).Run() == nil
}

// Remove stops the server if needed and deletes its directory.
func (c *Cluster) Remove() error {
	if c.Running() {
		if err := c.Stop("immediate"); err != nil {
			return err
		}
	}
	return os.RemoveAll(c.cfg.Dir)
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.BinDir, name), args...)
	cmd.Dir = c.cfg.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

func (c *Cluster) chown(dir string) error {
	if c.cred == nil {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(c.cred.Uid), int(c.cred.Gid))
	})
}

// ensureTraversable lets the server's OS user reach its data directory:
// temporary directories are created 0700 by root, so ancestors without the
// search bit for others get it (search only, not read).
func (c *Cluster) ensureTraversable(dir string) error {
	if c.cred == nil {
		return nil
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("pgcluster: letting %s reach %s: %w", c.cfg.OSUser, d, err)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func (c *Cluster) previousPort() int {
	b, err := os.ReadFile(filepath.Join(c.cfg.Dir, "forwarder.port"))
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return p
}

// ensureOSUser finds or creates the unprivileged user that runs the server.
func ensureOSUser(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		out, uerr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if uerr != nil && !strings.Contains(string(out), "already exists") {
			return nil, fmt.Errorf("pgcluster: creating OS user %s to run PostgreSQL (it refuses root): %w: %s", name, uerr, out)
		}
		if u, err = user.Lookup(name); err != nil {
			return nil, fmt.Errorf("pgcluster: looking up OS user %s: %w", name, err)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	port, err := childproc.FreePort()
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	return port, nil
}

func quoteAll(opts []string) []string {
	out := make([]string, len(opts))
	for i, o := range opts {
		if strings.ContainsAny(o, " '\"") {
			o = "'" + strings.ReplaceAll(o, "'", `'\''`) + "'"
		}
		out[i] = o
	}
	return out
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// userAndDir is the OS account a server or bouncer runs as (osUser, else
// PG_OS_USER, else DefaultOSUser), and dir made absolute for the
// configuration files and commands that name it.
func userAndDir(osUser, dir string) (string, string, error) {
	if osUser == "" {
		osUser = envOr("PG_OS_USER", DefaultOSUser)
	}
	abs, err := filepath.Abs(dir)
	return osUser, abs, err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// WaitReady polls until dsn accepts connections (used after a restart).
func WaitReady(ctx context.Context, port int) error {
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// BinDir is the directory of the PostgreSQL binaries the cluster runs.
func (c *Cluster) BinDir() string { return c.cfg.BinDir }
