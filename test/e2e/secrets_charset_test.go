package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/dev/pgcluster"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
	"github.com/forwarder/forwarder/internal/testsupport/testinputs"
)

// hostileSecrets are passwords holding what YAML, Benthos's ${...}
// interpolation, URLs and libpq's key=value syntax treat specially. Each
// holds a distinctive token (Qz..), searched for in every log, the metrics
// and the database: finding it, or the value, means a leak.
var hostileSecrets = []struct{ name, value string }{
	{"Alias", "*QzS3cretRest01"},
	{"Comment", "info #QzTail02"},
	{"Tag", "!QzSecretTag03"},
	{"MappingColon", "a: QzColon04"},
	{"FlowSequence", "[QzOpen05"},
	{"Directive", "%QzDirective06"},
	{"FlowMapping", "{QzBrace07}"},
	{"Quotes", `'QzQuotes08"`},
	{"Backslashes", `\QzBackslash09\\`},
	{"Newline", "QzLine10\nsecond line"},
	{"TrailingSpaces", "QzTrailing11  "},
	{"LeadingSpace", " QzLeading12"},
	{"NonASCII", "pä$$wörd-QzUmlaut13"},
	{"Anchor", "&QzAnchor14"},
	{"Interpolation", "${NOT_A_VAR}QzInterp15"},
	{"InterpolationOfSetVar", "${HOME}QzHome16"},
	{"URLReserved", "p@ss:w/rd?#&=%+QzReserved17"},
	{"KeywordInjection", "QzInject18' host=nowhere.invalid sslmode=require"},
	{"DocumentMarker", "--- QzDoc19"},
	{"BlockScalar", "|- QzBlock20"},
}

var secretToken = regexp.MustCompile(`Qz[A-Za-z0-9]+`)

// TestSecretsWithMetacharacters runs the shipped pipeline through the real
// binary with each hostile value as the platform password (and, slightly
// varied, as the platform user name) and as the PostgreSQL password of the
// role the forwarder connects as, given in DATABASE_URL both as a URL
// (percent-encoded) and as key=value pairs (quoted). For each: `forwarder
// lint` passes, start-up works, messages are delivered (the mock platform
// compares both credentials byte for byte and answers 401 otherwise; the
// database server, set to scram-sha-256 for the role, refuses a wrong
// password), and neither secret appears in any log, in /metrics or in any
// table (docs/guarantees.md: secrets are read as is, never printed).
func TestSecretsWithMetacharacters(t *testing.T) {
	t.Parallel()
	cluster := passwordCluster(t)
	for i, tc := range hostileSecrets {
		t.Run(tc.name, func(t *testing.T) {
			scenario(t, light, 7*time.Second)
			pwd := tc.value
			name := tc.value + "~name"
			dbPwd := tc.value + "~db"
			role := fmt.Sprintf("fwd_secret_%d", i)
			createRole(t, cluster, role, dbPwd)

			s := newStack(t, stackOptions{cluster: cluster, accessName: name, accessPwd: pwd})
			grantSchema(t, s, role)
			forms := map[string]string{
				"url":      roleURL(t, s.dsn, role, dbPwd),
				"keyvalue": roleKeywordDSN(t, s.dsn, role, dbPwd),
			}
			secrets := []string{pwd, name, dbPwd, forms["url"], forms["keyvalue"], secretToken.FindString(tc.value)}

			for _, form := range []string{"url", "keyvalue"} {
				env := merged(s.env, map[string]string{"DATABASE_URL": forms[form]})
				out, code := lint(t, env)
				if code != 0 {
					t.Errorf("forwarder lint with the %s DATABASE_URL exited %d:\n%s", form, code, out)
				}
				if leak := findSecret([]byte(out), secrets); leak != "" {
					t.Errorf("forwarder lint printed a secret (%q):\n%s", leak, out)
				}
			}

			src := s.newSource(eventgen.SourceConfig{})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for _, form := range []string{"url", "keyvalue"} {
				p := s.start("forwarder-"+form, map[string]string{"DATABASE_URL": forms[form]})
				s.produce(src, 20)
				want := int64(s.exp.goodCount())
				if err := s.platform.WaitFor(ctx, func(st mockplatform.Stats) bool { return st.Accepted >= want || st.AuthFailures > 0 }); err != nil {
					s.dumpLogs()
					t.Fatalf("%s DATABASE_URL: waiting for %d deliveries: %v (platform %+v)", form, want, err, s.platform.Stats())
				}
				if st := s.platform.Stats(); st.AuthFailures > 0 {
					t.Fatalf("%s DATABASE_URL: the platform answered 401 %d times: the credentials it received differ from PLATFORM_ACCESS_NAME/PWD", form, st.AuthFailures)
				}
				// The forwarder is connected as the role, so the server
				// accepted the password it sent.
				var conns int
				if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role).Scan(&conns); err != nil {
					t.Fatal(err)
				}
				if conns == 0 {
					t.Errorf("%s DATABASE_URL: no connection of role %s while the forwarder runs", form, role)
				}
				status, body, err := p.get(ctx, "/metrics")
				if err != nil || status != 200 {
					t.Errorf("GET /metrics: status %d, %v", status, err)
				}
				if leak := findSecret(body, secrets); leak != "" {
					t.Errorf("/metrics shows a secret (%q)", leak)
				}
				p.term(t)
				if code, exited := p.waitExit(shutdownTimeout + 20*time.Second); !exited || code != 0 {
					t.Errorf("%s did not stop cleanly on SIGTERM (exited %v, status %d):\n%s", p.name, exited, code, p.tail(3000))
				}
			}
			s.waitSettled(time.Minute)
			r := s.verify() // the platform password in any table
			for _, secret := range secrets {
				if secret == "" {
					t.Fatalf("a secret of the case is empty: %q", secrets)
				}
				if leaks := s.secretInRows(ctx, secret); len(leaks) > 0 {
					t.Errorf("a secret (%q) is stored in %s", secret, strings.Join(leaks, ", "))
				}
			}
			s.mu.Lock()
			procs := append([]*proc(nil), s.procs...)
			s.mu.Unlock()
			for _, p := range procs {
				if leak := findSecret(p.logBytes(), secrets); leak != "" {
					t.Errorf("%s logged a secret (%q):\n%s", p.name, leak, p.tail(3000))
				}
			}
			t.Logf("%q: lint, start-up and delivery with both DATABASE_URL forms; %s", tc.value, r)
		})
	}
}

