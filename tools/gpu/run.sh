#!/usr/bin/env bash
# run.sh: every check the CUDA target needs a GPU for, in a few minutes,
# each result written the moment it is known.
#
#     tools/gpu/run.sh DIR
#
# A GPU is lent rarely and briefly (README.md): one command of at most 10
# minutes, 8 result files back from one folder. So this script is the one
# command. It takes its binaries from the archive tools/gpu/pack.sh made
# ($PACK, default gpu-pack/fusec-gpu.tar.xz, unpacked under $TMPDIR), or,
# with no archive or with $BUILD set, from a build tree (default build/):
# the pack-free path, which CI's dry run takes. It prints the device, the
# driver, glibc and the CUDA libraries it found, then runs, each process
# under `timeout`, going on after any failure, within $BUDGET seconds
# (default 330) of wall time:
#
#   A. at once, side by side (correctness; their timings are not kept):
#      - test_cuda, the device unit tests
#      - tools/gpu/torch_cuda_check.py: fusec.Program on CUDA tensors
#        against PyTorch CUDA (three models, fwd and bwd, f32 and bf16)
#      - tests/python/test_backend.py with FUSEC_TEST_DEVICE=cuda (the
#        torch.compile backend on CUDA tensors)
#      - host: the CPU target on this machine's CPU (test_cpu,
#        test_codegen, and test_backend.py on CPU tensors), which is often
#        an AVX-512 one where CI's are not
#      - a pool of $JOBS processes (xargs -P) through a list, most
#        valuable first: `fusec run --check` of every corpus trace at
#        B,T = 1,1 / 3,17 / 8,512 (a trace at the sizes of the symbols it
#        has: one run where it has none) and of the exported nanoGPT,
#        Llama and GPT-2 traces (fwd, bwd, ckpt; f32, bf16) at their
#        sizes; NCCL at world 1 (FSDP Llama, f32 and bf16: --check and no
#        host synchronization inside the steps; world 2 where two GPUs
#        are); --graph (the Llama block and a 2-layer bf16 Llama at 1,1
#        and 8,512: the run replayed from a CUDA graph must give exactly
#        the plain run's outputs, compared through both runs' --check
#        figures); the fused attention kernels against the interpreter
#        (part attn_check: tools/gen/attn_cases.py at lengths 1 to 1000,
#        head dims 64, 80, 128, bf16 and f32, forward and backward); then
#        compute-sanitizer memcheck of the corpus at 3,17
#      Phase A ends by 55% of the budget: what has not started by then is
#      recorded as skipped for time.
#   B. one after another, the GPU otherwise idle (timings):
#      - --graph: the per-iteration time of the same four runs with and
#        without the graph
#      - profile: each kernel's device time in two runs of the Llama block
#        at B=1, T=1 under ncu (profile.csv), where the graph part's 0.8 ms
#        an iteration go
#      - launch overhead: bench_cuda launch (fz_exec_run against raw
#        cuLaunchKernel, medians of 10k)
#      - warm start: a 32-layer Llama-2-7B forward after `fusec compile`
#      - tools/bench/attn_gpu_bench.py: the fused attention kernels against
#        SDPA, TFLOP/s forward and backward
#      - tools/bench/gpu_bench.py in the time left: memory-bound fusions,
#        fusec beside eager PyTorch and torch.compile, as TB/s and as a
#        fraction of the measured device-to-device copy bandwidth
#
# DIR receives (at most 8 files, the device tool's limit):
#   log.txt          everything printed
#   summary.json     machine, commit, and each part's pass/fail/skip
#                    counts; rewritten after each part
#   checks.jsonl     one JSON object per check, appended as each ends
#   bench.jsonl      one JSON object per measurement, likewise
#   torch_cuda.json  torch_cuda_check.py's cases
#   gpu_bench.json   gpu_bench.py's table
#   profile.csv      ncu's gpu__time_duration of every kernel (part profile)
#   attn_gpu.json    attn_gpu_bench.py's table
#
# Environment: DEVICE (cuda; emu or cpu dry-run the plumbing without a
# GPU), QUICK=1 (sizes 1,1 only, one torch case, the smallest benchmark),
# TRACES and EXPORTED (space-separated name filters for the corpus and the
# exported traces), SIZES (the check sweep's B,T pairs, space-separated),
# ATTN_LENGTHS, ATTN_DIMS, ATTN_DTYPES (attn_check's sweep), PARTS (the parts to run, space-separated, default all:
# probe test_cuda torch backend host check nccl attn_check graph memcheck graph_time
# profile launch warm_start attention gpu_bench; to run again only what failed, after a fix), BUDGET,
# GPU_BENCH_FUSIONS and GPU_BENCH_SHAPES (gpu_bench.py's --fusions and
# --shapes: a comma-separated subset, or fusions it runs only when named;
# what a run left for time), JOBS (default nproc), PYTHON
# (default python3), PACK, BUILD, LDCONFIG
# (LDCONFIG=true: as if the machine had none of the packed libraries).
#
# Exit status: 0 when nothing failed, 1 when a check failed, 77 when
# DEVICE=cuda and there is no CUDA device.
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
REPO=$(cd "$(dirname "$0")/../.." && pwd)

