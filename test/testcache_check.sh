#!/usr/bin/env bash
# Checks that go test's result cache follows what a test of the forwarder
# binary reads through it (internal/testsupport/testinputs): after a mapping,
# the pipeline or the binary changes, the package runs again instead of
# replaying "(cached)".
#
#   make build && test/testcache_check.sh [package]   (default ./cmd/forwarder)
#
# It only touches files (their content stays the same). Set TEST_DATABASE_URL
# to use a running PostgreSQL; without it pgtest starts its own.
set -euo pipefail
cd "$(dirname "$0")/.."

pkg=${1:-./cmd/forwarder}
export FORWARDER_BIN=${FORWARDER_BIN:-$PWD/bin/forwarder}
[[ -x $FORWARDER_BIN ]] || { echo "no $FORWARDER_BIN: run make build first" >&2; exit 1; }

result() { go test "$pkg" 2>&1 | tail -n 1; }

# go test does not cache a run that read a file changed less than 2 s before,
# so each step waits that long after touching.
settle() { sleep 2.1; }

settle
result >/dev/null # whatever the cache held, it holds this run now
out=$(result)
if [[ $out != *"(cached)"* ]]; then
	echo "FAIL: a second run without changes was not cached: $out" >&2
	exit 1
fi
echo "unchanged inputs: $out"

for f in mappings/common.blobl mappings/vehicle_event.blobl pipelines/forwarder.yaml "$FORWARDER_BIN"; do
	touch "$f"
	settle
	out=$(result)
	if [[ $out == *"(cached)"* ]]; then
		echo "FAIL: touching $f replayed the cached result: $out" >&2
		exit 1
	fi
	echo "touched $f: ran again: $out"
	out=$(result)
	if [[ $out != *"(cached)"* ]]; then
		echo "FAIL: the run after it was not cached: $out" >&2
		exit 1
	fi
done
echo "ok: go test's cache follows the mappings, the pipeline and the binary"
