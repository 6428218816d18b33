#!/bin/sh
# The GPU's kernels on the CPU (runtime/emu.c), through the tool.
#
#   emu_corpus.sh run FUSEC TRACE
#       TRACE on the emulated GPU at B,T = 1,1 / 3,17 / 17,3 / 2,100 with
#       the 32-bit index variant, and at 3,17 with the 64-bit one
#       (FUSEC_EMU_INDEX_BITS=64; the runner picks 32 bits at these sizes),
#       and at 2,100 with grids of at most 3 blocks (FUSEC_EMU_MAX_GRID=3),
#       so every grid-stride loop over elements or rows runs several
#       iterations and a tail, as 2,1000 would on a full grid,
#       every output checked against the interpreter (--check) and every
#       kernel checked by the emulator (bounds, races, shuffles, barriers).
#       Symbols a trace lacks are ignored (a file with neither B nor T runs
#       its one size once per variant). Sizes: 1 and 17 are smaller
#       than a warp and a lane group, 3 and 17 leave grid-stride and row
#       tails, 2,100 runs more rows than a block has threads.
#   emu_corpus.sh fault FUSEC TRACE FAULT MESSAGE
#       TRACE with FUSEC_EMU_FAULT=FAULT must fail (exit 1) with MESSAGE
#       in its error: the seeded fault is caught.
set -u
mode=$1
fusec=$2
trace=$3
name=$(basename "$trace" .trace)
tmp=${TMPDIR:-/tmp}/emu_corpus.$$
trap 'rm -f "$tmp"' EXIT

case $mode in
run)
	fail=0
	runs=0
	for bt in 1,1 3,17 17,3 2,100; do
		b=${bt%,*}
		t=${bt#*,}
		runs=$((runs + 1))
		if ! "$fusec" run "$trace" --device emu --bind "B=$b,T=$t" --check \
			>"$tmp" 2>&1; then
			echo "FAIL $name at B=$b,T=$t (32-bit indices):"
			cat "$tmp"
			fail=1
		fi
		# a trace of fixed shapes: the other sizes would run the same
		if grep -q -- "--bind B: no trace" "$tmp" &&
		   grep -q -- "--bind T: no trace" "$tmp"; then
			break
		fi
	done
	if ! FUSEC_EMU_INDEX_BITS=64 "$fusec" run "$trace" --device emu --bind B=3,T=17 \
		--check >"$tmp" 2>&1; then
		echo "FAIL $name at B=3,T=17 (64-bit indices):"
		cat "$tmp"
		fail=1
	fi
	if ! FUSEC_EMU_MAX_GRID=3 "$fusec" run "$trace" --device emu --bind B=2,T=100 \
		--check >"$tmp" 2>&1; then
		echo "FAIL $name at B=2,T=100 (grids of at most 3 blocks):"
		cat "$tmp"
		fail=1
	fi
	[ $fail = 0 ] && echo "ok $name: $((runs + 2)) runs on emu, checked"
	exit $fail
	;;
fault)
	fault=$4
	msg=$5
	FUSEC_EMU_FAULT=$fault "$fusec" run "$trace" --device emu --bind B=2,T=5 \
		--check >"$tmp" 2>&1
	rc=$?
	if [ $rc != 1 ]; then
		echo "FAIL: fault '$fault' on $name: exit $rc, expected 1"
		cat "$tmp"
		exit 1
	fi
	if ! grep -q -- "$msg" "$tmp"; then
		echo "FAIL: fault '$fault' on $name: no '$msg' in:"
		cat "$tmp"
		exit 1
	fi
	grep -- "$msg" "$tmp" | head -1
	exit 0
	;;
*)
	echo "usage: emu_corpus.sh run FUSEC TRACE | fault FUSEC TRACE FAULT MESSAGE" >&2
	exit 2
	;;
esac
