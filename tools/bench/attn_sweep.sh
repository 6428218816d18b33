#!/bin/sh
# attn_sweep.sh [FUSEC [LENGTHS [DIMS]]]: the whole attention sweep against
# the interpreter on the CPU: query/key lengths 1, 17, 64, 127, 128, 129,
# 1000, 4097 (or the comma-separated LENGTHS), head dims 64, 80, 128 (or
# DIMS), f32 and bf16, each with every variant of tools/gen/attn_cases.py
# (plain, causal, GQA 4:1, bool padding mask, sliding window, softcap with
# a float mask, the decomposed eager form). Each file's line ends with the
# seconds it took. At 4097 the f64 interpreter's attention is most of a
# file's time (it skips the keys a causal mask or window hides and uses
# every CPU): 2 to 5 minutes a file on a loaded 2-core VM. attn_sweep.py
# runs the same traces one at a time and records them as JSON.
here=$(cd "$(dirname "$0")/../.." && pwd)
fusec=${1:-$here/build/tools/fusec}
lengths=$(echo "${2:-1,17,64,127,128,129,1000,4097}" | tr ',' ' ')
dims=$(echo "${3:-64,80,128}" | tr ',' ' ')
for T in $lengths; do
	for D in $dims; do
		for dt in f32 bf16; do
			printf 'T=%s D=%s %s: ' "$T" "$D" "$dt"
			t0=$(date +%s)
			sh "$here/tests/attention_run.sh" "$fusec" "$here" "$T" "$D" "$dt" | grep '^check' || echo FAILED
			echo "  ($(($(date +%s) - t0)) s)"
		done
	done
done