// TestSecretsThatCannotWork covers values that cannot reach their
// destination unchanged: the platform credentials travel in a JSON body,
// which holds only UTF-8 text, so a value that is not valid UTF-8 would
// arrive altered (and be refused for ever); a NUL cannot be in an
// environment variable at all, but a percent-encoded %00 in DATABASE_URL's
// password decodes to one, which no PostgreSQL password holds. Start-up
// must refuse each, naming the variable and not printing the value, and
// lint must refuse what start-up refuses.
func TestSecretsThatCannotWork(t *testing.T) {
	scenario(t, light, 2*time.Second)
	s := newStack(t, stackOptions{})
	u, err := url.Parse(s.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", "QzNul31\x00tail")
	cases := []struct {
		name, variable, value string
		lint                  bool // lint checks it too (it skips the platform credentials when unset only)
	}{
		{"PasswordNotUTF8", "PLATFORM_ACCESS_PWD", "QzBad30\xff\xfe", true},
		{"NameNotUTF8", "PLATFORM_ACCESS_NAME", "QzBad32\xc3(", true},
		{"DatabasePasswordWithNUL", "DATABASE_URL", u.String(), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			secrets := []string{tc.value, secretToken.FindString(tc.value)}
			env := map[string]string{tc.variable: tc.value}
			if tc.lint {
				out, code := lint(t, merged(s.env, env))
				if code == 0 {
					t.Errorf("forwarder lint accepted %s that cannot work:\n%s", tc.variable, out)
				} else if !strings.Contains(out, tc.variable) {
					t.Errorf("forwarder lint refused without naming %s:\n%s", tc.variable, out)
				}
				if leak := findSecret([]byte(out), secrets); leak != "" {
					t.Errorf("forwarder lint printed the secret (%q):\n%s", leak, out)
				}
			}
			p := s.startExpectingExit("forwarder-"+tc.name, env)
			out := p.logBytes()
			t.Logf("refused:\n%s", p.tail(600))
			if !bytes.Contains(out, []byte(tc.variable)) {
				t.Errorf("start-up refused without naming %s:\n%s", tc.variable, p.tail(3000))
			}
			if leak := findSecret(out, secrets); leak != "" {
				t.Errorf("start-up printed the secret (%q):\n%s", leak, p.tail(3000))
			}
		})
	}
}

