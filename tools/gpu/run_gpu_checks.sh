#!/bin/sh
# run_gpu_checks.sh: everything the CUDA target must show on a GPU, in one go.
#
#     tools/gpu/run_gpu_checks.sh FUSEC [REPO]
#
# FUSEC is a prebuilt `fusec` binary (the build is done elsewhere); REPO is
# the repository (default: the one holding this script). The bench binary
# is $BENCH_CUDA, else bench/bench_cuda beside FUSEC's folder
# (build/tools/bench/bench_cuda for build/tools/fusec). Results go to
# $RESULTS (default REPO/tools/bench/results) as JSON, one file per part,
# named by part and date; $QUICK=1 runs the sizes 1,1 and 3,17 only.
# $DEVICE (default cuda) names the device the sweep runs on: DEVICE=cpu
# is a dry run of this script's plumbing on a machine with no GPU (the
# GPU benchmarks then report themselves skipped).
#
# Parts:
#   1. probe        `fusec run --device cuda` on a small trace; no device:
#                   exit 77 with the reason
#   2. check sweep  `fusec run --device cuda --check` on every trace of
#                   tests/traces at B,T = 1,1 / 3,17 / 8,512, and on the
#                   exported nanoGPT, Llama and GPT-2 traces (fwd, bwd,
#                   ckpt; f32 and bf16) of tools/gpu/exported_traces.tar.gz,
#                   which were exported at those three sizes
#   3. launch       bench_cuda launch: median host time of fz_exec_run of a
#                   one-kernel program against raw cuLaunchKernel of an
#                   empty kernel, 10k launches each
#   4. warm start   a 32-layer Llama-2-7B forward (tools/gen/llama.py),
#                   `fusec compile --target sm_XX` into a fresh cache, then
#                   bench_cuda warmstart: process start to every module
#                   loaded, from the warm cache (and, for contrast, from a
#                   cold one)
#   5. torch        where a Python with torch and CUDA is at $PYTHON:
#                   tools/gpu/torch_cuda_check.py (fusec.Program on CUDA
#                   tensors against PyTorch CUDA, three models, fwd+bwd)
#   6. NCCL         FSDP Llama traces (tools/gen/fsdp_llama.py, f32 and
#                   bf16) through NCCL: `--world 1 --check` on device 0,
#                   and `--world 2 --check` where there are two GPUs; each
#                   must report 0 host synchronizations inside the steps
#                   (needs libnccl.so.2, or $FUSEC_NCCL_LIBRARY)
#   7. graphs       `fusec run --graph --check` (the run captured once into
#                   a CUDA graph, replayed per iteration) on the Llama
#                   block and a 2-layer bf16 Llama at two sizes, and the
#                   time per iteration with and without --graph (200
#                   iterations, CUDA events): the gain goes in the note
#
# Exit status: 0 when every check passed, 1 when any failed, 77 with no GPU.
set -u
FUSEC=${1:?usage: run_gpu_checks.sh FUSEC [REPO]}
REPO=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
FUSEC=$(cd "$(dirname "$FUSEC")" && pwd)/$(basename "$FUSEC")
BENCH_CUDA=${BENCH_CUDA:-$(dirname "$FUSEC")/bench/bench_cuda}
RESULTS=${RESULTS:-$REPO/tools/bench/results}
PYTHON=${PYTHON:-python3}
QUICK=${QUICK:-0}
DEVICE=${DEVICE:-cuda}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$RESULTS"
export FUSEC_CACHE_DIR="$tmp/cache"
failures=0

json_str() { # a JSON string of $1
	printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' |
		awk 'BEGIN { ORS = "" } NR > 1 { print "\\n" } { print }' |
		sed -e 's/^/"/' -e 's/$/"/'
}

