#!/bin/sh
# attention_run.sh FUSEC SRC [lengths dims dtypes]...: attention traces
# (tools/gen/attn_cases.py: the primitive forward and backward, plain,
# causal, GQA 4:1, a bool padding mask, a sliding window, softcap with a
# float mask, and the decomposed eager form) run on the CPU's fused kernels
# (or, with ATTN_DEVICE=emu, the GPU's on the emulator) and checked against
# the reference interpreter. Each group of three arguments after SRC is one
# file of cases. CI runs a subset (tests/CMakeLists.txt);
# tools/bench/attn_sweep.sh the whole sweep.
set -e
fusec=$1
src=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export FUSEC_CACHE_DIR="$dir/cache"
n=0
while [ $# -ge 3 ]; do
	n=$((n + 1))
	python3 "$src/tools/gen/attn_cases.py" --lengths "$1" --dims "$2" --dtypes "$3" \
		-o "$dir/cases$n.trace"
	if ! "$fusec" run "$dir/cases$n.trace" --device "${ATTN_DEVICE:-cpu}" --check \
		>"$dir/out" 2>&1; then
		cat "$dir/out"
		exit 1
	fi
	grep -E '^check|^trace .*(eager|gqa)' "$dir/out"
	shift 3
done
