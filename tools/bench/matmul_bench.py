#!/usr/bin/env python3
"""matmul_bench.py: the CPU target's matrix products against PyTorch's.

    PYTHONPATH=tools/python python3 tools/bench/matmul_bench.py
        [--dtypes f32,bf16,f16] [--rows 1,4,64,512] [--rounds 9]
        [--threads N] [--out tools/bench/results/matmul_bench-HOST.json]

A linear layer's product, y = x · wᵀ with x [M, K] and w [N, K], at the
weights of a 7B model's attention and MLP (K 4096 by N 4096 and 11008) and
a small model's vocabulary (K 512 by N 32000), for M rows: 1 and 4 are a
decode step's tokens (the few-row products blas.c reads its weight once
for), 64 and 512 a prefill's. Each is a fusec.Program(device="cpu") of
`linear(x, w)` beside torch's `x @ w.t()` on the same tensors, run
alternately (A, B, A, B, ...) so that the machine's load falls on both;
the report is medians of --rounds calls, in ms, and torch / fusec (above 1:
fusec is faster). The results are checked against torch first: a product
that disagrees by more than its dtype's tolerance stops the run.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))

import torch  # noqa: E402

import fusec  # noqa: E402

SHAPES = [(4096, 4096), (4096, 11008), (512, 32000)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# |error| allowed against torch, relative to the result's rms: two
# roundings of the result's dtype and the f32 sums' difference in order
TOL = {"f32": 1e-4, "bf16": 2e-2, "f16": 4e-3}
BLAS = [None]


def timed(fn, rounds):
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def one(dname, M, K, N, rounds):
    dt = DTYPES[dname]
    g = torch.Generator().manual_seed(M * 7 + K * 3 + N)
    x = torch.randn(M, K, generator=g).to(dt)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dt)
    text = (f"trace mm(x: {dname}[{M}, {K}], w: {dname}[{N}, {K}]) {{\n"
            f"  y = linear(x, w)\n  return y\n}}\n")
    p = fusec.Program(text, device="cpu")
    BLAS[0] = fusec.cpu_blas()  # while p holds the CPU target
    got = p(x, w)
    want = x @ w.t()
    err = (got.float() - want.float()).abs().max().item()
    rms = want.float().pow(2).mean().sqrt().item()
    if err > TOL[dname] * max(rms, 1e-30):
        sys.exit(f"matmul_bench: {dname} M {M} K {K} N {N}: fusec differs from "
                 f"torch by {err:.3g} (rms {rms:.3g})")
    ft, tt = [], []
    for _ in range(rounds):  # alternate, one call each
        ft += timed(lambda: p(x, w), 1)
        tt += timed(lambda: x @ w.t(), 1)
    fm, tm = statistics.median(ft) * 1e3, statistics.median(tt) * 1e3
    return {"dtype": dname, "M": M, "K": K, "N": N, "fusec_ms": fm,
            "torch_ms": tm, "torch_over_fusec": tm / fm, "max_err": err,
            "rms": rms}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--rows", default="1,4,64,512")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads and FUSEC_THREADS (0: defaults)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["FUSEC_THREADS"] = str(a.threads)
    res = []
    for dname in a.dtypes.split(","):
        if dname not in DTYPES:
            sys.exit(f"matmul_bench: --dtypes: unknown dtype '{dname}' "
                     f"(f32, bf16, f16)")
        for M in (int(r) for r in a.rows.split(",")):
            for K, N in SHAPES:
                r = one(dname, M, K, N, a.rounds)
                res.append(r)
                print(f"{dname:5} M {M:4} K {K:5} N {N:5}: fusec {r['fusec_ms']:8.2f} ms"
                      f"  torch {r['torch_ms']:8.2f} ms  torch/fusec "
                      f"{r['torch_over_fusec']:5.2f}", flush=True)
    ratios = [r["torch_over_fusec"] for r in res]
    gm = statistics.geometric_mean(ratios)
    print(f"geomean torch/fusec {gm:.2f}, worst {min(ratios):.2f}")
    out = a.out or os.path.join(
        REPO, "tools", "bench", "results",
        f"matmul_bench-{platform.node()}-{time.strftime('%Y%m%dT%H%MZ', time.gmtime())}.json")
    doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "cpu": platform.processor() or platform.machine(),
           "threads": torch.get_num_threads(), "torch": torch.__version__,
           "blas": BLAS[0],
           "rounds": a.rounds, "results": res,
           "summary": {"geomean_torch_over_fusec": gm, "worst": min(ratios)}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
