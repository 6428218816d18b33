#!/bin/sh
# dist_run.sh: distributed traces through the tools, end to end.
#
#     sh tests/dist_run.sh FUSEC SOURCE_DIR WORK_DIR
#
#   - FSDP Llama traces (tools/gen/fsdp_llama.py, 2 layers, small) at
#     world 2, 4 and 8: `fusec run --device cpu --world N --check` runs N
#     ranks on threads with exact collectives and compares every rank's
#     outputs with the interpreter running all N ranks (f32; bf16 at 2);
#   - the scheduled trace (`fusec plan --print-trace`) checks and runs;
#   - `fusec sim --json` on a larger FSDP trace: scheduled exposed
#     communication below the written order's, the same compute, and peak
#     unsharded bytes within the inflight cap;
#   - bad input: a world that does not match the trace (run, plan, sim), a
#     reduce_scatter dim the world does not divide, sim without --world.
set -eu
fusec=$1
src=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
fails=0
export FUSEC_CACHE_DIR="$work/cache"

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

gen() { # world dtype out (head dim 8: attention decomposed, as the
	# attention kernels take head dims that are multiples of 16)
	python3 "$src/tools/gen/fsdp_llama.py" --world "$1" --layers 2 --hidden 32 \
		--heads 4 --intermediate 64 --vocab 64 --dtype "$2" \
		--attention decomposed -o "$3"
}

for n in 2 4 8; do
	gen $n f32 "$work/f$n.trace"
	if "$fusec" run "$work/f$n.trace" --device cpu --world $n --bind B=2,T=8 \
		--check > "$work/run$n.out" 2>&1; then
		grep -q "check: ok" "$work/run$n.out" || fail "world $n: no check line"
	else
		cat "$work/run$n.out"
		fail "world $n: run --check"
	fi
done
gen 2 bf16 "$work/b2.trace"
"$fusec" run "$work/b2.trace" --device cpu --world 2 --bind B=1,T=8 --check \
	> "$work/runb2.out" 2>&1 || { cat "$work/runb2.out"; fail "bf16 world 2"; }

# the scheduled trace is a trace: it checks, and runs to the same check
"$fusec" plan "$work/f4.trace" --bind B=2,T=8 --max-inflight-bytes 64K \
	--print-trace > "$work/s4.trace" || fail "plan --print-trace"
"$fusec" check "$work/s4.trace" || fail "the scheduled trace does not check"
"$fusec" run "$work/s4.trace" --device cpu --world 4 --bind B=2,T=8 --check \
	> "$work/runs4.out" 2>&1 || { cat "$work/runs4.out"; fail "scheduled trace run"; }

# sim: scheduling hides communication the written order exposes
python3 "$src/tools/gen/fsdp_llama.py" --world 8 --layers 4 --hidden 1024 \
	--heads 8 --intermediate 2816 --vocab 4096 -o "$work/big.trace"
"$fusec" sim "$work/big.trace" --world 8 --bind B=1,T=1024 --trace-order --json \
	> "$work/sim_trace.json" || fail "sim --trace-order"
"$fusec" sim "$work/big.trace" --world 8 --bind B=1,T=1024 --json \
	--max-inflight-bytes 32M --svg "$work/sim.svg" > "$work/sim.json" || fail "sim"
python3 - "$work/sim_trace.json" "$work/sim.json" <<'PY' || fail "sim JSON"
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
for k in ("step_seconds", "compute_seconds", "comm_seconds",
          "exposed_comm_seconds", "peak_bytes", "peak_unsharded_bytes"):
    assert k in a and k in b, k
assert b["exposed_comm_seconds"] < a["exposed_comm_seconds"], (a, b)
assert b["step_seconds"] < a["step_seconds"], (a, b)
assert abs(a["compute_seconds"] - b["compute_seconds"]) < 1e-9 * a["compute_seconds"] + 1e-12
assert 0 < b["peak_unsharded_bytes"] <= 32 << 20, b
assert a["step_seconds"] >= max(a["compute_seconds"], a["comm_seconds"]) - 1e-12
assert b["step_seconds"] >= max(b["compute_seconds"], b["comm_seconds"]) - 1e-12
PY
grep -q "communication stream" "$work/sim.svg" || fail "svg lanes"

# bad input
expect() { # status pattern command...
	want=$1; pat=$2; shift 2
	set +e
	"$@" > "$work/bad.out" 2>&1
	got=$?
	set -e
	[ "$got" = "$want" ] || { cat "$work/bad.out"; fail "exit $got, not $want: $*"; }
	grep -q "$pat" "$work/bad.out" || { cat "$work/bad.out"; fail "no '$pat': $*"; }
}
expect 1 "written for world 2" "$fusec" run "$work/b2.trace" --world 4 --bind B=1,T=8
expect 1 "written for world 8" "$fusec" plan "$work/big.trace" --world 4
expect 1 "written for world 8" "$fusec" sim "$work/big.trace" --world 2
expect 2 "world N is required" "$fusec" sim "$work/big.trace"
printf 'trace g(x: f32[3, 4]) world 2 {\n  s = wait(reduce_scatter(x, dim=0))\n  return s\n}\n' \
	> "$work/nd.trace"
expect 1 "not divisible by the world size 2" "$fusec" check "$work/nd.trace"
expect 2 "bad size" "$fusec" plan "$work/f2.trace" --max-inflight-bytes 12Q

if [ $fails -ne 0 ]; then
	echo "$fails failure(s)"
	exit 1
fi
echo "dist_run: all passed"
