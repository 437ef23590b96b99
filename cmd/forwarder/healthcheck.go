package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// defaultHTTPAddr is the HTTP server address of pipelines/forwarder.yaml
// when HTTP_ADDR is not set.
const defaultHTTPAddr = "0.0.0.0:4195"

// healthcheckCommand is `forwarder healthcheck`: the container image has no
// shell and no curl, so a runtime that checks health by running a command
// (Docker's HEALTHCHECK, compose's healthcheck) runs the binary itself.
func healthcheckCommand() *cli.Command {
	return &cli.Command{
		Name:  "healthcheck",
		Usage: "Exit 0 when the running service answers GET /ready with 200, 1 otherwise (for runtimes without a shell)",
		Description: `Asks the forwarder's own HTTP server, at HTTP_ADDR (or --addr) as the
pipeline sets it, whether every input and output is connected. An
unspecified host (0.0.0.0, ::, empty) is asked on the loopback address.

  forwarder healthcheck               # GET http://127.0.0.1:4195/ready
  forwarder healthcheck --path /ping  # liveness only`,
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    "addr",
				Usage:   "address of the service's HTTP server, host:port",
				EnvVars: []string{"HTTP_ADDR"},
				Value:   defaultHTTPAddr,
			},
			&cli.StringFlag{
				Name:  "path",
				Usage: "endpoint to ask: /ready (inputs and outputs connected) or /ping (process up)",
				Value: "/ready",
			},
			&cli.DurationFlag{
				Name:  "timeout",
				Usage: "how long to wait for the answer",
				Value: 5 * time.Second,
			},
		},
		// A mistaken command line is one line and exit status 1, "not
		// healthy", whatever runs it: Docker reserves 2, and urfave/cli's
		// page of help would fill the health log. An argument is refused:
		// urfave/cli reads no flag after one.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return cli.Exit("forwarder healthcheck: "+err.Error()+" (see --help)", 1)
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return cli.Exit(fmt.Sprintf("forwarder healthcheck: unexpected argument %q: this command takes flags only (see --help)", c.Args().First()), 1)
			}
			// http.Client reads 0 and below as no timeout at all: a check
			// of a service that hangs would hang too.
			if t := c.Duration("timeout"); t <= 0 {
				return cli.Exit(fmt.Sprintf("forwarder healthcheck: --timeout %s: want a duration above zero", t), 1)
			}
			url, err := healthcheckURL(c.String("addr"), c.String("path"))
			if err != nil {
				return cli.Exit("forwarder healthcheck: "+err.Error(), 1)
			}
			if err := probe(c.Context, url, c.Duration("timeout")); err != nil {
				return cli.Exit("forwarder healthcheck: "+err.Error(), 1)
			}
			fmt.Fprintf(c.App.Writer, "%s: ready\n", url)
			return nil
		},
	}
}

// healthcheckURL is the URL of path on the server listening on addr. A
// server listening on every interface is reached on the loopback one.
func healthcheckURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("address %q (HTTP_ADDR or --addr) is not host:port: %v", addr, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// probe GETs url and returns nil only for a 200.
func probe(ctx context.Context, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: timeout}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("service not reachable: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