# ---- one job of the pool (run.sh --job LINE, from xargs) ----------------------
json_str() { # a JSON string of $1
	printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037' |
		sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' -e 's/\r//g' |
		awk 'BEGIN { ORS = ""; print "\"" } NR > 1 { print "\\n" } { print } END { print "\"" }'
}
record() { # PART NAME BIND STATUS RC SECONDS OUTPUT: one line of checks.jsonl
	local line
	line=$(printf '{"part": "%s", "status": "%s", "name": %s, "bind": "%s", "rc": %s, "seconds": %s, "output": %s}' \
		"$1" "$4" "$(json_str "$2")" "$3" "$5" "${6:-0}" \
		"$(json_str "$(printf '%s' "$7" | tail -c 1500)")")
	printf '%s\n' "$line" >>"$RUN_DIR/checks.jsonl"
	case "$4" in
	pass) printf 'ok   %s %s %s (%ss)\n' "$1" "$2" "$3" "$6" ;;
	skip) printf 'skip %s %s %s: %s\n' "$1" "$2" "$3" "$(printf '%s' "$7" | tail -1)" ;;
	*) printf 'FAIL %s %s %s (rc %s, %ss):\n' "$1" "$2" "$3" "$5" "$6"
	   printf '%s\n' "$7" | tail -6 | sed 's/^/    /' ;;
	esac
}
secs_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
status_of() { # a check's exit status as pass, skip (77) or fail
	case $1 in 0) echo pass ;; 77) echo skip ;; *) echo fail ;; esac
}
# a timeout for a process that must end by epoch second $2: at most $1
timeout_for() {
	local l=$(($2 - $(date +%s)))
	[ "$l" -lt 1 ] && l=1
	[ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}

if [ "${1:-}" = --job ]; then
	IFS='|' read -r kind file bind label world <<<"$2"
	limit=$JOB_TIMEOUT
	case "$kind $bind $label" in
	check*T=512*|check*T512*|graph*T=512*|memcheck*|attn_check*t1000*) limit=$BIG_TIMEOUT ;;
	esac
	limit=$(timeout_for "$limit" "$PHASE_END")
	if [ $((PHASE_END - $(date +%s))) -lt 5 ]; then
		record "$kind" "$label" "$bind" skip 0 0 "not started: out of time"
		exit 0
	fi
	bindarg=()
	[ -n "$bind" ] && bindarg=(--bind "$bind")
	t0=$(date +%s.%N)
	case "$kind" in
	check|attn_check) out=$(timeout -k 5 "$limit" "$FUSEC" run "$file" --device "$DEVICE" \
		"${bindarg[@]}" --check --json 2>&1) ;;
	nccl) out=$(timeout -k 5 "$limit" "$FUSEC" run "$file" --device "$DEVICE" \
		--world "$world" "${bindarg[@]}" --iters 5 --check --json 2>&1) ;;
	graph) # the replay must reproduce the plain run: the same --check
		# figures (worst element, its index and value, the largest errors)
		# whether or not they are inside the tolerance, which is the
		# sweep's question (a 2-layer bf16 Llama at 8,512 is at 0.8 to 1.1
		# of the bf16 tolerance on the CPU too)
		out=$(timeout -k 5 "$limit" "$FUSEC" run "$file" --device "$DEVICE" \
			"${bindarg[@]}" --iters 3 --graph --check --json 2>&1)
		p=$(timeout -k 5 "$limit" "$FUSEC" run "$file" --device "$DEVICE" \
			"${bindarg[@]}" --iters 3 --check --json 2>&1)
		figures() {
			printf '%s' "$1" | grep -o '"\(max_abs_err\|max_rel_err\|worst_[a-z]*\)": [^,}]*' | tr '\n' ' '
		}
		rc=0
		if ! printf '%s' "$out" | grep -q '"graph_captures": 1,'; then
			rc=1 out="$out
not captured once into a graph"
		elif [ -z "$(figures "$p")" ] || [ "$(figures "$out")" != "$(figures "$p")" ]; then
			rc=1 out="$out
the plain run: $p
the replay's --check figures differ from the plain run's"
		elif printf '%s' "$p" | grep -q '"ok": false'; then
			out="$out
(the same as the plain run's, which is outside the --check tolerance)"
		fi
		if [ $rc -ne 0 ] && [ "$bind" = B=1,T=1 ]; then
			# which condition it takes: a graph captured in a process
			# that compiled its kernels (a fresh cache), or any graph;
			# and whether a plain run that compiles fails alike (at the
			# small size only: each run at 8,512 costs a minute of --check)
			d=$(mktemp -d "${TMPDIR:-/tmp}/fusec-diag.XXXXXX")
			# (cache c is fresh for the plain run, then warm for the graph)
			for v in "graph-a-fresh a --graph --iters 3" "graph-1-iter-fresh b --graph --iters 1" \
				"plain-fresh c --iters 3" "graph-warm c --graph --iters 3"; do
				set -- $v
				name=$1 cache=$d/$2
				shift 2
				r=$(timeout -k 5 "$limit" "$FUSEC" run "$file" --device "$DEVICE" \
					"${bindarg[@]}" --cache-dir "$cache" "$@" --check --json 2>&1 | tail -1)
				out="$out
diagnosis, $name ($*): $(figures "$r") compiled $(printf '%s' "$r" |
					grep -o '"compiled": [0-9]*')"
			done
			rm -rf "$d"
		fi
		(exit $rc) ;;
	memcheck) out=$(timeout -k 5 "$limit" "$SANITIZER" --tool memcheck \
		--error-exitcode 3 --print-limit 5 "$FUSEC" run "$file" --device "$DEVICE" \
		"${bindarg[@]}" 2>&1) ;;
	esac
	rc=$?
	status=pass
	[ $rc -eq 0 ] || status=fail
	[ $rc -eq 124 ] || [ $rc -eq 137 ] && out="$out
