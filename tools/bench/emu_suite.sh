#!/bin/sh
# emu_suite.sh BUILD_DIR [JOBS]: times the emulated-GPU suite (ctest -L emu)
# from a cold kernel cache, as CI runs it, and prints wall, user and system
# seconds. JOBS (default 2) is ctest's -j: CI's two cores.
#
#   sh tools/bench/emu_suite.sh build 2
#   emu suite: 42 tests, 0 failed; 2 jobs: 212.4 s wall, 380.1 s user, 9.3 s sys
#
# On a shared machine wall time includes waiting for the cores; (user +
# sys) / JOBS is what an idle machine with JOBS cores would take.
set -u
build=${1:?usage: emu_suite.sh BUILD_DIR [JOBS]}
jobs=${2:-2}
rm -rf "$build/tests/emu-cache"
log=${TMPDIR:-/tmp}/emu_suite.$$
start=$(date +%s.%N)
/usr/bin/time -f "%U %S" -o "$log.time" ctest --test-dir "$build" -L emu -j "$jobs" \
	>"$log" 2>&1
rc=$?
end=$(date +%s.%N)
n=$(grep -c "Test *#[0-9]*:" "$log")
failed=$(grep -c "\*\*\*Failed\|Timeout" "$log")
read -r user sys <"$log.time"
awk -v n="$n" -v f="$failed" -v j="$jobs" -v s="$start" -v e="$end" \
	-v u="$user" -v y="$sys" 'BEGIN {
	printf "emu suite: %d tests, %d failed; %d jobs: %.1f s wall, ", n, f, j, e - s
	printf "%.1f s user, %.1f s sys, (user+sys)/jobs %.1f s\n", u, y, (u + y) / j
}'
[ "$rc" = 0 ] || grep -B2 -A20 "Failed\|Timeout" "$log" | head -60
rm -f "$log" "$log.time"
exit $rc
