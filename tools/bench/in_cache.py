#!/usr/bin/env python3
"""in_cache.py: is a kernel bound by memory or by its instructions?

cpu_bench.py reports each memory-bound case as a fraction of the machine's
copy bandwidth. Where a case stays below the goal, this says whether more
bandwidth could help at all: every case's trace (cpu_bench.py's, the same
row length) runs at its own size and at a few rows only, small enough to
stay in the L2 cache between calls, through tools/bench/bench_kernel at one
thread (its CPU time; FUSEC_THREADS=1, a fresh kernel cache), and the time
per element of the two is compared. A kernel as fast per element out of
memory as out of L2 is bound by its instructions: no change to how it
reads or writes memory can make it faster, only fewer instructions an
element can (or more cores). in_cache/memory near 1.0 says that; well
below 1.0 (the L2 run faster) says memory is what it waits for.

With --cpu-bench FILE (a cpu_bench.py result) each case also gets its
ceiling: the fraction of that run's copy bandwidth the case would reach if
all of that run's threads computed at the in-L2 rate, its bytes moving for
free (ceiling_of_copy = bytes / (in-L2 time at full size / threads) / copy
bandwidth, the copy the case was measured against). A ceiling below
cpu_bench's goal of 0.8 is a kernel that cannot meet it on this machine
without fewer instructions an element.

    PYTHONPATH=tools/python .venv/bin/python tools/bench/in_cache.py \\
        --cases gelu_bias,swiglu --rounds 5

Writes tools/bench/results/in_cache-<host>-<utc time>.json (or --out).
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import kernel_ab  # noqa: E402

# Each case's trace made small: the same rows, fewer of them (a working set
# of 0.5 to 2 MB), by replacing the text of its leading extents.
SMALL = {
    "rms_norm": [("[4096, 4096]", "[64, 4096]")],
    "softmax": [("[4096, 2048]", "[64, 2048]")],
    "gelu_bias": [("[4096, 4096]", "[64, 4096]")],
    "swiglu": [("[4096, 4096]", "[64, 4096]")],
    "add_rms_norm": [("[2048, 4096]", "[64, 4096]")],
    "add_layer_norm": [("[2048, 4096]", "[64, 4096]")],
    "rotary": [("[4, 1024, 32, 128]", "[1, 64, 32, 128]"),
               ("[1024, 1, 128]", "[64, 1, 128]"),
               ("end=[4, 1024,", "end=[1, 64,")],
    "cross_entropy": [("2048", "16")],
    "softmax_bwd": [("[4096, 2048]", "[64, 2048]")],
}


def elements(text):
    """The element count of the trace's largest parameter (a time per
    element of it: the same measure at both sizes)."""
    sig = text.split("{", 1)[0]
    best = 0
    for dims in re.findall(r"\[([0-9, ]+)\]", sig):
        n = 1
        for d in dims.split(","):
            n *= int(d)
        best = max(best, n)
    return best


def per_call(build, path, calls, cache):
    """bench_kernel's median CPU ms a call, at one thread, in cache."""
    env = dict(os.environ, FUSEC_THREADS="1", FUSEC_CACHE_DIR=cache)
    return kernel_ab.one_round(build, path, calls, env)["cpu_median_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(SMALL),
                    help="comma-separated, from: " + ", ".join(SMALL))
    ap.add_argument("--rounds", type=int, default=5, help="alternate runs of each size")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--cpu-bench", default=None, metavar="FILE",
                    help="a cpu_bench.py result: each case's ceiling as a fraction of copy")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch
    import cpu_bench
    cb = None
    if a.cpu_bench:
        with open(a.cpu_bench) as f:
            cb = json.load(f)
        cb_bytes = {r["case"]: r.get("bytes") for r in cb["results"]}
        # each case's own copy, measured just before it (cpu_bench.py
        # from 61967cb on), else the run's
        cb_copy = {r["case"]: r.get("copy_GBps") or cb["summary"]["copy_GBps"]
                   for r in cb["results"]}
        threads = cb.get("threads") or os.cpu_count()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.cases.split(","):
            if name not in SMALL:
                sys.exit("in_cache.py: no small form of case '%s'" % name)
            g = torch.Generator().manual_seed(0)
            text = getattr(cpu_bench, "case_" + name)(g)[2]
            small = text
            for old, new in SMALL[name]:
                if old not in small:
                    sys.exit("in_cache.py: %s: '%s' is not in its trace" % (name, old))
                small = small.replace(old, new)
            paths = []
            for tag, t in (("memory", text), ("in_cache", small)):
                path = os.path.join(tmp, "%s.%s.trace" % (name, tag))
                with open(path, "w") as f:
                    f.write(t)
                paths.append((tag, path, elements(t)))
            ms = {tag: [] for tag, _, _ in paths}
            for _ in range(a.rounds):
                for tag, path, n in paths:
                    calls = 20 if tag == "memory" else 400
                    ms[tag].append(per_call(a.build, path, calls, os.path.join(tmp, "cache")))
            row = {"case": name}
            for tag, _, n in paths:
                row[tag + "_elements"] = n
                row[tag + "_ms"] = statistics.median(ms[tag])
                row[tag + "_ns_per_element"] = 1e6 * row[tag + "_ms"] / n
            row["in_cache_over_memory"] = (row["in_cache_ns_per_element"] /
                                           row["memory_ns_per_element"])
            ceiling = ""
            if cb and cb_bytes.get(name):
                t = row["in_cache_ns_per_element"] * row["memory_elements"] / threads
                row["ceiling_of_copy"] = cb_bytes[name] / t / cb_copy[name]  # bytes/ns = GB/s
                ceiling = "   ceiling %.2f of copy" % row["ceiling_of_copy"]
            results.append(row)
            print("%-16s memory %7.3f ns/element   in L2 %7.3f   in_cache/memory %.2f%s" %
                  (name, row["memory_ns_per_element"], row["in_cache_ns_per_element"],
                   row["in_cache_over_memory"], ceiling), flush=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    out = a.out or os.path.join(ROOT, "tools", "bench", "results", "in_cache-%s-%s.json" % (
        platform.node(), now.strftime("%Y%m%dT%H%M%SZ")))
    doc = {"when": now.isoformat(), "host": platform.node(), "rounds": a.rounds,
           "loadavg": os.getloadavg(), "threads": 1, "cpu_bench": a.cpu_bench,
           "results": results}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print("written to", out)


if __name__ == "__main__":
    main()
