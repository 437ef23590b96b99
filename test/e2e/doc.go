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
// E2E_SEED replays a run's random choices (each scenario logs it),
// E2E_LOG_DIR keeps the forwarders' logs after the run, and
// E2E_SCHEDULE_REPORT names a file each scenario appends how long it ran to
// (make test prints the longest ones after the suite).
//
// The scenarios run in parallel, each with its own database, Kafka
// cluster, mock platform, consumer group and ports, in three lanes
// (schedule_test.go), the longest first: those that keep the CPU busy two
// at a time (or alone, when their checks leave a loaded CPU little room),
// those that mostly wait two at a time, and, once both are done, those
// whose promise is about every instance following the shared platform
// state within a second (Retry-After, the breaker and the ramp, the rate
// limit, a pause) two at a time with nothing else beside them. go test's -parallel is raised for this package unless given;
// -parallel 1 runs the scenarios one by one.
//
// Each scenario logs its figures (messages, duplicates delivered, reclaim and
// drain times, peak concurrency); the assertions are about loss, duplicates
// and row states, and about time only where the promise is about time (a
// restart consuming within 15 s, a Retry-After pause, the ramp after an
// outage, the others delivered within 10 s while some messages fail, rows
// inserted after a failover attempted within a second (the median)), never
// about how fast something went.
package e2e
