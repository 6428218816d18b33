#!/usr/bin/env python3
"""gqa_plan.py: what `fusec plan` makes of GQA written as Hugging Face's
repeat_kv before SDPA (kv heads unsqueezed, broadcast_in_dim to [B, Hkv,
g, T, D], reshaped to [B, Hq, T, D]; the backward's reshape and sum over
each group), forward alone and forward with backward, at Llama-3-8B's
attention shape by default. One or more fusec binaries (an older build
against a newer one): per binary and trace the planned peak, the kernels
and each region's bytes.

    python3 tools/bench/gqa_plan.py --fusec OLD --fusec build/tools/fusec \\
        [--batch 1 --heads 32 --kv-heads 8 --seq 4096 --head-dim 128 --dtype bf16]
        [-o tools/bench/results/gqa_plan-....json]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def trace(B, HQ, HKV, T, D, dt):
    g = HQ // HKV
    rep = lambda x: ("reshape(broadcast_in_dim(unsqueeze(%s, dim=2), shape=[%d, %d, %d, %d, %d], "
                     "dims=[0, 1, 2, 3, 4]), shape=[%d, %d, %d, %d])" % (x, B, HKV, g, T, D, B, HQ, T, D))
    red = lambda x: ("squeeze(sum(reshape(%s, shape=[%d, %d, %d, %d, %d]), dims=[2], keepdim=true), "
                     "dims=[2])" % (x, B, HKV, g, T, D))
    q = "q: %s[%d, %d, %d, %d]" % (dt, B, HQ, T, D)
    kv = "k: %s[%d, %d, %d, %d], v: %s[%d, %d, %d, %d]" % (dt, B, HKV, T, D, dt, B, HKV, T, D)
    do = "do: %s[%d, %d, %d, %d]" % (dt, B, HQ, T, D)
    head = "  kr = %s\n  vr = %s\n  o, lse = attention(q, kr, vr, causal=true)\n" % (rep("k"), rep("v"))
    return ("trace gqa_repeat_fwd(%s, %s) {\n%s  return o\n}\n" % (q, kv, head) +
            "trace gqa_repeat_fwd_bwd(%s, %s, %s) {\n%s"
            "  dq = attention_dq(q, kr, vr, o, lse, do, causal=true)\n"
            "  dkr, dvr = attention_dkv(q, kr, vr, o, lse, do, causal=true)\n"
            "  dk = %s\n  dv = %s\n  return o, dq, dk, dv\n}\n" % (q, kv, do, head, red("dkr"), red("dvr")))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="gqa_plan.py", description=__doc__.split("\n")[0])
    ap.add_argument("--fusec", action="append", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    path = os.path.join(tempfile.mkdtemp(prefix="gqa-plan-"), "gqa.trace")
    with open(path, "w") as f:
        f.write(trace(a.batch, a.heads, a.kv_heads, a.seq, a.head_dim, a.dtype))
    doc = {"command": " ".join(["python3", "tools/bench/gqa_plan.py"] + (argv or sys.argv[1:])),
           "shape": dict(batch=a.batch, heads=a.heads, kv_heads=a.kv_heads, seq=a.seq,
                         head_dim=a.head_dim, dtype=a.dtype),
           "runs": []}
    for fz in a.fusec:
        out = subprocess.run([fz, "plan", path, "--json"], capture_output=True, text=True,
                             check=True).stdout
        text = subprocess.run([fz, "plan", path], capture_output=True, text=True,
                              check=True).stdout
        j = json.loads(out)
        objs = j.get("traces", [j])
        for o in objs:
            o.pop("region_list", None)
            o.pop("order", None)
        doc["runs"].append({"fusec": fz, "plans": objs, "text": text})
        for o in objs:
            print("%-32s %-20s peak %12d bytes, %d kernels" % (
                fz, o["trace"], o["peak_bytes"], o["kernels"]))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
