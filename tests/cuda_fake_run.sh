#!/bin/sh
# cuda_fake_run.sh: `fusec run --device cuda --world N` end to end, on the
# fake driver, cuBLASLt and NCCL of tests/fake (no GPU needed).
#
#     sh tests/cuda_fake_run.sh FUSEC FAKE_LIB WORK_DIR
#
# The tool finds the fake as it would find the real libraries: dlopen of
# libcuda.so.1 and libcublasLt.so.13 through LD_LIBRARY_PATH, and NCCL
# through FUSEC_NCCL_LIBRARY. Under the tool the fake runs no generated
# kernels (a test's hook does that: test_cuda_api's fsdp_llama_world2_on_fake),
# so the traces are collectives, waits and library calls (linear), in the
# FSDP pattern:
# sharded weights all-gathered, a gradient reduce-scattered, an activation
# all-reduced. Checked:
#   - world 2 on two fake devices passes --check against the interpreter
#     running both ranks, with 0 host synchronizations inside the steps;
#   - world 1 through NCCL (--world 1) passes --check, 0 host syncs;
#   - world 2 on one device is a clear error naming the missing device,
#     and a trace's world that --world contradicts is refused;
#   - --graph (world 1, and world 2 through NCCL): the run captured once
#     per process or rank and launched per iteration, the same check, 0
#     host syncs; --device cpu --graph is refused.
set -eu
fusec=$1
fake=$2
work=$3
rm -rf "$work"
mkdir -p "$work/lib"
ln -s "$fake" "$work/lib/libcuda.so.1"
ln -s "$fake" "$work/lib/libcublasLt.so.13"
export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FUSEC_NCCL_LIBRARY="$fake"
export FUSEC_CACHE_DIR="$work/cache"
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

for w in 1 2; do
	cat >"$work/fsdp$w.trace" <<TRACE
trace fsdp(x: f32[B, 16], w1_s: f32[$((16 / w)), 16], w2_s: f32[$((8 / w)), 16],
           b_s: f32[$((8 / w))]) world $w {
  w1 = wait(all_gather(w1_s, dim=0))
  h = linear(x, w1)
  w2 = wait(all_gather(w2_s, dim=0))
  b = wait(all_gather(b_s, dim=0))
  y = linear(h, w2, b)
  g = linear(w1, w1)
  gs = wait(reduce_scatter(g, dim=0))
  s = wait(all_reduce(y))
  return s, gs
}
TRACE
	if FAKE_CUDA_DEVICES=2 "$fusec" run "$work/fsdp$w.trace" --device cuda \
		--world $w --bind B=3 --iters 3 --check --json >"$work/run$w.json" \
		2>"$work/run$w.err"; then
		grep -q '"device": "cuda"' "$work/run$w.json" || fail "world $w: not on cuda"
		grep -q '"ok": true' "$work/run$w.json" || fail "world $w: check"
		grep -Eq '"host_syncs_in_steps": 0[,}]' "$work/run$w.json" ||
			fail "world $w: host syncs inside steps"
	else
		cat "$work/run$w.json" "$work/run$w.err"
		fail "world $w: fusec run --device cuda --check"
	fi
done
# the human-readable line says where the ranks ran
FAKE_CUDA_DEVICES=2 "$fusec" run "$work/fsdp2.trace" --device cuda --bind B=2 \
	>"$work/run2.out" 2>&1 || { cat "$work/run2.out"; fail "world 2 (no --world)"; }
grep -q "2 ranks on CUDA devices" "$work/run2.out" || fail "world 2: where it ran"

# one device for two ranks: rank 1's device is missing, said plainly
if FAKE_CUDA_DEVICES=1 "$fusec" run "$work/fsdp2.trace" --device cuda --bind B=2 \
	>"$work/one.out" 2>&1; then
	fail "world 2 on one device ran"
fi
grep -q "rank 1: CUDA device 1 does not exist" "$work/one.out" ||
	{ cat "$work/one.out"; fail "world 2 on one device: the message"; }
if FAKE_CUDA_DEVICES=2 "$fusec" run "$work/fsdp2.trace" --device cuda --world 1 \
	--bind B=2 >"$work/mismatch.out" 2>&1; then
	fail "--world 1 on a world-2 trace ran"
fi
grep -q "is written for world 2" "$work/mismatch.out" || fail "the world mismatch message"

# --graph: captured once, launched per iteration (one process, and per rank
# through NCCL), the same check; a device without graphs refuses it
for w in 1 2; do
	if FAKE_CUDA_DEVICES=2 "$fusec" run "$work/fsdp$w.trace" --device cuda \
		--bind B=3 --iters 4 --graph --check --json >"$work/graph$w.json" \
		2>"$work/graph$w.err"; then
		grep -q '"ok": true' "$work/graph$w.json" || fail "--graph world $w: check"
		grep -q "\"graph_captures\": $w, \"graph_launches\": $((4 * w))" \
			"$work/graph$w.json" || fail "--graph world $w: captures and launches"
		grep -Eq '"host_syncs_in_steps": 0[,}]' "$work/graph$w.json" ||
			fail "--graph world $w: host syncs"
	else
		cat "$work/graph$w.json" "$work/graph$w.err"
		fail "--graph world $w"
	fi
done
if "$fusec" run "$work/fsdp1.trace" --device cpu --bind B=2 --graph \
	>"$work/cpugraph.out" 2>&1; then
	fail "--graph on the cpu ran"
fi
grep -q "device 'cpu' cannot capture a run into a graph" "$work/cpugraph.out" ||
	{ cat "$work/cpugraph.out"; fail "--graph on the cpu: the message"; }

[ $fails -eq 0 ] && echo "cuda_fake_run: ok"
exit $fails