timed out after ${limit}s"
	if [ "$kind" = nccl ] && [ $rc -eq 0 ] &&
		! printf '%s' "$out" | grep -Eq '"host_syncs_in_steps": 0[,}]'; then
		status=fail
		out="$out
host synchronizations inside the steps"
	fi
	record "$kind" "$label" "$bind" $status $rc "$(secs_since "$t0")" "$out"
	exit 0
fi

# ---- set-up ---------------------------------------------------------------------
DIR=${1:?usage: run.sh DIR}
mkdir -p "$DIR" || exit 1
RUN_DIR=$(cd "$DIR" && pwd)
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
BUDGET=${BUDGET:-330}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
PYTHON=${PYTHON:-python3}
T0=$(date +%s)
END=$((T0 + BUDGET))
left() { echo $((END - $(date +%s))); }
part() { # NAME: whether PARTS names it (all parts when PARTS is empty)
	[ -z "${PARTS:-}" ] && return 0
	case " $PARTS " in *" $1 "*) return 0 ;; esac
	return 1
}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fusec-gpu.XXXXXX")
: >"$RUN_DIR/log.txt"
: >"$RUN_DIR/checks.jsonl"
: >"$RUN_DIR/bench.jsonl"
exec > >(tee -a "$RUN_DIR/log.txt") 2>&1
tee_pid=$!
# at exit: the log complete (tee drained) before the caller reads it
trap 'exec >&- 2>&-; wait $tee_pid 2>/dev/null; rm -rf "$WORK"' EXIT
echo "run.sh: DEVICE=$DEVICE QUICK=$QUICK BUDGET=${BUDGET}s JOBS=$JOBS, results in $RUN_DIR"

LDCONFIG=${LDCONFIG:-$(command -v ldconfig || echo /sbin/ldconfig)}

