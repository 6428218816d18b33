#!/bin/sh
# compile_run.sh: after `fusec compile`, a run at the same sizes compiles 0.
#
#     sh tests/compile_run.sh FUSEC SOURCE_DIR WORK_DIR [BINDINGS]
#
# BINDINGS, space-separated, default "B=2,T=16 B=3,T=17" (the sanitized
# build gives the first alone: its compiles are several times slower, and
# the corpus runs at B=2,T=16 there too).
# For every trace of the corpus (tests/traces, the PyTorch exports among
# them), into one fresh cache: `fusec compile --target host --bind ...`,
# then `fusec run --bind ... --json` at those sizes must report
# "compiled": 0 and pass --check. Both commands decide which kernels a
# program needs through one module (runtime/kernels.c): the per-op kernels
# of regions the skeletons do not take whole and the copies of reshapes
# that are not views included, so a disagreement shows here as a kernel
# compiled by the run. Then the whole corpus in one `fusec compile` (its
# kernel thread overlapping the planning of the next file), and every run
# from that cache must compile 0 as well.
set -eu
fusec=$1
src=$2
work=$3
binds=${4:-B=2,T=16 B=3,T=17}
rm -rf "$work"
mkdir -p "$work"
fails=0
n=0
field() {
	printf '%s\n' "$2" | sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p"
}
# runs_cached FILE BIND CACHE WHAT [--check]: the run must succeed (and
# pass --check where asked) and compile nothing
runs_cached() {
	out=$("$fusec" run "$1" --bind "$2" --cache-dir "$3" ${5:-} --json \
		2>"$work/run.err") || {
		echo "FAIL: $4: fusec run failed: $out"
		cat "$work/run.err"
		fails=$((fails + 1))
		return
	}
	c=$(field compiled "$out")
	if [ "$c" != 0 ]; then
		echo "FAIL: $4: the run compiled $c kernels after compile"
		fails=$((fails + 1))
	fi
	n=$((n + 1))
}
for bind in $binds; do
	for f in "$src"/tests/traces/*.trace; do
		name=$(basename "$f" .trace)
		if ! "$fusec" compile --target host --bind "$bind" \
			--cache-dir "$work/cache" "$f" >"$work/compile.out" 2>&1; then
			echo "FAIL: $name ($bind): fusec compile failed:"
			cat "$work/compile.out"
			fails=$((fails + 1))
			continue
		fi
		runs_cached "$f" "$bind" "$work/cache" "$name ($bind)" --check
	done
done
# The whole corpus in one `fusec compile`, whose kernel thread builds each
# trace's kernels while the next is planned: every run then compiles 0 too.
bind=B=2,T=16
if ! "$fusec" compile --target host --bind "$bind" --cache-dir "$work/cache1" \
	"$src"/tests/traces/*.trace >"$work/compile.out" 2>&1; then
	echo "FAIL: fusec compile of the whole corpus failed:"
	cat "$work/compile.out"
	fails=$((fails + 1))
fi
for f in "$src"/tests/traces/*.trace; do
	runs_cached "$f" "$bind" "$work/cache1" "$(basename "$f" .trace) (one compile)"
done
echo "$n passed, $fails failed"
[ "$fails" = 0 ]
