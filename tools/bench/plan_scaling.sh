#!/bin/sh
# Planning time per op, per pass, on Llama-2-7B checkpointed training steps
# (forward + backward, bf16, batch 1, sequence 2048) of 8, 16, 32, 64 and
# 128 layers, exported from PyTorch by tools/export_model.py; and the
# counted work per op of each pass (fz_program.pass_work), which must stay
# flat if planning is linear.
#
#     tools/bench/plan_scaling.sh [BUILD_DIR] [TRACE_DIR]
#
# BUILD_DIR: default build. TRACE_DIR: where the traces are, or are written
# (default /tmp/fusec-plan-scaling; never in the repository: 128 layers is
# 2.3 MB of text); a trace already there is reused, since exporting 128
# layers takes minutes. $PYTHON must have torch and transformers (default:
# /work/main/.venv/bin/python where it exists, else python3). $LAYERS
# overrides the depths, $REPS the repetitions (best and median reported).
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
dir=${2:-/tmp/fusec-plan-scaling}
layers=${LAYERS:-8 16 32 64 128}
reps=${REPS:-7}
if [ -z "$PYTHON" ]; then
  if [ -x /work/main/.venv/bin/python ]; then PYTHON=/work/main/.venv/bin/python
  else PYTHON=python3; fi
fi
mkdir -p "$dir"
files=
for n in $layers; do
  f="$dir/L$n/llama_7b_ckpt_bf16.trace"
  if [ ! -s "$f" ]; then
    "$PYTHON" "$root/tools/export_model.py" --model llama --size 7b --kind ckpt \
      --fake --dtype bf16 --batch 1 --seq 2048 --layers "$n" --out "$dir/L$n" >&2
  fi
  files="$files $f"
done
for f in $files; do
  printf '%s: ' "$(basename "$(dirname "$f")") layers"
  "$build/tools/bench/bench_plan" --reps "$reps" "$f" | tail -n +2
done
