#!/bin/sh
# Compile time of chained row reductions in one region (issue 23.10):
# x_k = exp(x_{k-1} - r_k), r_{k+1} = sum or amax of x_k along the row, for
# N reductions, written by this script, each region built, optimized and
# emitted by bench_codegen (host: ORC; sm_90: PTX), with the peak memory
# of the process. Before the chain (codegen/reduction.c) a looping pass
# computed its value from the region's inputs through the whole chain, so
# the IR grew as N^2 and the compile time about as N^3.
#
#     tools/bench/chain_reductions.sh [BUILD_DIR] [OUT_JSON]
#
# $NS overrides the chain lengths (default 8 16 24 35), $ROW the row
# (default bf16[B, 8192]: the rows the issue timed; "f32[B, T]" for a
# symbolic one), $TARGETS the targets (default host sm_90).
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${2:-}
ns=${NS:-8 16 24 35}
row=${ROW:-bf16[B, 8192]}
targets=${TARGETS:-host sm_90}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
json="{\"bench\": \"chain_reductions\", \"row\": \"$row\", \"commit\": \"$(git -C "$root" rev-parse --short HEAD 2>/dev/null)\", \"runs\": ["
sep=
for n in $ns; do
	f=$tmp/chain$n.trace
	{
		echo "trace chain$n(x0: $row) {"
		k=1
		while [ $k -le "$n" ]; do
			op=sum
			[ $((k % 2)) = 1 ] && op=amax
			echo "  r$k = $op(x$((k - 1)), dims=[1], keepdim=true)"
			echo "  x$k = exp(sub(x$((k - 1)), r$k))"
			k=$((k + 1))
		done
		echo "  return x$n"
		echo "}"
	} >"$f"
	for t in $targets; do
		/usr/bin/time -f "%e %M" -o "$tmp/time" "$build/tools/bench/bench_codegen" \
			--target "$t" --each "$f" >"$tmp/out"
		kernels=$(grep -c '^  region' "$tmp/out")
		set -- $(cat "$tmp/time")
		printf 'N=%-3s %-6s %d kernels  %6.2f s  %7d KB\n' "$n" "$t" "$kernels" "$1" "$2"
		json="$json$sep{\"n\": $n, \"target\": \"$t\", \"kernels\": $kernels, \"seconds\": $1, \"max_rss_kb\": $2}"
		sep=", "
	done
done
json="$json]}"
[ -n "$out" ] && echo "$json" >"$out"
exit 0
