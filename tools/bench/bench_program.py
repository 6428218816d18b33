#!/usr/bin/env python3
"""bench_program.py: what a framework pays per fusec.Program call.

    python3 tools/bench/bench_program.py [--fusec build/tools/fusec]
        [--calls 20000] [--iters 200] [--out tools/bench/results/program.json]

Two figures, each beside its reference in the same run:

  small    `x * y + 1.0` over 16 floats: Program(device="cpu") call against
           PyTorch eager on the same tensors; medians of batches of calls
           (goal: a call at most 15 us);
  llama    tests/traces/llama_block.trace (hidden 256, bf16) at B=2, T=16
           and at B=2, T=256: Program call against `fusec run --iters N` on
           the same trace and sizes (the C runner alone; goal: Python within
           5% of it). At T=16 a call is about 1.7 ms of small kernels, so
           what the Python side costs per call shows; at T=256 a call is a
           sequence's worth of work.

Runs alternate (A, B, A, B, ...) so that the load of a shared machine falls
on both; the report is medians and their ratio. Needs PyTorch and the
library (FUSEC_LIBRARY or build/libfusec.so).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "python"))

import torch  # noqa: E402

import fusec  # noqa: E402

SMALL = "trace f(x: f32[16], y: f32[16]) {\n  z = add(mul(x, y), 1.0)\n  return z\n}\n"


def per_call(fn, calls, batch=1000):
    """Median seconds per call over batches of `batch` calls."""
    times = []
    for _ in range(max(1, calls // batch)):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch)
    return statistics.median(times)


def random_inputs(prog, sizes):
    """Inputs of the program's parameter dtypes at the bound sizes."""
    lib = prog._lib
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
          "f64": torch.float64, "i64": torch.int64, "i32": torch.int32,
          "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}
    import ctypes
    s = (ctypes.c_int64 * max(1, len(prog.symbols)))(
        *[sizes.get(n, -1) for n in prog.symbols] or [-1])
    ins = []
    for i, (name, dname, rank) in enumerate(prog.params):
        v = lib.fz_trace_param(prog._t, i)
        shape = tuple(lib.fz_value_extent(v, d, s) for d in range(rank))
        if dname == "bool":
            ins.append(torch.rand(shape) < 0.5)
        elif dname.startswith(("i", "u")):
            ins.append(torch.zeros(shape, dtype=dt[dname]))
        else:
            ins.append((torch.randn(shape) * 0.1).to(dt[dname]))
    return ins


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fusec", default=os.path.join(REPO, "build", "tools", "fusec"))
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)

    # small: Program against eager
    p = fusec.Program(SMALL, device="cpu")
    x, y = torch.randn(16), torch.randn(16)
    assert torch.equal(p(x, y), x * y + 1.0)
    prog_s, eager_s = [], []
    for _ in range(a.rounds):
        prog_s.append(per_call(lambda: p(x, y), a.calls))
        eager_s.append(per_call(lambda: x * y + 1.0, a.calls))
    small = {"program_us": statistics.median(prog_s) * 1e6,
             "eager_us": statistics.median(eager_s) * 1e6}
    small["ratio_to_eager"] = small["program_us"] / small["eager_us"]

    # llama block: Program against the C runner through `fusec run`
    path = os.path.join(REPO, "tests", "traces", "llama_block.trace")
    with open(path) as f:
        text = f.read()
    q = fusec.Program(text, device="cpu")

    def llama_at(T, iters):
        ins = random_inputs(q, {"B": 2, "T": T})
        q(*ins)
        py_s, c_s = [], []
        for _ in range(a.rounds):
            py_s.append(per_call(lambda: q(*ins), iters, batch=iters))
            out = subprocess.run([a.fusec, "run", path, "--bind", f"B=2,T={T}",
                                  "--iters", str(iters), "--json"],
                                 capture_output=True, text=True, check=True)
            c_s.append(json.loads(out.stdout)["seconds_per_iter"])
        r = {"program_ms": statistics.median(py_s) * 1e3,
             "fusec_run_ms": statistics.median(c_s) * 1e3}
        r["ratio"] = r["program_ms"] / r["fusec_run_ms"]
        return r

    res = {"small_16_floats": small,
           "llama_block_B2_T16": llama_at(16, a.iters),
           "llama_block_B2_T256": llama_at(256, max(1, a.iters // 10)),
           "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "load_average": os.getloadavg()[0], "calls": a.calls,
           "iters": a.iters, "rounds": a.rounds}
    print(json.dumps(res, indent=2))
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
