// Package e2e holds the end-to-end reliability suite of the forwarder
// (docs/guarantees.md): the real bin/forwarder -c pipelines/forwarder.yaml run as
// child processes against a real PostgreSQL (internal/testsupport/pgtest), an in-process
// Kafka broker (kfake, living in the test process so it outlives the
// forwarders it serves) and the mock platform (internal/dev/mockplatform). The
// scenarios crash, restart, stop and overload those processes and then check,
// from outside, that nothing was lost: every good message delivered, every bad
// one FAILED with its reason, no row left PENDING or IN_PROGRESS.
//
// Everything is in the _test.go files; run it with
//
//	go test ./test/e2e/            # the whole suite (part of make test)
//	go test -short ./test/e2e/     # smaller loads
//	E2E_SEED=42 E2E_LOG_DIR=/tmp/e2e go test ./test/e2e/ -run TestKillNineUnderLoad -v
//
// The suite builds ./cmd/forwarder itself, unless FORWARDER_BIN names a
// binary to test (make test passes the bin/forwarder it has just built).
// E2E_SEED replays a run's random choices (each scenario logs it) and
// E2E_LOG_DIR keeps the forwarders' logs after the run.
//
// Each scenario logs its figures (messages, duplicates delivered, reclaim and
// drain times, peak concurrency); the assertions are about loss, duplicates
// and row states only, never about how long something took.
package e2e
