// Package pgtest gives each test its own fresh database on a real PostgreSQL.
//
// When TEST_DATABASE_URL is set (a superuser URL of a running server) the
// databases are created there; otherwise Main starts a throwaway cluster for
// the package's tests in a temporary directory and removes it afterwards, so
// `go test ./...` works on a machine with nothing running.
//
// A migrated database is a copy of one the package migrated once (CREATE
// DATABASE ... TEMPLATE): the same schema, partitions and rows as migrating
// each afresh, for a sixth of the server's work (0.1 s of CPU instead of
// 0.6 s), in packages that make hundreds while other test binaries share the
// same cores.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestX(t *testing.T) {
//		pool := pgtest.NewPool(t) // migrated, private database
//	}
package pgtest

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

var (
	adminURL string
	cluster  *pgcluster.Cluster
	dbSeq    atomic.Int64

	// templates holds the migrated databases this process copies, by the
	// UTC day they were made on.
	templates struct {
		sync.Mutex
		byDay map[string]string
		// made lists every one created, to drop on exit.
		made []string
		// strategy is the CREATE DATABASE clause that copies them.
		strategy string
		// filled are the data sets of NewFilledPool, by name.
		filled map[string]*filledDB
	}
)

// filledDB is a database filled once for every test that asks for it.
type filledDB struct {
	once sync.Once
	name string
	err  error
}

// Main runs the package's tests with a PostgreSQL server available and exits.
func Main(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// MainParallel is Main for packages whose tests wait on the server (locks,
// leases running out, bulk loads) far more than they use this process's
// CPU: unless -test.parallel is given, n of their parallel tests run at once
// instead of GOMAXPROCS.
func MainParallel(m *testing.M, n int) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			os.Exit(1)
		}
	}
	Main(m)
}

func run(m *testing.M) (int, error) {
	adminURL = os.Getenv("TEST_DATABASE_URL")
	if adminURL == "" {
		dir, err := os.MkdirTemp("", "forwarder-pgtest-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, err = pgcluster.Start(ctx, pgcluster.Config{Dir: dir + "/data"})
		if err != nil {
			return 0, err
		}
		defer func() { _ = cluster.Remove() }()
		adminURL = cluster.DSN("postgres")
	}
	defer dropTemplates()
	return m.Run(), nil
}

// Cluster is the package's private server, or nil when TEST_DATABASE_URL
// points at an external one. Tests that stop the server must start their own
// with StartCluster instead.
func Cluster() *pgcluster.Cluster { return cluster }

// AdminURL is a superuser URL for the server's postgres database.
func AdminURL(t testing.TB) string {
	t.Helper()
	if adminURL == "" {
		t.Fatal("pgtest: call pgtest.Main from TestMain")
	}
	return adminURL
}

// NewEmptyDB creates a fresh, empty database dropped at the end of the test
// and returns its URL.
func NewEmptyDB(t testing.TB) string {
	t.Helper()
	return newDBOn(t, AdminURL(t))
}

// NewDB creates a fresh database with the forwarder schema migrated and
// returns its URL.
func NewDB(t testing.TB) string {
	t.Helper()
	admin := AdminURL(t)
	tmpl, strategy := migratedTemplate(t, admin)
	return createDB(t, admin, " TEMPLATE "+pgx.Identifier{tmpl}.Sanitize()+strategy)
}

// migratedTemplate returns the name of a database migrated by this process
// today (UTC), making it first if needed, and the clause that copies it. A
// new one is made each day because the migration creates the partitions of
// its day and the three after.
func migratedTemplate(t testing.TB, admin string) (name, strategy string) {
	t.Helper()
	templates.Lock()
	defer templates.Unlock()
	day := time.Now().UTC().Format("20060102")
	if name, ok := templates.byDay[day]; ok {
		return name, templates.strategy
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connecting to server: %v", err)
	}
	defer conn.Close(ctx)
	// PostgreSQL 15 copies a database by writing every block to the WAL
	// unless told to copy the files (what 14 and older always do): twice the
	// server's work for a database this small.
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatalf("pgtest: reading the server's version: %v", err)
	}
	if version >= 150000 {
		templates.strategy = " STRATEGY FILE_COPY"
	}
	name = fmt.Sprintf("t_%d_template_%s", os.Getpid(), day)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	templates.made = append(templates.made, name)
	pool, err := outboxdb.Open(ctx, dbURL(admin, name), outboxdb.PoolConfig{})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	_, err = outboxdb.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		t.Fatalf("pgtest: migrating %s: %v", name, err)
	}
	// A database is copied only while nobody is connected to it: keep
	// autovacuum out.
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatalf("pgtest: closing %s to connections: %v", name, err)
	}
	if templates.byDay == nil {
		templates.byDay = map[string]string{}
	}
	templates.byDay[day] = name
	return name, templates.strategy
}