// passwordCluster starts a private PostgreSQL server whose roles other
// than postgres must give their password (scram-sha-256), and checks that
// a wrong password is refused: otherwise the database half of the secret
// tests would pass whatever the forwarder sent.
func passwordCluster(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	c := pgtest.StartCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The server writes its own pg_hba.conf (it owns the data directory).
	hba := filepath.Join(c.Dir(), "pg_hba.conf")
	if _, err := conn.Exec(ctx, `COPY (SELECT unnest(ARRAY[
			'local all all trust',
			'host all postgres 127.0.0.1/32 trust',
			'host all all 127.0.0.1/32 scram-sha-256'])) TO `+pgtest.QuoteLiteral(hba)); err != nil {
		t.Fatalf("writing %s: %v", hba, err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	createRole(t, c, "fwd_probe", "QzRight40")
	wrong := roleURL(t, c.DSN("postgres"), "fwd_probe", "QzWrong41")
	right := roleURL(t, c.DSN("postgres"), "fwd_probe", "QzRight40")
	deadline := time.Now().Add(30 * time.Second)
	for {
		bad, errBad := pgx.Connect(ctx, wrong)
		if errBad == nil {
			bad.Close(ctx)
		}
		good, errGood := pgx.Connect(ctx, right)
		if errGood == nil {
			good.Close(ctx)
		}
		if errBad != nil && errGood == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the private server does not check passwords: a wrong one gives %v, the right one %v", errBad, errGood)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createRole creates a login role with password pwd.
func createRole(t *testing.T, c *pgcluster.Cluster, role, pwd string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// CREATE ROLE takes no parameters: the password is a literal.
	if _, err := conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD "+pgtest.QuoteLiteral(pwd)); err != nil {
		t.Fatalf("creating role %s: %v", role, err)
	}
}

// grantSchema lets role use the stack's migrated database as the
// forwarder does: read and write every table, create in the schema.
func grantSchema(t *testing.T, s *stack, role string) {
	t.Helper()
	r := pgx.Identifier{role}.Sanitize()
	var db string
	if err := s.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"GRANT ALL ON DATABASE " + pgx.Identifier{db}.Sanitize() + " TO " + r,
		"GRANT ALL ON SCHEMA public TO " + r,
		"GRANT ALL ON ALL TABLES IN SCHEMA public TO " + r,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO " + r,
		"GRANT ALL ON ALL FUNCTIONS IN SCHEMA public TO " + r,
	} {
		if _, err := s.pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// roleURL is dsn (a URL) with the user and password replaced; net/url
// percent-encodes what the password needs.
func roleURL(t *testing.T, dsn, role, pwd string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, pwd)
	return u.String()
}

// roleKeywordDSN is dsn in libpq's key=value form, with the user and
// password replaced: values in single quotes, ' and \ escaped by \.
func roleKeywordDSN(t *testing.T, dsn, role, pwd string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := func(v string) string { return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'" }
	return strings.Join([]string{
		"host=" + q(u.Hostname()), "port=" + q(u.Port()), "dbname=" + q(strings.TrimPrefix(u.Path, "/")),
		"user=" + q(role), "password=" + q(pwd), "sslmode=" + q(u.Query().Get("sslmode")),
	}, " ")
}

// findSecret returns the first of secrets found in b, "" when none is.
func findSecret(b []byte, secrets []string) string {
	for _, s := range secrets {
		if s != "" && bytes.Contains(b, []byte(s)) {
			return s
		}
	}
	return ""
}

// lint runs `forwarder lint pipelines/forwarder.yaml` from the repository
// root with exactly env (plus PATH and HOME) and returns its output and
// exit code.
func lint(t *testing.T, env map[string]string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testinputs.Forwarder(t, forwarderBin), "lint", "pipelines/forwarder.yaml")
	cmd.Dir = repoRoot
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if exit, ok := err.(*exec.ExitError); ok {
		return string(out), exit.ExitCode()
	}
	if err != nil {
		t.Fatalf("running forwarder lint: %v", err)
	}
	return string(out), 0
}
