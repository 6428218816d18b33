#!/bin/sh
# fsdp_sim.sh: the simulated FSDP step of Llama-2-7B on 8 x H100, written
# order against communication scheduling (the numbers in the README's
# "Distributed" section and in issue 12's note).
#
#     sh tools/bench/fsdp_sim.sh [FUSEC] [OUT_DIR]
#
# seq 4096, micro-batch 2 (B=2, T=4096), world 8, bf16; the inflight cap is
# two layers' gathered parameters (2 x 386 MiB = 772 MiB). Writes
# trace-order.svg and scheduled.svg into OUT_DIR (default /tmp/fsdp_sim).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
fusec=${1:-$here/build/tools/fusec}
out=${2:-/tmp/fsdp_sim}
mkdir -p "$out"
python3 "$here/tools/gen/fsdp_llama.py" --world 8 --layers 32 -o "$out/fsdp7b.trace"
bind="--bind B=2,T=4096"
"$fusec" sim "$out/fsdp7b.trace" --world 8 $bind --trace-order --svg "$out/trace-order.svg"
"$fusec" sim "$out/fsdp7b.trace" --world 8 $bind --max-inflight-bytes 772M \
	--svg "$out/scheduled.svg"
"$fusec" sim "$out/fsdp7b.trace" --world 8 $bind --max-inflight-bytes 772M \
	--tflops 600 | sed 's/^/(at 600 TFLOP\/s achieved) /'
