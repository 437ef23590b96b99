package main_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

var forwarderBin string

func TestMain(m *testing.M) {
	// $FORWARDER_BIN is the binary `make test` built; otherwise build one.
	forwarderBin = os.Getenv("FORWARDER_BIN")
	if forwarderBin == "" {
		dir, err := os.MkdirTemp("", "forwarder-bin-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		forwarderBin = filepath.Join(dir, "forwarder")
		if out, err := exec.Command("go", "build", "-o", forwarderBin, ".").CombinedOutput(); err != nil {
			panic("building forwarder: " + err.Error() + "\n" + string(out))
		}
	}
	pgtest.Main(m)
}

// run executes the binary with env added and returns its combined output.
func run(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(testinputs.Forwarder(t, forwarderBin), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestBinary(t *testing.T) {
	t.Parallel()

	t.Run("VersionAndList", func(t *testing.T) {
		t.Parallel()
		out, err := run(t, nil, "--version")
		if err != nil || !strings.Contains(out, "Version:") {
			t.Fatalf("--version: %v\n%s", err, out)
		}
		out, err = run(t, nil, "list")
		if err != nil {
			t.Fatalf("list: %v\n%s", err, out)
		}
		for _, name := range []string{"kafka_franz", "outbox", "outbox_retry", "outbox_dead_letter", "http_forwarder", "mapping_file", "prometheus", "percent_round", "ts_format_platform"} {
			if !strings.Contains(out, "- "+name+"\n") {
				t.Errorf("forwarder list does not show %s", name)
			}
		}
		// The helpers behind the spec lint rules are not for configs.
		for _, name := range []string{"http_forwarder_rule_lints", "http_forwarder_lease_lints", "mapping_file_lint"} {
			if strings.Contains(out, name) {
				t.Errorf("forwarder list shows the lint helper %s:\n%s", name, out)
			}
		}
	})

	t.Run("LintRulesStillRun", func(t *testing.T) {
		t.Parallel()
		// The lint helpers are hidden from configs but the spec lint rules
		// that call them still run: a rule that does not compile and a
		// mapping file that does not exist are both reported.
		dir := t.TempDir()
		conf := filepath.Join(dir, "bad.yaml")
		bad := `input:
  generate:
    mapping: 'root = {}'
pipeline:
  processors:
    - mapping_file:
        path: ` + filepath.Join(dir, "missing.blobl") + `
output:
  http_forwarder:
    dsn: postgres://localhost/x
    url: http://localhost
    rules:
      - when: 'status =='
        outcome: success
`
		if err := os.WriteFile(conf, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := run(t, nil, "lint", conf)
		if err == nil || !strings.Contains(out, "rules[0]") || !strings.Contains(out, "missing.blobl") {
			t.Fatalf("lint of a bad rule and a missing mapping file: err %v, want both reported:\n%s", err, out)
		}
	})

	t.Run("FlagAfterThePathsIsRefused", func(t *testing.T) {
		t.Parallel()
		out, err := run(t, nil, "lint", "../../pipelines/forwarder.yaml", "--skip-env-var-check")
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 ||
			out != "forwarder lint: flag --skip-env-var-check after the path ../../pipelines/forwarder.yaml: flags go before the paths\n" {
			t.Errorf("lint with a flag after its path: %v\n%s", err, out)
		}
	})

	t.Run("Help", func(t *testing.T) {
		t.Parallel()
		out, err := run(t, nil, "--help")
		if err != nil || !strings.Contains(out, "forwarder - moves parking-camera events from Kafka to the parking platform") ||
			!strings.Contains(out, "forwarder -c pipelines/forwarder.yaml") || strings.Contains(out, "mundane") {
			t.Fatalf("--help does not describe the forwarder: %v\n%s", err, out)
		}
		// The service's own flags, which Benthos declares hidden.
		for _, want := range []string{"SERVICE OPTIONS", "--config value, -c value", "--set value, -s value", "--resources value, -r value"} {
			if !strings.Contains(out, want) {
				t.Errorf("--help does not list %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "help-autocomplete") {
			t.Errorf("--help lists the shells' --help-autocomplete:\n%s", out)
		}
	})

	// forwarder test reports a target_mapping that does not compile with
	// its file, line and column, as lint does for the pipelines.
	t.Run("TestReportsTheMappingsPosition", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		if err := os.CopyFS(filepath.Join(dir, "mappings"), os.DirFS("../../mappings")); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, "mappings", "vehicle_event.blobl")
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		broken := strings.Replace(string(b), "root.park_code = ", "root.park_code = +++ ", 1)
		line := 1 + strings.Count(broken[:strings.Index(broken, "+++")], "\n")
		if err := os.WriteFile(file, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(testinputs.Forwarder(t, forwarderBin), "test", "./mappings/...")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		want := fmt.Sprintf("Mapping mappings/vehicle_event.blobl (target_mapping of mappings/vehicle_event_test.yaml) does not compile: "+
			"compiling mappings/vehicle_event.blobl:%d:", line)
		if err == nil || !strings.Contains(string(out), want) {
			t.Fatalf("forwarder test with a broken mapping: %v, want a failure and %q:\n%s", err, want, out)
		}
		if !strings.Contains(string(out), "Test 'mappings/heartbeat_test.yaml' succeeded") {
			t.Errorf("the other tests did not run:\n%s", out)
		}
	})

	t.Run("OutboxMigrate", func(t *testing.T) {
		t.Parallel()
		env := []string{"DATABASE_URL=" + pgtest.NewEmptyDB(t)}
		out, err := run(t, env, "outbox", "migrate")
		if err != nil || !strings.Contains(out, "schema migrated from version 0") {
			t.Fatalf("first migrate: %v\n%s", err, out)
		}
		out, err = run(t, env, "outbox", "migrate")
		if err != nil || !strings.Contains(out, "schema is up to date") {
			t.Fatalf("second migrate changed something or failed: %v\n%s", err, out)
		}
	})

	t.Run("ConcurrentMigrations", func(t *testing.T) {
		t.Parallel()
		env := []string{"DATABASE_URL=" + pgtest.NewEmptyDB(t)}
		var wg sync.WaitGroup
		outs, errs := make([]string, 3), make([]error, 3)
		for i := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i], errs[i] = run(t, env, "outbox", "migrate")
			}()
		}
		wg.Wait()
		migrated := 0
		for i := range outs {
			if errs[i] != nil {
				t.Fatalf("migrate %d: %v\n%s", i, errs[i], outs[i])
			}
			if strings.Contains(outs[i], "schema migrated") {
				migrated++
			}
		}
		if migrated != 1 {
			t.Fatalf("%d of 3 concurrent runs migrated, want exactly 1:\n%s", migrated, strings.Join(outs, "\n"))
		}
	})

	t.Run("NewerSchemaFails", func(t *testing.T) {
		t.Parallel()
		dsn := newerSchemaDB(t)
		out, err := run(t, []string{"DATABASE_URL=" + dsn}, "outbox", "migrate")
		if err == nil || !strings.Contains(out, "newer than this binary") {
			t.Fatalf("migrate on a newer schema: err %v, want a failure saying the schema is newer:\n%s", err, out)
		}
		if strings.Contains(out, dsn) {
			t.Fatalf("the error shows the database URL:\n%s", out)
		}
	})

	t.Run("ServiceRefusesNewerSchema", func(t *testing.T) {
		t.Parallel()
		dsn := newerSchemaDB(t)
		out, err := runServiceExpectingExit(t, "a database with a newer schema", "DATABASE_URL="+dsn)
		if err == nil || !strings.Contains(out, "newer than this binary") {
			t.Fatalf("start-up on a newer schema: err %v, want a failure saying so:\n%s", err, out)
		}
	})

	t.Run("ServiceRefusesABadPlatformTZ", func(t *testing.T) {
		t.Parallel()
		out, err := runServiceExpectingExit(t, "a bad PLATFORM_TZ",
			"PLATFORM_TZ=Mars/Olympus_Mons", "DATABASE_URL=postgres://127.0.0.1:1/none")
		if err == nil || !strings.Contains(out, `PLATFORM_TZ=Mars/Olympus_Mons: not a time zone name`) {
			t.Fatalf("start-up with a bad PLATFORM_TZ: err %v, want a failure naming it:\n%s", err, out)
		}
	})
}

// newerSchemaDB is a fresh database whose schema claims a version this
// binary does not know.
func newerSchemaDB(t *testing.T) string {
	t.Helper()
	dsn, pool := pgtest.NewDBPool(t)
	if _, err := pool.Exec(context.Background(), "INSERT INTO forwarder_schema_migrations (version, name) VALUES (9999, '9999_future')"); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// runServiceExpectingExit starts the service on pipelines/forwarder.yaml
// with env added (Kafka and the platform unreachable, credentials set) and
// returns its output once it exits; it fails the test if the service is
// still running after a minute, because of what (e.g. "a bad PLATFORM_TZ").
func runServiceExpectingExit(t *testing.T, what string, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testinputs.Forwarder(t, forwarderBin), "-c", "pipelines/forwarder.yaml")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(append(os.Environ(), "KAFKA_BROKERS=127.0.0.1:1",
		"PLATFORM_ACCESS_NAME=n", "PLATFORM_ACCESS_PWD=p", "HTTP_ADDR=127.0.0.1:0"), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the service kept running with %s:\n%s", what, out)
	}
	return string(out), err
}

// TestHealthcheck: `forwarder healthcheck` exits 0 only when the service's
// /ready answers 200, and says why otherwise; against a real running
// service it finds /ready at HTTP_ADDR, a 0.0.0.0 host included.
func TestHealthcheck(t *testing.T) {
	t.Parallel()

	t.Run("ReadyAndNotReady", func(t *testing.T) {
		t.Parallel()
		var status atomic.Int32
		status.Store(http.StatusOK)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/ready" {
				http.NotFound(w, r)
				return
			}
			w.WriteHeader(int(status.Load()))
			fmt.Fprint(w, "input not connected")
		}))
		defer srv.Close()
		addr := strings.TrimPrefix(srv.URL, "http://")

		out, err := run(t, []string{"HTTP_ADDR=" + addr}, "healthcheck")
		if err != nil {
			t.Fatalf("healthcheck on a ready service: %v\n%s", err, out)
		}
		status.Store(http.StatusServiceUnavailable)
		out, err = run(t, []string{"HTTP_ADDR=" + addr}, "healthcheck")
		if exitCode(err) != 1 || !strings.Contains(out, "503") || !strings.Contains(out, "input not connected") {
			t.Fatalf("healthcheck on a service that is not ready: exit %d, want 1 with the status and body:\n%s", exitCode(err), out)
		}
	})

	t.Run("NothingListening", func(t *testing.T) {
		t.Parallel()
		out, err := run(t, nil, "healthcheck", "--addr", closedAddr(t), "--timeout", "2s")
		if exitCode(err) != 1 || !strings.Contains(out, "not reachable") {
			t.Fatalf("healthcheck with nothing listening: exit %d, want 1 saying the service is not reachable:\n%s", exitCode(err), out)
		}
	})

	t.Run("AMistakenCommandLineIsOneLine", func(t *testing.T) {
		t.Parallel()
		for args, want := range map[string]string{
			"healthcheck --url http://x/ready":        "forwarder healthcheck: flag provided but not defined: -url (see --help)\n",
			"healthcheck --timeout soon":              `forwarder healthcheck: invalid value "soon" for flag -timeout: parse error (see --help)` + "\n",
			"healthcheck 127.0.0.1:4195 --path /ping": `forwarder healthcheck: unexpected argument "127.0.0.1:4195": this command takes flags only (see --help)` + "\n",
			"healthcheck --timeout 0s":                "forwarder healthcheck: --timeout 0s: want a duration above zero\n",
			"healthcheck --timeout -1s":               "forwarder healthcheck: --timeout -1s: want a duration above zero\n",
		} {
			out, err := run(t, nil, strings.Fields(args)...)
			if exitCode(err) != 1 || out != want {
				t.Errorf("%s: exit %d, want 1 and %q, got:\n%s", args, exitCode(err), want, out)
			}
		}
	})

	t.Run("RealService", func(t *testing.T) {
		t.Parallel()
		port := strings.TrimPrefix(closedAddr(t), "127.0.0.1:")
		conf := filepath.Join(t.TempDir(), "ready.yaml")
		if err := os.WriteFile(conf, []byte(`http:
  address: ${HTTP_ADDR}
input:
  generate:
    interval: 1s
    mapping: 'root = "x"'
output:
  drop: {}
logger:
  level: WARN
`), 0o644); err != nil {
			t.Fatal(err)
		}
		env := []string{"HTTP_ADDR=0.0.0.0:" + port}
		ctx, cancel := context.WithCancel(context.Background())
		svc := exec.CommandContext(ctx, forwarderBin, "-c", conf)
		svc.Env = append(os.Environ(), env...)
		if err := svc.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = svc.Wait() }()

		deadline := time.Now().Add(30 * time.Second)
		for {
			out, err := run(t, env, "healthcheck")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("healthcheck never succeeded against a running service on HTTP_ADDR=0.0.0.0:%s:\n%s", port, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}

// closedAddr is a loopback address where nothing listens (a port just freed).
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// exitCode is the process's exit status in err from exec (0 for nil, -1
// when it did not exit normally).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
