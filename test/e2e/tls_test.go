package e2e_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// TestPostgresVerifiedTLS runs the forwarder with sslmode=verify-full
// against a server whose certificate, for 127.0.0.1, is signed by a CA the
// test makes with openssl (docs/deployment.md, "TLS to PostgreSQL"): the
// service connects over TLS and delivers. A CA that did not sign the
// certificate, or a host name the certificate does not name, is refused at
// start-up and by `outbox migrate` with an error that says so, and neither
// prints the connection string or its password.
func TestPostgresVerifiedTLS(t *testing.T) {
	scenario(t, light, 12*time.Second)
	dir := t.TempDir()
	ca := makeCA(t, dir, "ca")
	makeCA(t, dir, "other-ca")
	cert, key := makeServerCert(t, dir, ca, "IP:127.0.0.1")

	pg := pgtest.StartCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := pg.EnableTLS(ctx, cert, key); err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{cluster: pg})
	const password = "Pw-TLS-LEAKCHECK-9Zq" // ignored by the server (trust), must never be printed
	tlsURL := func(host, rootCert string) string {
		u, err := url.Parse(s.dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("postgres", password)
		u.Host = fmt.Sprintf("%s:%d", host, pg.Port)
		q := u.Query()
		q.Set("sslmode", "verify-full")
		q.Set("sslrootcert", rootCert)
		u.RawQuery = q.Encode()
		return u.String()
	}
	good := tlsURL("127.0.0.1", filepath.Join(dir, "ca.crt"))
	waitForTLS(t, good)

	t.Run("ConnectsAndDelivers", func(t *testing.T) {
		s.env["DATABASE_URL"] = good
		s.produce(s.newSource(eventgen.SourceConfig{}), 200)
		s.start("forwarder-tls", nil)
		s.waitSettled(3 * time.Minute)
		r := s.verify()
		var plain int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl l USING (pid)
			WHERE a.datname = current_database() AND a.application_name LIKE 'forwarder%' AND NOT l.ssl`).Scan(&plain); err != nil {
			t.Fatal(err)
		}
		if plain > 0 {
			t.Errorf("%d sessions of the service are not encrypted", plain)
		}
		t.Logf("sslmode=verify-full: %s", r)
	})

	for _, c := range []struct {
		name, url, want string
	}{
		{"AnotherCAIsRefused", tlsURL("127.0.0.1", filepath.Join(dir, "other-ca.crt")), "certificate signed by unknown authority"},
		{"AnotherHostNameIsRefused", tlsURL("localhost", filepath.Join(dir, "ca.crt")), "wanted to match localhost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := mergeEnv(s.env, map[string]string{"DATABASE_URL": c.url})
			p := startProc(t, "forwarder-"+strings.ToLower(c.name), env)
			p.mayExit = true
			code, exited := p.waitExit(time.Minute)
			if !exited || code == 0 {
				t.Fatalf("the service started (exited %v, status %d) with %s:\n%s", exited, code, c.name, p.tail(3000))
			}
			out, err := runForwarder(t, env, "outbox", "migrate")
			for what, text := range map[string]string{"start-up": string(p.logBytes()), "outbox migrate": out} {
				if !strings.Contains(text, c.want) || !strings.Contains(text, "certificate") {
					t.Errorf("%s: the error does not say %q:\n%s", what, c.want, text)
				}
				if strings.Contains(text, password) || strings.Contains(text, c.url) || strings.Contains(text, "sslrootcert=") {
					t.Errorf("%s: the error shows the connection string or its password:\n%s", what, text)
				}
			}
			if err == nil {
				t.Errorf("outbox migrate succeeded with %s:\n%s", c.name, out)
			}
			t.Logf("start-up: %s", lastLine(string(p.logBytes()), c.want))
		})
	}
}

// makeCA makes a certificate authority: name.crt and name.key in dir.
func makeCA(t *testing.T, dir, name string) string {
	t.Helper()
	openssl(t, dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", name+".key", "-out", name+".crt", "-days", "2", "-subj", "/CN=forwarder test "+name,
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
	return name
}

// makeServerCert makes a server certificate signed by ca for the subject
// alternative name san, and returns it and its key (PEM).
func makeServerCert(t *testing.T, dir, ca, san string) (cert, key []byte) {
	t.Helper()
	openssl(t, dir, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=forwarder test server")
	if err := os.WriteFile(filepath.Join(dir, "server.ext"), []byte("subjectAltName="+san+"\nextendedKeyUsage=serverAuth\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	openssl(t, dir, "x509", "-req", "-in", "server.csr", "-CA", ca+".crt", "-CAkey", ca+".key", "-CAcreateserial",
		"-out", "server.crt", "-days", "2", "-extfile", "server.ext")
	cert, err := os.ReadFile(filepath.Join(dir, "server.crt"))
	if err != nil {
		t.Fatal(err)
	}
	key, err = os.ReadFile(filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func openssl(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// waitForTLS waits until dsn connects (the server's reload that turned TLS
// on is asynchronous).
func waitForTLS(t *testing.T, dsn string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, dsn)
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TLS connection to the server: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
