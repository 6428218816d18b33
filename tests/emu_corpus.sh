#!/bin/sh
# The GPU's kernels on the CPU (runtime/emu.c), through the tool.
#
#   emu_corpus.sh run FUSEC TRACE
#       TRACE on the emulated GPU at B,T = 1,1 / 3,17 / 17,3 / 2,100 with
#       the 32-bit index variant, and at 3,17 with the 64-bit one
#       (FUSEC_EMU_INDEX_BITS=64; the runner picks 32 bits at these sizes),
#       every output checked against the interpreter (--check) and every
#       kernel checked by the emulator (bounds, races, shuffles, barriers).
#       Symbols a trace lacks are ignored. Sizes: 1 and 17 are smaller
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
	for bt in 1,1 3,17 17,3 2,100; do
		b=${bt%,*}
		t=${bt#*,}
		if ! "$fusec" run "$trace" --device emu --bind "B=$b,T=$t" --check \
			>"$tmp" 2>&1; then
			echo "FAIL $name at B=$b,T=$t (32-bit indices):"
			cat "$tmp"
			fail=1
		fi
	done
	if ! FUSEC_EMU_INDEX_BITS=64 "$fusec" run "$trace" --device emu --bind B=3,T=17 \
		--check >"$tmp" 2>&1; then
		echo "FAIL $name at B=3,T=17 (64-bit indices):"
		cat "$tmp"
		fail=1
	fi
	[ $fail = 0 ] && echo "ok $name: 5 runs on emu, checked"
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
