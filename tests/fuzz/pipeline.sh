#!/bin/sh
# pipeline.sh SECONDS [SEED]: the long run of the whole-pipeline fuzzer.
#
#   tests/fuzz/pipeline.sh 3600 7
#
# Runs build/tests/fuzz_pipeline (tests/fuzz/pipeline.c; `cmake --build
# build` makes it) against build/tools/fusec for SECONDS under nice -n 19,
# on cpu and emu, with SEED (default: the time). Failures are minimized and
# written, one trace file each, to $FUZZ_DIR (default build/fuzz-pipeline);
# the log is $FUZZ_DIR/log. Prints the seed, the count and every failure;
# exits 1 when a trace failed. KNOWN=tests/fuzz/known.txt counts the open
# bugs listed there instead of failing on them (the ctest pass does).
set -eu

secs=${1:-600}
seed=${2:-$(date +%s)}
case "$secs$seed" in
	''|*[!0-9]*) echo "usage: $0 SECONDS [SEED]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD_DIR:-$root/build}
out=${FUZZ_DIR:-$build/fuzz-pipeline}
mkdir -p "$out"
# the kernels compile with --no-cache; nothing touches the user's cache
status=0
nice -n 19 "$build/tests/fuzz_pipeline" --fusec "$build/tools/fusec" \
	--seed "$seed" --seconds "$secs" --out "$out" --timeout 120 ${KNOWN:+--known "$KNOWN"} \
	>"$out/log" 2>&1 || status=$?
grep -E '^(fuzz_pipeline|FAIL|written)' "$out/log" || true
exit $status
