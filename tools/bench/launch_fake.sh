#!/bin/sh
# launch_fake.sh: the host work of one fz_exec_run on the CUDA target,
# counted, on a machine with no GPU.
#
#     sh tools/bench/launch_fake.sh BUILD_DIR [ITERS]
#
# Runs `bench_cuda launch` (a one-kernel program, fz_exec_run per call)
# against the fake driver of tests/fake (found as libcuda.so.1 through
# LD_LIBRARY_PATH) under callgrind, collecting only inside fz_exec_run, and
# prints instructions per call: all of them, the fake cuLaunchKernel's
# (a stand-in for the driver's own cost, which a GPU's raw launch
# measures), and what is left: the runner's and the CUDA target's own
# work per launch. Counted work, so the figure does not depend on the
# machine's load. The first call (which prepares, from a kernel cache
# warmed by an uncounted run) is included; ITERS (default 2000) + 100
# warm-up calls spread it.
set -eu
build=$1
iters=${2:-2000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$(cd "$build" && pwd)/tests/libfake_cuda.so" "$tmp/libcuda.so.1"
ln -s "$(cd "$build" && pwd)/tests/libfake_cuda.so" "$tmp/libcublasLt.so.13"
# a cache of its own, warmed first: the counted process compiles nothing
export FUSEC_CACHE_DIR="$tmp/cache"
LD_LIBRARY_PATH="$tmp" "$build/tools/bench/bench_cuda" launch --iters 10 >/dev/null
LD_LIBRARY_PATH="$tmp" valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" \
	--toggle-collect=fz_exec_run "$build/tools/bench/bench_cuda" launch \
	--iters "$iters" >"$tmp/log" 2>&1
callgrind_annotate --inclusive=yes "$tmp/cg" >"$tmp/ann" 2>/dev/null
total=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' "$tmp/ann")
fake=$(awk '/fake_cuda.c:cuLaunchKernel/ { gsub(",", "", $1); print $1; exit }' "$tmp/ann")
calls=$((iters + 100))
awk -v t="$total" -v f="${fake:-0}" -v n="$calls" 'BEGIN {
	printf "fz_exec_run: %.0f instructions per call over %d calls\n", t / n, n
	printf "  the fake cuLaunchKernel: %.0f\n", f / n
	printf "  fusec (runner and CUDA target): %.0f\n", (t - f) / n
}'