# ---- 1. probe ------------------------------------------------------------------
probe=$("$FUSEC" run "$REPO/tests/traces/casts.trace" --device "$DEVICE" --bind B=1,T=1 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	if printf '%s' "$probe" | grep -q "no CUDA device"; then
		echo "run_gpu_checks: skipped: $probe"
		exit 77
	fi
	echo "run_gpu_checks: fusec run --device cuda fails on the smallest trace:"
	echo "$probe"
	exit 1
fi
gpu=unknown driver=unknown cc=
if command -v nvidia-smi >/dev/null 2>&1; then
	gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
	driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
	cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
fi
[ -n "$cc" ] || cc=90
echo "device: $gpu, driver $driver, sm_$cc"
header() { # the JSON fields every result file starts with
	printf '  "device": %s,\n  "driver": %s,\n  "sm": "sm_%s",\n  "date": "%s",\n  "fusec": %s' \
		"$(json_str "$gpu")" "$(json_str "$driver")" "$cc" "$stamp" \
		"$(json_str "$(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown)")"
}

# ---- 2. the --check sweep --------------------------------------------------------
sizes="1,1 3,17 8,512"
[ "$QUICK" = 1 ] && sizes="1,1 3,17"
runs="$tmp/runs.jsonl"
: >"$runs"
failed() { # WHAT OUTPUT: counts a failure, names it and shows the output's tail
	failures=$((failures + 1))
	echo "FAIL $1:"
	printf '%s\n' "$2" | tail -5 | sed 's/^/    /'
}

one_check() { # FILE BIND LABEL
	t0=$(date +%s.%N)
	out=$("$FUSEC" run "$1" --device "$DEVICE" --bind "$2" --check --json 2>&1)
	rc=$?
	t1=$(date +%s.%N)
	secs=$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")
	ok=true
	if [ $rc -ne 0 ]; then
		ok=false
		failed "$3 at $2" "$out"
	else
		echo "ok   $3 at $2 (${secs}s)"
	fi
	printf '{"trace": %s, "bind": "%s", "ok": %s, "rc": %d, "seconds": %s, "output": %s}\n' \
		"$(json_str "$3")" "$2" $ok $rc "${secs:-0}" \
		"$(json_str "$(printf '%s' "$out" | tail -c 2000)")" >>"$runs"
}
for bt in $sizes; do
	b=${bt%,*} t=${bt#*,}
	for f in "$REPO"/tests/traces/*.trace; do
		one_check "$f" "B=$b,T=$t" "tests/traces/$(basename "$f")"
	done
done
# the exported models: one folder per size (B<b>_T<t>), exported there
tarball="$REPO/tools/gpu/exported_traces.tar.gz"
if [ -f "$tarball" ]; then
	mkdir -p "$tmp/exported"
	tar -xzf "$tarball" -C "$tmp/exported"
	for bt in $sizes; do
		b=${bt%,*} t=${bt#*,}
		for f in "$tmp/exported/B${b}_T${t}"/*.trace; do
			[ -f "$f" ] || continue
			one_check "$f" "B=$b,T=$t" "exported/B${b}_T${t}/$(basename "$f")"
		done
	done
else
	echo "run_gpu_checks: $tarball is missing: the exported models are not checked"
	failures=$((failures + 1))
fi
n_runs=$(wc -l <"$runs")
n_fail=$(grep -c '"ok": false' "$runs")
{
	printf '{\n'
	header
	printf ',\n  "check": "fusec run --device %s --check",\n  "runs": %d,\n  "failed": %d,\n  "results": [\n' \
		"$DEVICE" "$n_runs" "$n_fail"
	sed -e '$!s/$/,/' -e 's/^/    /' "$runs"
	printf '  ]\n}\n'
} >"$RESULTS/gpu_check_$stamp.json"
echo "check sweep: $n_runs runs, $n_fail failed -> $RESULTS/gpu_check_$stamp.json"

# ---- 3. launch overhead -------------------------------------------------------------
gpu_bench() { # CACHE_DIR ARGS...: bench_cuda; 77 (no GPU) fails only a GPU sweep
	cache=$1
	shift
	FUSEC_CACHE_DIR="$cache" "$BENCH_CUDA" "$@"
	rc=$?
	[ $rc -eq 0 ] && return 0
	[ $rc -eq 77 ] && [ "$DEVICE" != cuda ] && return 0
	echo "run_gpu_checks: bench_cuda $1 failed ($rc)"
	failures=$((failures + 1))
	return 1
}
if [ -x "$BENCH_CUDA" ]; then
	gpu_bench "$FUSEC_CACHE_DIR" launch --iters 10000 --json "$RESULTS/launch_overhead_$stamp.json"
else
	echo "run_gpu_checks: no bench_cuda at $BENCH_CUDA (set BENCH_CUDA)"
	failures=$((failures + 1))
fi

# ---- 4. warm start of a 32-layer Llama-2-7B forward -----------------------------------
if [ -x "$BENCH_CUDA" ] && "$PYTHON" "$REPO/tools/gen/llama.py" --layers 32 \
	-o "$tmp/llama2_7b_32.trace"; then
	cold="$tmp/cold-cache"
	t0=$(date +%s%N)
	gpu_bench "$cold" warmstart "$tmp/llama2_7b_32.trace" \
		--bind B=1,T=1 --t0 "$t0" --json "$tmp/cold.json"
	"$FUSEC" compile "$tmp/llama2_7b_32.trace" --target "sm_$cc" --bind B=1,T=1 \
		--cache-dir "$tmp/warm-cache" --json >"$tmp/compile.json" ||
		failures=$((failures + 1))
	for i in 1 2 3; do # three warm processes: the first pays the page cache
		t0=$(date +%s%N)
		gpu_bench "$tmp/warm-cache" warmstart \
			"$tmp/llama2_7b_32.trace" --bind B=1,T=1 --t0 "$t0" \
			--json "$tmp/warm$i.json"
	done
	{
		printf '{\n'
		header
		printf ',\n  "what": "process start to all modules loaded, 32-layer Llama-2-7B forward, B=1 T=1",\n'
		printf '  "compile": %s,\n' "$(cat "$tmp/compile.json" 2>/dev/null || echo null)"
		printf '  "cold": %s,\n' "$(cat "$tmp/cold.json" 2>/dev/null || echo null)"
		printf '  "warm": [%s, %s, %s]\n}\n' "$(cat "$tmp/warm1.json" 2>/dev/null || echo null)" \
			"$(cat "$tmp/warm2.json" 2>/dev/null || echo null)" \
			"$(cat "$tmp/warm3.json" 2>/dev/null || echo null)"
	} >"$RESULTS/warm_start_$stamp.json"
	echo "warm start -> $RESULTS/warm_start_$stamp.json"
else
	echo "run_gpu_checks: the warm-start measurement did not run"
	failures=$((failures + 1))
fi

# ---- 5. PyTorch on CUDA ----------------------------------------------------------------
if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
	2>/dev/null; then
	lib=$(dirname "$(dirname "$FUSEC")")/libfusec.so
	if ! PYTHONPATH="$REPO/tools/python" FUSEC_LIBRARY="$lib" "$PYTHON" \
		"$REPO/tools/gpu/torch_cuda_check.py" --json "$RESULTS/torch_cuda_$stamp.json"; then
		failures=$((failures + 1))
	fi
else
	echo "run_gpu_checks: no Python with torch and CUDA at \$PYTHON=$PYTHON:" \
		"fusec.Program(device=\"cuda\") against PyTorch is not checked"
fi

# ---- 6. NCCL: world 1 (and 2 where two GPUs are) -------------------------------------------
gpus=1
command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L | grep -c '^GPU')
nccl="$tmp/nccl.jsonl"
: >"$nccl"
for w in 1 2; do
	[ $w -le "$gpus" ] || { echo "run_gpu_checks: one GPU: world $w through NCCL not run"; continue; }
	for dt in f32 bf16; do
		f="$tmp/fsdp_w${w}_$dt.trace"
		"$PYTHON" "$REPO/tools/gen/fsdp_llama.py" --world $w --layers 2 --hidden 256 \
			--heads 4 --intermediate 688 --vocab 512 --dtype $dt -o "$f" || continue
		out=$("$FUSEC" run "$f" --device "$DEVICE" --world $w --bind B=2,T=64 \
			--iters 5 --check --json 2>&1)
		rc=$?
		ok=true
		if [ $rc -ne 0 ] || ! printf '%s' "$out" | grep -Eq '"host_syncs_in_steps": 0[,}]'; then
			ok=false
			failed "nccl world $w $dt" "$out"
		else
			echo "ok   nccl world $w $dt, 0 host syncs inside steps"
		fi
		printf '{"world": %d, "dtype": "%s", "ok": %s, "output": %s}\n' $w $dt $ok \
			"$(json_str "$(printf '%s' "$out" | tail -c 2000)")" >>"$nccl"
	done
done
{
	printf '{\n'
	header
	printf ',\n  "check": "fusec run --device %s --world N --check (NCCL), 0 host syncs",\n  "results": [\n' "$DEVICE"
	sed -e '$!s/$/,/' -e 's/^/    /' "$nccl"
	printf '  ]\n}\n'
} >"$RESULTS/nccl_$stamp.json"

# ---- 7. CUDA graphs: --graph replay, checked, and timed against plain runs -------------------
graphs="$tmp/graphs.jsonl"
: >"$graphs"
"$PYTHON" "$REPO/tools/gen/llama.py" --layers 2 --hidden 512 --heads 8 \
	--intermediate 1376 --vocab 4096 --dtype bf16 -o "$tmp/llama2_bf16.trace" \
	2>/dev/null || cp "$REPO/tests/traces/llama_block.trace" "$tmp/llama2_bf16.trace"
gtraces="$REPO/tests/traces/llama_block.trace $tmp/llama2_bf16.trace"
if [ "$DEVICE" != cuda ]; then # a dry run: graphs are CUDA's
	echo "run_gpu_checks: --graph needs --device cuda: part 7 not run on $DEVICE"
	gtraces=
fi
for f in $gtraces; do
	for bt in 1,1 8,512; do
		b=${bt%,*} t=${bt#*,}
		g=$("$FUSEC" run "$f" --device "$DEVICE" --bind "B=$b,T=$t" --iters 200 \
			--graph --check --json 2>&1)
		grc=$?
		p=$("$FUSEC" run "$f" --device "$DEVICE" --bind "B=$b,T=$t" --iters 200 \
			--json 2>&1)
		ok=true
		if [ $grc -ne 0 ] || ! printf '%s' "$g" | grep -q '"graph_captures": 1,'; then
			ok=false
			failed "--graph $(basename "$f") at $bt" "$g"
		else
			echo "ok   --graph $(basename "$f") at $bt"
		fi
		printf '{"trace": %s, "bind": "B=%s,T=%s", "ok": %s, "graph": %s, "plain": %s}\n' \
			"$(json_str "$(basename "$f")")" "$b" "$t" $ok \
			"$(json_str "$(printf '%s' "$g" | tail -c 1500)")" \
			"$(json_str "$(printf '%s' "$p" | tail -c 1500)")" >>"$graphs"
	done
done
{
	printf '{\n'
	header
	printf ',\n  "check": "fusec run --graph --check --iters 200 vs plain --iters 200 (seconds_per_iter from CUDA events)",\n  "results": [\n'
	sed -e '$!s/$/,/' -e 's/^/    /' "$graphs"
	printf '  ]\n}\n'
} >"$RESULTS/graphs_$stamp.json"

echo "run_gpu_checks: $failures failure(s)"
[ $failures -eq 0 ]
