#!/usr/bin/env python3
"""kernel_ab.py: two builds' kernels on cpu_bench.py's cases, CPU time, A/B.

A codegen change's effect on a kernel, where the wall times of a shared,
loaded machine would not show it: each case's trace (cpu_bench.py's, the
same shapes) is run by tools/bench/bench_kernel of build A and of build B
alternately, ROUNDS times each, FUSEC_THREADS=1 by default (the kernels run
in the calling thread, so its CPU time leaves out the turns other processes
take on the core; cache and memory contention stay in it), CALLS calls a
round on kept buffers; every round's median per call is kept, and the JSON
gets the median of them per build and B's speedup over A (a/b). Each build
gets a kernel cache of its own, fresh (FUSEC_CACHE_DIR in a temporary
folder): two branches may share a FZ_CODEGEN_VERSION and a kernel's key, and
A would run B's code from the user's cache.

    PYTHONPATH=tools/python .venv/bin/python tools/bench/kernel_ab.py \\
        --a /work/main/build --b build --cases rms_norm,softmax --rounds 5

Writes tools/bench/results/kernel_ab-<host>-<utc time>.json (or --out).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))


def one_round(build, path, calls, env):
    p = subprocess.run([os.path.join(build, "tools", "bench", "bench_kernel"), path,
                        str(calls)], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{build}: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="build directory A (the base)")
    ap.add_argument("--b", required=True, help="build directory B (the change)")
    ap.add_argument("--cases", required=True, help="cpu_bench.py case names, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="FUSEC_THREADS (default 1)")
    ap.add_argument("--label", default="", help="a note for the JSON")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    import cpu_bench

    env = dict(os.environ, FUSEC_THREADS=str(args.threads))
    key = "cpu_median_ms" if args.threads == 1 else "wall_median_ms"
    load0 = os.getloadavg()
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            g = torch.Generator().manual_seed(0)
            _, _, text = cpu_bench.CASES[name](g)
            path = os.path.join(tmp, name + ".trace")
            with open(path, "w") as f:
                f.write(text)
            per = {"a": [], "b": []}
            for r in range(args.rounds):
                for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    e = dict(env, FUSEC_CACHE_DIR=os.path.join(tmp, "cache-" + side))
                    d = one_round(getattr(args, side), path, args.calls, e)
                    per[side].append(d[key])
            a, b = statistics.median(per["a"]), statistics.median(per["b"])
            res[name] = {"a_ms": round(a, 3), "b_ms": round(b, 3),
                         "speedup": round(a / b, 3), "a_rounds": per["a"],
                         "b_rounds": per["b"]}
            print(f"{name:16s} a {a:8.3f} ms  b {b:8.3f} ms  a/b {a / b:5.2f}", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    out = {
        "what": "kernel_ab.py: build B against build A, per case " + key,
        "label": args.label,
        "a": os.path.abspath(args.a), "b": os.path.abspath(args.b),
        "threads": args.threads, "rounds": args.rounds, "calls": args.calls,
        "when": now.strftime("%Y-%m-%dT%H:%MZ"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "loadavg_before": load0, "loadavg_after": os.getloadavg(),
        "cases": res,
    }
    path = args.out or os.path.join(ROOT, "tools", "bench", "results",
                                    "kernel_ab-%s-%s.json" % (platform.node() or "host",
                                                              now.strftime("%Y%m%dT%H%MZ")))
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("written to", path)


if __name__ == "__main__":
    main()