# the binaries: the pack, else the build tree
PACK=${PACK:-$REPO/gpu-pack/fusec-gpu.tar.xz}
pack_json=null
if [ -z "${BUILD:-}" ] && [ -f "$PACK" ]; then
	t0=$(date +%s.%N)
	if ! tar -xf "$PACK" -C "$WORK"; then
		echo "run.sh: cannot unpack $PACK"
		exit 1
	fi
	root="$WORK/fusec-gpu"
	FUSEC=$root/bin/fusec BENCH_CUDA=$root/bin/bench_cuda
	TEST_CUDA=$root/bin/test_cuda LIBFUSEC=$root/lib/libfusec.so
	TEST_CPU=$root/bin/test_cpu TEST_CODEGEN=$root/bin/test_codegen
	pack_json=$(tr -d '\n' <"$root/pack.json")
	echo "pack: $PACK unpacked in $(secs_since "$t0")s: commit" \
		"$(grep -o '"commit": "[0-9a-f]*"' "$root/pack.json" | grep -o '[0-9a-f]\{40\}')," \
		"glibc needed $(grep -o '"glibc_needed": "[0-9.]*"' "$root/pack.json" | grep -o '[0-9][0-9.]*')"
	# the libraries the machine lacks, from deps/: on the loader path
	mkdir -p "$WORK/ld"
	for f in "$root"/deps/*; do
		[ -f "$f" ] || continue
		so=$(basename "$f")
		if "$LDCONFIG" -p 2>/dev/null | grep -q "^[[:space:]]*$so (libc6,x86-64"; then
			echo "pack: $so: the machine's"
		else
			ln -s "$f" "$WORK/ld/$so"
			echo "pack: $so: packed (the machine has none)"
		fi
	done
	export LD_LIBRARY_PATH="$WORK/ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	if ! out=$("$FUSEC" check "$REPO/tests/traces/casts.trace" 2>&1); then
		echo "pack: fusec does not start with the machine's libraries ($out);" \
			"every packed library first"
		export LD_LIBRARY_PATH="$root/deps:$LD_LIBRARY_PATH"
	fi
else
	BUILD=${BUILD:-$REPO/build}
	FUSEC=$BUILD/tools/fusec BENCH_CUDA=$BUILD/tools/bench/bench_cuda
	TEST_CUDA=$BUILD/tests/test_cuda LIBFUSEC=$BUILD/libfusec.so
	TEST_CPU=$BUILD/tests/test_cpu TEST_CODEGEN=$BUILD/tests/test_codegen
	echo "build tree: $BUILD (no pack)"
fi
if [ ! -x "$FUSEC" ]; then
	echo "run.sh: no fusec at $FUSEC (tools/gpu/pack.sh, or set BUILD)"
	exit 1
fi
export FUSEC_CACHE_DIR="$WORK/cache"

# the machine
gpu=none driver=none cc= mem=
if command -v nvidia-smi >/dev/null 2>&1; then
	IFS=, read -r gpu driver cc mem < <(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
		--format=csv,noheader 2>/dev/null | head -1 | sed 's/, /,/g')
	cc=$(printf '%s' "$cc" | tr -d '. ')
fi
[ -n "$cc" ] || cc=90
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //')
# the CPU: the host code's choices differ with AVX-512 (part host)
cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//')
avx512=false
grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512bw /proc/cpuinfo &&
	grep -qw avx512vl /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo && avx512=true
commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$pack_json" != null ]; then
	need=$(printf '%s' "$pack_json" | grep -o '"glibc_needed": "[0-9.]*"' | grep -o '[0-9][0-9.]*')
	[ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" = "$need" ] ||
		echo "run.sh: WARNING: glibc $glibc is older than the $need the pack needs"
	pc=$(printf '%s' "$pack_json" | grep -o '"commit": "[0-9a-f]*"' | grep -o '[0-9a-f]\{40\}')
	[ "$commit" = unknown ] || [ "$commit" = "$pc" ] ||
		echo "run.sh: WARNING: the pack was built from $pc, the tree is $commit"
fi
echo "device: ${gpu:-none}, driver ${driver:-none}, sm_$cc, ${mem:-?}; glibc $glibc; $(nproc) cores"
echo "cpu: ${cpu:-?}, AVX-512 (F, BW, VL, DQ): $avx512"
# the CUDA libraries fusec opens: where the loader finds them, else in the
# CUDA toolkit or PyTorch's nvidia wheels (then added to the loader path)
pydirs=$("$PYTHON" -c 'import os, nvidia
for p in nvidia.__path__:
    for d in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, d, "lib")): print(os.path.join(p, d, "lib"))' 2>/dev/null)
libs_json=
for so in libcuda.so.1 libcublasLt.so.13 libnvJitLink.so.13 libnccl.so.2; do
	where=$("$LDCONFIG" -p 2>/dev/null | awk -v so="$so" '$1 == so && /x86-64/ { print $NF; exit }')
	if [ -z "$where" ]; then
		for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
			/usr/local/nvidia/lib64 $pydirs; do
			if [ -e "$d/$so" ]; then
				where=$d/$so
				export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
				break
			fi
		done
	fi
	echo "  $so: ${where:-not found}"
	libs_json="$libs_json${libs_json:+, }\"$so\": $(json_str "${where:-}")"
done
stamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)

parts="$WORK/parts.jsonl"
: >"$parts"
failures=0
summary() { # rewrite summary.json from the parts so far
	{
		printf '{\n  "device": %s,\n  "driver": %s,\n  "sm": "sm_%s",\n' \
			"$(json_str "$gpu")" "$(json_str "$driver")" "$cc"
		printf '  "glibc": "%s",\n  "cuda_libraries": {%s},\n' "$glibc" "$libs_json"
		printf '  "cpu": %s,\n  "cpu_avx512": %s,\n' "$(json_str "$cpu")" "$avx512"
		printf '  "mode": "%s", "quick": %s, "budget_seconds": %s,\n' "$DEVICE" "$QUICK" "$BUDGET"
		printf '  "tree_commit": "%s",\n  "pack": %s,\n  "date": "%s",\n' "$commit" "$pack_json" "$stamp"
		printf '  "elapsed_seconds": %s,\n  "failures": %d,\n  "parts": [\n' "$(( $(date +%s) - T0 ))" "$failures"
		sed -e '$!s/$/,/' -e 's/^/    /' "$parts"
		printf '  ]\n}\n'
	} >"$RUN_DIR/summary.json.tmp" && mv "$RUN_DIR/summary.json.tmp" "$RUN_DIR/summary.json"
}
part_done() { # PART [NOTE]: count its lines of checks.jsonl into parts
	local p=$1 n f s
	part "$p" || return 0
	n=$(grep -c "^{\"part\": \"$p\", \"status\": \"pass\"" "$RUN_DIR/checks.jsonl")
	f=$(grep -c "^{\"part\": \"$p\", \"status\": \"fail\"" "$RUN_DIR/checks.jsonl")
	s=$(grep -c "^{\"part\": \"$p\", \"status\": \"skip\"" "$RUN_DIR/checks.jsonl")
	failures=$((failures + f))
	printf '{"part": "%s", "passed": %d, "failed": %d, "skipped": %d, "note": %s}\n' \
		"$p" "$n" "$f" "$s" "$(json_str "${2:-}")" >>"$parts"
	echo "== $p: $n passed, $f failed, $s skipped${2:+ ($2)}"
	summary
}
summary

# ---- the probe --------------------------------------------------------------------
t0=$(date +%s.%N)
probe=$(timeout -k 5 60 "$FUSEC" run "$REPO/tests/traces/casts.trace" --device "$DEVICE" \
	--bind B=1,T=1 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	if printf '%s' "$probe" | grep -q "no CUDA device"; then
		record probe casts.trace B=1,T=1 skip $rc "$(secs_since "$t0")" "$probe"
		PARTS= part_done probe "no CUDA device"
		exit 77
	fi
	record probe casts.trace B=1,T=1 fail $rc "$(secs_since "$t0")" "$probe"
else
	record probe casts.trace B=1,T=1 pass 0 "$(secs_since "$t0")" "$probe"
fi
PARTS= part_done probe # always run: it says whether there is a device

# ---- A. correctness, side by side -----------------------------------------------------
export RUN_DIR DEVICE FUSEC
export PHASE_END=$((T0 + BUDGET * 55 / 100))
export JOB_TIMEOUT=${JOB_TIMEOUT:-60} BIG_TIMEOUT=${BIG_TIMEOUT:-150}
have_torch=0
"$PYTHON" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null && have_torch=1
pyenv=(env PYTHONPATH="$REPO/tools/python" FUSEC_LIBRARY="$LIBFUSEC" PYTHONUNBUFFERED=1)

check_binary() { # PART BIN: a Check test binary, its summary and failures shown
	local t0 out rc
	t0=$(date +%s.%N)
	out=$(CK_DEFAULT_TIMEOUT=120 timeout -k 5 "$(timeout_for 240 "$PHASE_END")" "$2" 2>&1)
	rc=$?
	printf '%s\n' "$out" | grep -E '^[0-9]+%|:[EF]:' | head -40
	record "$1" "$(basename "$2")" "" "$(status_of $rc)" $rc "$(secs_since "$t0")" "$out"
}
# PART BIND DEVICE [ARG...]: tests/python/test_backend.py with
# FUSEC_TEST_DEVICE=DEVICE, verbose under faulthandler (-v names each test
# as it starts: a crash then says which it was); on a failure its whole
# output into log.txt, each line led by "  PART| " (checks.jsonl keeps
# 1500 characters: session 18's segfault left only its traceback's end)
backend_test() {
	local part=$1 bind=$2 dev=$3 t0 out rc st
	shift 3
	t0=$(date +%s.%N)
	out=$(timeout -k 5 "$(timeout_for 180 "$PHASE_END")" "${pyenv[@]}" \
		FUSEC_TEST_DEVICE="$dev" PYTHONFAULTHANDLER=1 "$PYTHON" \
		"$REPO/tests/python/test_backend.py" -v "$@" 2>&1)
	rc=$?
	st=$(status_of $rc)
	record "$part" test_backend.py "$bind" $st $rc "$(secs_since "$t0")" "$out"
	[ $st != fail ] || printf '%s\n' "$out" | sed "s/^/  $part| /"
}

# test_cuda: exit 77 without a device
( part test_cuda || exit 0
  check_binary test_cuda "$TEST_CUDA" ) &
bg_test=$!

# fusec.Program on CUDA tensors against PyTorch
( part torch || exit 0
  t0=$(date +%s.%N)
  if [ $have_torch = 0 ]; then
	record torch torch_cuda_check.py "" skip 0 0 "no torch at PYTHON=$PYTHON"
	exit 0
  fi
  q=()
  [ "$QUICK" = 1 ] && q=(--models nanogpt --kinds bwd --dtypes float32)
  out=$(timeout -k 5 "$(timeout_for 240 "$PHASE_END")" "${pyenv[@]}" "$PYTHON" \
	"$REPO/tools/gpu/torch_cuda_check.py" --device "$DEVICE" "${q[@]}" \
	--json "$RUN_DIR/torch_cuda.json" 2>&1)
  rc=$?
  printf '%s\n' "$out" | grep -E '^(ok|FAIL) '
  record torch torch_cuda_check.py "" "$(status_of $rc)" $rc "$(secs_since "$t0")" "$out" ) &
bg_torch=$!

# hook: the torch.compile backend on CUDA tensors, once it exists
( part backend || exit 0
  if [ ! -f "$REPO/tests/python/test_backend.py" ] || [ $have_torch = 0 ]; then
	record backend test_backend.py "" skip 0 0 "tests/python/test_backend.py or torch absent"
	exit 0
  fi
  k=() # QUICK: one test, the plumbing (ctest runs them all on emu)
  [ "$QUICK" = 1 ] && k=(-k test_llama_adamw_matches_eager)
  for p in ${BACKEND_K:-}; do k+=(-k "$p"); done # BACKEND_K: those tests alone
  backend_test backend "" "$DEVICE" "${k[@]}" ) &
bg_backend=$!

# host: the CPU target on this machine's CPU, often an AVX-512 one where
# CI's have AVX2 (CI models it: FUSEC_HOST_MODEL=avx512). Session 18's
# backend failures here were the AVX-512 host's vector exp, not CUDA's.
( part host || exit 0
  tests=("$TEST_CPU" "$TEST_CODEGEN")
  [ "$QUICK" = 1 ] && tests=("$TEST_CPU") # the plumbing (ctest runs the rest)
  for t in "${tests[@]}"; do check_binary host "$t"; done
  # the backend on CPU tensors (ctest's python/backend, on this CPU)
  [ $have_torch = 1 ] && [ "$QUICK" != 1 ] || exit 0
  backend_test host cpu cpu ) &
bg_host=$!

# the pool's list: the sweep, NCCL, memcheck
jobs="$WORK/jobs"
: >"$jobs"
sizes="1,1 3,17 8,512"
[ "$QUICK" = 1 ] && sizes="1,1"
sizes=${SIZES:-$sizes}
wanted() { # NAME FILTER: whether NAME passes the space-separated FILTER
	[ -z "$2" ] && return 0
	local w
	for w in $2; do [ "$1" = "$w" ] && return 0; done
	return 1
}
symbols() { # the symbols in a trace file's parameter extents
	# the header may span lines (`trace f(` ... `) {`); an extent may be a
	# sum or product of symbols (T+1, B*T), which binds only its symbols
	awk '/^trace /{h=1} h{print} h && /\{/{h=0}' "$1" | grep -o '\[[^]]*\]' |
		tr -d '[] ' | tr ',*+-' '\n\n\n\n' | grep -E '^[A-Za-z_]' | sort -u | tr '\n' ' '
}
bind_for() { # SYMBOLS B T: the binding of the symbols the trace has
	local s out=
	for s in $1; do
		case $s in
		B) out="$out${out:+,}B=$2" ;;
		T) out="$out${out:+,}T=$3" ;;
		*) out="$out${out:+,}$s=$2" ;;
		esac
	done
	printf '%s' "$out"
}
corpus=()
for f in "$REPO"/tests/traces/*.trace; do
	n=$(basename "$f" .trace)
	wanted "$n" "${TRACES:-}" && corpus+=("$f")
done
mkdir -p "$WORK/exported"
tar -xzf "$REPO/tools/gpu/exported_traces.tar.gz" -C "$WORK/exported" ||
	record check exported_traces.tar.gz "" fail 1 0 "cannot unpack tools/gpu/exported_traces.tar.gz"
nccl_size=(--hidden 256 --heads 4 --intermediate 688 --vocab 512) nccl_bind=B=2,T=64
[ "$QUICK" = 1 ] && nccl_size=(--hidden 64 --heads 2 --intermediate 128 --vocab 128) nccl_bind=B=1,T=8
gpus=1
[ "$DEVICE" = cuda ] && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
for w in 1 2; do
	part nccl || break
	[ "$w" -le "$gpus" ] || break # world 2 where two GPUs are
	for dt in f32 bf16; do
		[ "$QUICK" = 1 ] && [ $dt = bf16 ] && continue
		f="$WORK/fsdp_w${w}_$dt.trace"
		att=primitive
		if "$PYTHON" "$REPO/tools/gen/fsdp_llama.py" --world $w --layers 2 "${nccl_size[@]}" \
			--dtype $dt --attention $att -o "$f" 2>"$WORK/gen.err"; then
			echo "nccl|$f|$nccl_bind|fsdp_llama world $w $dt|$w" >>"$jobs"
		else
			record nccl "fsdp_llama world $w $dt" "" fail 1 0 "$(cat "$WORK/gen.err")"
		fi
	done
done
for bt in $sizes; do
	part check || break
	b=${bt%,*} t=${bt#*,}
	for f in "${corpus[@]}"; do
		bind=$(bind_for "$(symbols "$f")" "$b" "$t")
		# a trace without symbols runs once; one with B only, at each B
		grep -qxF "check|$f|$bind|tests/traces/$(basename "$f")" "$jobs" ||
			echo "check|$f|$bind|tests/traces/$(basename "$f")" >>"$jobs"
	done
	for f in "$WORK/exported/B${b}_T${t}"/*.trace; do
		[ -f "$f" ] || continue
		wanted "$(basename "$f" .trace)" "${EXPORTED:-}" || continue
		echo "check|$f||exported/B${b}_T${t}/$(basename "$f")" >>"$jobs"
	done
done
gl="$WORK/llama2_bf16.trace"
if ! part graph; then
	:
elif [ "$DEVICE" != cuda ]; then
	record graph --graph "" skip 0 0 "--graph needs --device cuda"
elif "$PYTHON" "$REPO/tools/gen/llama.py" --layers 2 --hidden 512 --heads 8 \
	--intermediate 1376 --vocab 4096 --dtype bf16 -o "$gl" 2>"$WORK/gen.err"; then
	for f in "$REPO/tests/traces/llama_block.trace" "$gl"; do
		for bt in B=1,T=1 B=8,T=512; do
			echo "graph|$f|$bt|$(basename "$f")" >>"$jobs"
		done
	done
else
	record graph "tools/gen/llama.py" "" fail 1 0 "$(cat "$WORK/gen.err")"
fi
# the fused attention kernels against the interpreter: issue 22's sweep
# (tools/gen/attn_cases.py: plain, causal, GQA 4:1, a bool padding mask, a
# sliding window, softcap with a float mask, the decomposed eager form;
# forward and backward), one file per length, head dim and dtype
attn_lengths="1 17 64 127 128 129 1000" attn_dims="64 80 128" attn_dts="bf16 f32"
[ "$QUICK" = 1 ] && attn_lengths=17 attn_dims=64 attn_dts=bf16
attn_lengths=${ATTN_LENGTHS:-$attn_lengths} attn_dims=${ATTN_DIMS:-$attn_dims}
attn_dts=${ATTN_DTYPES:-$attn_dts}
if part attn_check; then
	mkdir -p "$WORK/attn"
	for t in $attn_lengths; do
		for dd in $attn_dims; do
			for dt in $attn_dts; do
				f="$WORK/attn/t${t}_d${dd}_$dt.trace"
				if "$PYTHON" "$REPO/tools/gen/attn_cases.py" --lengths "$t" --dims "$dd" \
					--dtypes "$dt" -o "$f" 2>"$WORK/gen.err"; then
					echo "attn_check|$f||attention t$t d$dd $dt" >>"$jobs"
				else
					record attn_check "attention t$t d$dd $dt" "" fail 1 0 "$(cat "$WORK/gen.err")"
				fi
			done
		done
	done
fi
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if ! part memcheck; then
	:
elif [ "$DEVICE" = cuda ] && [ -n "$SANITIZER" ]; then
	for f in "${corpus[@]}"; do
		echo "memcheck|$f|$(bind_for "$(symbols "$f")" 3 17)|tests/traces/$(basename "$f")" >>"$jobs"
	done
else
	record memcheck compute-sanitizer "" skip 0 0 "compute-sanitizer not found or DEVICE=$DEVICE"
fi
export SANITIZER
echo "pool: $(wc -l <"$jobs") processes on $JOBS at a time until $((PHASE_END - T0))s"
xargs -r -d '\n' -P "$JOBS" -n 1 "$self" --job <"$jobs"
wait $bg_test $bg_torch $bg_backend $bg_host
part_done test_cuda
part_done torch
part_done backend
part_done host "$cpu, AVX-512 $avx512"
part_done check "$(grep -c '^check|' "$jobs") runs at $sizes"
part_done nccl
part_done attn_check "$(grep -c '^attn_check|' "$jobs") files: lengths $attn_lengths, dims $attn_dims, $attn_dts"
part_done graph
part_done memcheck

# ---- B. timings, one at a time ----------------------------------------------------------
bench_line() { # PART JSON-FILE: the file's object as one line of bench.jsonl
	printf '{"part": "%s", "result": %s}\n' "$1" "$(tr -d '\n' <"$2")" >>"$RUN_DIR/bench.jsonl"
}
# --graph against plain runs: seconds per iteration (CUDA events)
# (the 2-layer Llama is the graph part's; made here when that part did not run)
if part graph_time && [ "$DEVICE" = cuda ] && [ ! -f "$gl" ]; then
	"$PYTHON" "$REPO/tools/gen/llama.py" --layers 2 --hidden 512 --heads 8 \
		--intermediate 1376 --vocab 4096 --dtype bf16 -o "$gl" 2>"$WORK/gen.err" ||
		record graph_time llama.py "" fail 1 0 "$(cat "$WORK/gen.err")"
fi
if part graph_time && [ "$DEVICE" = cuda ] && [ -f "$gl" ]; then
	for f in "$REPO/tests/traces/llama_block.trace" "$gl"; do
		for bt in B=1,T=1 B=8,T=512; do
			[ "$(left)" -lt 60 ] && break 2
			g=$(timeout -k 5 60 "$FUSEC" run "$f" --device cuda --bind "$bt" \
				--iters 200 --graph --json 2>&1)
			p=$(timeout -k 5 60 "$FUSEC" run "$f" --device cuda --bind "$bt" \
				--iters 200 --json 2>&1)
			gs=$(printf '%s' "$g" | grep -o '"seconds_per_iter": [0-9.e+-]*' | grep -o '[0-9.e+-]*$')
			ps=$(printf '%s' "$p" | grep -o '"seconds_per_iter": [0-9.e+-]*' | grep -o '[0-9.e+-]*$')
			printf '{"part": "graph", "trace": %s, "bind": "%s", "graph_seconds_per_iter": %s, "plain_seconds_per_iter": %s}\n' \
				"$(json_str "$(basename "$f")")" "$bt" "${gs:-null}" "${ps:-null}" >>"$RUN_DIR/bench.jsonl"
			echo "     --graph $(basename "$f") $bt: ${gs:-?} s/iter, plain ${ps:-?}"
		done
	done
fi

# each kernel's device time under ncu: one Llama block at B=1, T=1, two runs
# (the first loads its modules); the summary prints the launches, their sum
# and the slowest
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if ! part profile; then
	:
elif [ "$DEVICE" != cuda ] || [ -z "$NCU" ]; then
	record profile ncu "" skip 0 0 "ncu not found or DEVICE=$DEVICE"
elif [ "$(left)" -lt 40 ]; then
	record profile ncu "" skip 0 0 "not started: out of time"
else
	t0=$(date +%s.%N)
	out=$(timeout -k 5 "$(timeout_for 90 "$END")" "$NCU" --csv \
		--metrics gpu__time_duration.sum "$FUSEC" run "$REPO/tests/traces/llama_block.trace" \
		--device cuda --bind B=1,T=1 --iters 2 2>&1)
	rc=$?
	printf '%s\n' "$out" | grep '^"' >"$RUN_DIR/profile.csv"
	sum=$("$PYTHON" - "$RUN_DIR/profile.csv" <<'PY' 2>&1
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
us = lambda r: float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit"), 1.0)
print("%d launches, %.1f us in all; slowest:" % (len(rows), sum(map(us, rows))))
for r in sorted(rows, key=us, reverse=True)[:6]:
    print("  %9.1f us  %s  grid %s block %s" % (us(r), r["Kernel Name"][:60],
                                              r.get("Grid Size"), r.get("Block Size")))
PY
)
	st=pass
	[ $rc -eq 0 ] && [ -s "$RUN_DIR/profile.csv" ] || st=fail
	printf '%s\n' "$sum"
	record profile "ncu llama_block.trace" "B=1,T=1" $st $rc "$(secs_since "$t0")" "$sum
$(printf '%s' "$out" | grep -v '^"' | tail -5)"
fi
part_done profile

# launch overhead and warm start: bench_cuda (exit 77: no device)
bench_cuda() { # PART NAME ARGS...: bench_cuda with a timeout, recorded
	local part=$1 name=$2 t0 out rc
	shift 2
	t0=$(date +%s.%N)
	out=$(timeout -k 5 "$(timeout_for 90 "$END")" "$BENCH_CUDA" "$@" 2>&1)
	rc=$?
	printf '%s\n' "$out" | tail -3
	record "$part" "$name" "" "$(status_of $rc)" $rc "$(secs_since "$t0")" "$out"
	return $rc
}
if part launch && bench_cuda launch "bench_cuda launch" launch --iters 10000 \
	--json "$WORK/launch.json"; then
	bench_line launch "$WORK/launch.json"
fi
part_done launch
# (a dry run: a small Llama, bench_cuda only says it has no device)
wsize=(--layers 32)
[ "$DEVICE" = cuda ] || wsize=(--layers 2 --hidden 256 --heads 4 --intermediate 688 --vocab 512)
if ! part warm_start; then
	:
elif [ "$(left)" -lt 60 ]; then
	record warm_start warmstart "" skip 0 0 "not started: out of time"
elif "$PYTHON" "$REPO/tools/gen/llama.py" "${wsize[@]}" -o "$WORK/llama2_7b_32.trace"; then
	t0=$(date +%s%N)
	FUSEC_CACHE_DIR="$WORK/cold-cache" bench_cuda warm_start cold warmstart \
		"$WORK/llama2_7b_32.trace" --bind B=1,T=1 --t0 "$t0" --json "$WORK/cold.json" &&
		bench_line warm_start_cold "$WORK/cold.json"
	if [ -f "$WORK/cold.json" ]; then
		t0c=$(date +%s.%N)
		out=$(timeout -k 5 120 "$FUSEC" compile "$WORK/llama2_7b_32.trace" --target "sm_$cc" \
			--bind B=1,T=1 --cache-dir "$WORK/warm-cache" --json 2>&1)
		rc=$?
		st=pass
		[ $rc -eq 0 ] || st=fail
		record warm_start "fusec compile --target sm_$cc" "" $st $rc "$(secs_since "$t0c")" "$out"
		for i in 1 2 3; do # three warm processes: the first pays the page cache
			t0=$(date +%s%N)
			FUSEC_CACHE_DIR="$WORK/warm-cache" bench_cuda warm_start "warm $i" warmstart \
				"$WORK/llama2_7b_32.trace" --bind B=1,T=1 --t0 "$t0" --json "$WORK/warm$i.json" &&
				bench_line "warm_start_warm$i" "$WORK/warm$i.json"
		done
	fi
else
	record warm_start "tools/gen/llama.py --layers 32" "" fail 1 0 "cannot write the trace"
fi
part_done warm_start

# the fused attention kernels against PyTorch's SDPA (FlashAttention or
# cuDNN) on the same card: TFLOP/s forward and backward
f="$REPO/tools/bench/attn_gpu_bench.py"
if ! part attention; then
	:
elif [ $have_torch = 0 ] || [ "$DEVICE" != cuda ]; then
	record attention attn_gpu_bench.py "" skip 0 0 "torch or a GPU absent"
elif [ "$(left)" -lt 45 ]; then
	record attention attn_gpu_bench.py "" skip 0 0 "not started: out of time"
else
	t0=$(date +%s.%N)
	q=()
	[ "$QUICK" = 1 ] && q=(--T 1024 --D 64)
	out=$(timeout -k 5 "$(timeout_for 150 "$END")" "${pyenv[@]}" "$PYTHON" "$f" \
		--budget "$(( $(left) > 150 ? 120 : $(left) - 30 ))" "${q[@]}" \
		--json "$RUN_DIR/attn_gpu.json" 2>&1)
	rc=$?
	st=pass
	[ $rc -eq 0 ] || st=fail
	printf '%s\n' "$out" | tail -15
	record attention attn_gpu_bench.py "" $st $rc "$(secs_since "$t0")" "$out"
fi
part_done attention

# the memory-bound fusions, in the time left
if ! part gpu_bench; then
	:
elif [ $have_torch = 0 ]; then
	record gpu_bench gpu_bench.py "" skip 0 0 "no torch at PYTHON=$PYTHON"
elif [ "$(left)" -lt 50 ]; then
	record gpu_bench gpu_bench.py "" skip 0 0 "not started: out of time"
else
	t0=$(date +%s.%N)
	# it starts no configuration after --budget and writes its JSON after
	# each: the 35 s between --budget and the timeout are for the one in hand
	q=()
	[ "$QUICK" = 1 ] && q=(--quick)
	[ -n "${GPU_BENCH_FUSIONS:-}" ] && q+=(--fusions "$GPU_BENCH_FUSIONS")
	[ -n "${GPU_BENCH_SHAPES:-}" ] && q+=(--shapes "$GPU_BENCH_SHAPES")
	gdev=$DEVICE
	[ "$DEVICE" = cuda ] || gdev=cpu
	out=$(timeout -k 5 "$(( $(left) - 5 ))" "${pyenv[@]}" "$PYTHON" \
		"$REPO/tools/bench/gpu_bench.py" --device "$gdev" --budget "$(( $(left) - 40 ))" \
		"${q[@]}" --json "$RUN_DIR/gpu_bench.json" 2>&1)
	rc=$?
	st=pass
	[ $rc -eq 0 ] || st=fail
	printf '%s\n' "$out" | grep -v '^\s*$' | tail -40
	record gpu_bench gpu_bench.py "" $st $rc "$(secs_since "$t0")" "$out"
fi
part_done gpu_bench

echo "run.sh: $failures failure(s) in $(( $(date +%s) - T0 ))s; results in $RUN_DIR:"
ls -l "$RUN_DIR" | tail -n +2
[ $failures -eq 0 ]
