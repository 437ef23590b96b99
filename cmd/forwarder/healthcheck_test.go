package main

import "testing"

// TestHealthcheckURL: the server's listen address becomes an address to
// call; a wildcard host is called on loopback.
func TestHealthcheckURL(t *testing.T) {
	for _, tc := range []struct{ addr, path, want string }{
		{"0.0.0.0:4195", "/ready", "http://127.0.0.1:4195/ready"},
		{":4195", "/ready", "http://127.0.0.1:4195/ready"},
		{"[::]:4195", "/ping", "http://[::1]:4195/ping"},
		{"10.1.2.3:8080", "ready", "http://10.1.2.3:8080/ready"},
		{"localhost:4195", "/ready", "http://localhost:4195/ready"},
	} {
		got, err := healthcheckURL(tc.addr, tc.path)
		if err != nil || got != tc.want {
			t.Errorf("healthcheckURL(%q, %q) = %q, %v; want %q", tc.addr, tc.path, got, err, tc.want)
		}
	}
	if _, err := healthcheckURL("4195", "/ready"); err == nil {
		t.Error(`healthcheckURL("4195") accepted an address without a host part`)
	}
}
