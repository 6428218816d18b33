#!/bin/sh
# Every f32 input through two builds' host kernels of exp, sigmoid and
# tanh, bit for bit (codegen/math.c: the host's vector exp with vscalefps
# against the generic IR). A is a build whose host kernels take the
# generic path (one from before the vector path, or a host without
# AVX-512), B the one to check; each emits its kernels for a trace of
# the three ops over 2^24 elements (fusec emit --target host), llc-19
# compiles both for this CPU, and exp_bits.c runs them on all 2^32 bit
# patterns, 2^24 at a time, and counts the results that differ (NaN as
# NaN). About a minute per op pair on one core.
#
#     tools/bench/exp_bits.sh A_BUILD [B_BUILD]
#
# Exit status 0 when nothing differs.
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
a=${1:?usage: exp_bits.sh A_BUILD [B_BUILD]}
b=${2:-$root/build}
llc=${LLC:-llc-19}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for ops in "exp sigmoid" "tanh sigmoid"; do
	set -- $ops
	printf 'trace bits(x: f32[16777216]) {\n  a = %s(x)\n  b = %s(x)\n  return a, b\n}\n' \
		"$1" "$2" > "$tmp/t.trace"
	for side in a b; do
		eval dir=\$$side
		"$dir/tools/fusec" emit "$tmp/t.trace" --target host | sed 1d |
			sed "s/fz_region_0_0/k$side/" > "$tmp/$side.ll"
		"$llc" -O3 -mcpu=native -filetype=obj "$tmp/$side.ll" -o "$tmp/$side.o"
	done
	cc -O2 -o "$tmp/bits" "$root/tools/bench/exp_bits.c" "$tmp/a.o" "$tmp/b.o" -lm
	"$tmp/bits" "$1" "$2" || status=1
done
exit $status
