#!/bin/sh
# How long planning a Llama-2-7B forward trace takes at 8, 32 and 128
# layers (tools/gen/llama.py's defaults are Llama-2-7B's shapes).
#
#     tools/bench/plan_scaling.sh [BUILD_DIR]     (default: build)
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 8 32 128; do
  python3 "$root/tools/gen/llama.py" --layers $n -o "$tmp/llama2_7b_${n}layers.trace"
done
"$build/tools/bench/bench_plan" --bind B=1,T=2048 --reps 7 \
  "$tmp/llama2_7b_8layers.trace" "$tmp/llama2_7b_32layers.trace" \
  "$tmp/llama2_7b_128layers.trace"