func dropTemplates() {
	templates.Lock()
	defer templates.Unlock()
	if len(templates.made) == 0 {
		return
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return // the server may be gone already
	}
	defer conn.Close(ctx)
	for _, name := range templates.made {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
}

// NewFilledPool is NewPool on a copy of a database this process filled once
// with fill, for tests that each read the same large data set: PostgreSQL
// writes a million rows and their indexes in tens of seconds of CPU, and
// copies the files in about one. The first test to ask fills it while the
// others wait; each gets a private copy, statistics included, that it may
// change. name tells the data sets apart.
func NewFilledPool(t testing.TB, name string, fill func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	t.Helper()
	admin := AdminURL(t)
	tmpl, strategy := migratedTemplate(t, admin)
	templates.Lock()
	if templates.filled == nil {
		templates.filled = map[string]*filledDB{}
	}
	f, ok := templates.filled[name]
	if !ok {
		f = &filledDB{name: fmt.Sprintf("t_%d_filled_%s", os.Getpid(), sanitize(name))}
		templates.filled[name] = f
	}
	templates.Unlock()
	f.once.Do(func() { f.err = fillTemplate(admin, tmpl, strategy, f.name, fill) })
	if f.err != nil {
		t.Fatalf("pgtest: filling %s: %v", name, f.err)
	}
	return openPool(t, createDB(t, admin, " TEMPLATE "+pgx.Identifier{f.name}.Sanitize()+strategy))
}

// fillTemplate makes database name, a copy of the migrated template tmpl,
// fills it and closes it to connections, so that it can be copied.
func fillTemplate(admin, tmpl, strategy, name string, fill func(ctx context.Context, pool *pgxpool.Pool) error) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connecting to server: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tmpl}.Sanitize()+strategy); err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	templates.Lock()
	templates.made = append(templates.made, name)
	templates.Unlock()
	pool, err := outboxdb.Open(ctx, dbURL(admin, name), outboxdb.PoolConfig{})
	if err != nil {
		return err
	}
	err = fill(ctx, pool)
	pool.Close()
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("closing %s to connections: %w", name, err)
	}
	return nil
}

// NewPool is NewDB plus a pool on it, closed at the end of the test.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	_, pool := NewDBPool(t)
	return pool
}

// NewDBPool is NewPool for tests that also hand the database's URL to a
// component (which opens its own pool).
func NewDBPool(t testing.TB) (dsn string, pool *pgxpool.Pool) {
	t.Helper()
	dsn = NewDB(t)
	return dsn, openPool(t, dsn)
}

// Listen opens a connection to pool's database, as pool connects, that
// listens on channel; it is closed at the end of the test.
func Listen(t testing.TB, pool *pgxpool.Pool, channel string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return conn
}

// SetReadOnly makes the sessions of pool's database read-only, as a hot
// standby's are, or writable again (default_transaction_read_only).
func SetReadOnly(t testing.TB, pool *pgxpool.Pool, readOnly bool) {
	t.Helper()
	value := ""
	if readOnly {
		value = "on"
	}
	SetForDatabase(t, pool, "default_transaction_read_only", value)
}

// SetForDatabase sets a server setting for the sessions of pool's database,
// as an administrator does with ALTER DATABASE (value "": back to the
// server's); pool's role must own the database. A session keeps the
// settings it started with: pool's connections are closed, and the new ones
// follow.
func SetForDatabase(t testing.TB, pool *pgxpool.Pool, setting, value string) {
	t.Helper()
	ctx := context.Background()
	var name string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	stmt := "ALTER DATABASE " + pgx.Identifier{name}.Sanitize() + " RESET " + pgx.Identifier{setting}.Sanitize()
	if value != "" {
		stmt = "ALTER DATABASE " + pgx.Identifier{name}.Sanitize() + " SET " + pgx.Identifier{setting}.Sanitize() + " = " + QuoteLiteral(value)
	}
	// In a transaction of its own, which may write whatever the
	// database's default (default_transaction_read_only).
	if _, err := pool.Exec(ctx, "BEGIN READ WRITE; "+stmt+"; COMMIT"); err != nil {
		t.Fatal(err)
	}
	pool.Reset()
}

// QuoteLiteral is s as an SQL string literal (standard_conforming_strings
// on, PostgreSQL's default), for the statements that take no parameters.
func QuoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// StartCluster starts a private server for one test (for tests that stop or
// restart PostgreSQL) and removes it at the end of the test.
func StartCluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	return startCluster(t, false)
}

// StartDurableCluster is StartCluster with production durability (fsync
// and full_page_writes on), for tests of what a crash may lose.
func StartDurableCluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	return startCluster(t, true)
}

func startCluster(t testing.TB, durable bool) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: t.TempDir() + "/data", Durable: durable})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = c.Remove() })
	return c
}

// NewDBOn creates a fresh migrated database on cluster c.
func NewDBOn(t testing.TB, c *pgcluster.Cluster) string {
	t.Helper()
	dsn := newDBOn(t, c.DSN("postgres"))
	pool := openPool(t, dsn)
	if _, err := outboxdb.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("pgtest: migrating: %v", err)
	}
	pool.Close()
	return dsn
}

func newDBOn(t testing.TB, admin string) string {
	t.Helper()
	return createDB(t, admin, "")
}

// createDB creates a database dropped at the end of the test, with the
// given clauses of CREATE DATABASE, and returns its URL.
func createDB(t testing.TB, admin, clauses string) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t_%d_%d_%s", os.Getpid(), dbSeq.Add(1), sanitize(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connecting to server: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+clauses); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return // the server may be gone already
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return dbURL(admin, name)
}

// dbURL is the server URL admin with database name.
func dbURL(admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil {
		// key=value form
		return admin + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

func openPool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := outboxdb.Open(context.Background(), dsn, outboxdb.PoolConfig{})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// HoldMigrationLock takes, on a session of its own, the advisory lock a
// schema migration holds while it runs (outboxdb.MigrationLockKey), as
// `outbox migrate` or an instance migrating on start would; release ends
// the "migration". Released at the end of the test too.
func HoldMigrationLock(t testing.TB, dsn string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", outboxdb.MigrationLockKey); err != nil {
		_ = conn.Close(ctx)
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = conn.Close(ctx) }) }
	t.Cleanup(release)
	return release
}
