#!/bin/sh
# dry_run.sh: tools/gpu/run.sh without a GPU, so that its plumbing cannot
# rot between the rare GPU runs (ctest gpu/dry_run, label gpu-dry).
#
#     tools/gpu/dry_run.sh BUILD PYTHON OUTDIR
#
# 1. run.sh from the build tree BUILD (the pack-free path) with DEVICE=emu
#    and QUICK=1 on a few corpus and exported traces: every part runs or
#    says why it is skipped (no CUDA device, no GPU-only tool), and it must
#    exit 0 with its result files in place and well-formed: at most 8
#    files (the device tool's limit), summary.json with every part and no
#    failure, one JSON object per line of checks.jsonl and bench.jsonl,
#    torch_cuda.json and gpu_bench.json from the two Python checks;
# 2. run.sh with the emulator told to fault (FUSEC_EMU_FAULT=load) on one
#    trace, PARTS=check: it must exit 1, the failure recorded in
#    checks.jsonl and counted in summary.json.
set -u
BUILD=${1:?usage: dry_run.sh BUILD PYTHON OUTDIR}
PY=${2:?usage: dry_run.sh BUILD PYTHON OUTDIR}
OUT=${3:?usage: dry_run.sh BUILD PYTHON OUTDIR}
run=$(cd "$(dirname "$0")" && pwd)/run.sh
rm -rf "$OUT"
mkdir -p "$OUT"
export FUSEC_CACHE_DIR="$OUT/cache" BUILD PYTHON="$PY" DEVICE=emu QUICK=1 JOBS=2
unset PARTS PACK FUSEC_EMU_FAULT
expect() { # RC NAME [VAR=VALUE...]: run.sh into OUT/NAME must exit RC
	want=$1 name=$2
	shift 2
	env "$@" "$run" "$OUT/$name" >"$OUT/$name.out" 2>&1
	rc=$?
	[ $rc -eq "$want" ] && return 0
	cat "$OUT/$name.out"
	echo "dry_run: run.sh ($name) exited $rc; expected $want"
	exit 1
}

expect 0 ok TRACES="casts llama_rmsnorm rotary cross_entropy" \
	EXPORTED="nanogpt_tiny_fwd_f32 llama_tiny_bwd_bf16" BUDGET=300 # a cap: phase A ends at 55%
"$PY" - "$OUT/ok" <<'EOF' || exit 1
import json, os, sys
d = sys.argv[1]
files = sorted(os.listdir(d))
assert len(files) <= 8, files
for f in ("log.txt", "summary.json", "checks.jsonl", "bench.jsonl"):
    assert f in files, (f, files)
s = json.load(open(os.path.join(d, "summary.json")))
parts = {p["part"]: p for p in s["parts"]}
want = ("probe test_cuda torch backend host check nccl attn_check memcheck graph profile "
        "launch warm_start attention gpu_bench").split()
assert sorted(parts) == sorted(want), sorted(parts)
assert s["failures"] == 0 and s["mode"] == "emu", s
checks = [json.loads(l) for l in open(os.path.join(d, "checks.jsonl"))]
for l in open(os.path.join(d, "bench.jsonl")):
    json.loads(l)
ran = [c for c in checks if c["part"] == "check" and c["status"] == "pass"]
# 4 corpus traces (rotary has no symbols: one run) and 2 exported, at 1,1
assert len(ran) == 6, [c["name"] for c in ran]
assert parts["check"]["passed"] == 6 and parts["nccl"]["passed"] == 1, parts
assert parts["attn_check"]["passed"] == 1, parts  # t17 d64 bf16
assert parts["host"]["passed"] == 1 and parts["host"]["failed"] == 0, parts  # test_cpu
assert isinstance(s["cpu_avx512"], bool) and s["cpu"], s
try:
    import torch  # noqa: F401  (without it the Python parts say so)
    py = 1
except ImportError:
    py = 0
assert parts["torch"]["passed"] == py and parts["gpu_bench"]["passed"] == py, parts
# no GPU here: the GPU-only parts must say why they were skipped
for p in ("test_cuda", "graph", "profile", "launch", "memcheck"):
    assert parts[p]["skipped"] >= 1 and parts[p]["failed"] == 0, parts[p]
if py:
    t = json.load(open(os.path.join(d, "torch_cuda.json")))
    assert t["failed"] == 0 and len(t["results"]) == 1, t
    g = json.load(open(os.path.join(d, "gpu_bench.json")))
    assert len(g["rows"]) == 8 and all("fusec" in r for r in g["rows"]), g["rows"]
assert "run.sh: 0 failure(s)" in open(os.path.join(d, "log.txt")).read()
EOF

expect 1 fault PARTS=check TRACES=llama_rmsnorm EXPORTED=none FUSEC_EMU_FAULT=load BUDGET=60
"$PY" - "$OUT/fault" <<'EOF' || exit 1
import json, os, sys
d = sys.argv[1]
s = json.load(open(os.path.join(d, "summary.json")))
checks = [json.loads(l) for l in open(os.path.join(d, "checks.jsonl"))]
bad = [c for c in checks if c["part"] == "check" and c["status"] == "fail"]
assert len(bad) == 1 and "llama_rmsnorm" in bad[0]["name"], checks
assert "out of bounds" in bad[0]["output"], bad[0]["output"]
assert s["failures"] >= 1 and [p["part"] for p in s["parts"]] == ["probe", "check"], s
EOF
echo "dry_run: ok ($OUT)"
