#!/usr/bin/env python3
"""Writes the two seed-004 memory-chain traces (same graph, two statement orders).

    python3 tools/gen/seed004.py [--out-dir tests/traces] [--peak]

Ten independent paths p_i = relu(x_i); m_i = matmul(p_i, w_i); r_i = relu(m_i)
feed a chain acc_0 = matmul(r_0, v), acc_i = matmul(acc_{i-1}, r_i) (i = 1..9):
10 + 10 = 20 matmuls, all on f32[256, 256].

--peak prints, for each order, the peak bytes of live intermediates and outputs
(a tensor is live from the statement that defines it through the statement
that last uses it; outputs never die; parameters are not counted).
Standard library only; deterministic.
"""
import argparse
import os
import sys

N = 10
SHAPE = "f32[256, 256]"
BYTES = 256 * 256 * 4

HEADER = """\
# seed-004 memory chain ({order} order).
#
# The reported problem: a 10-path relu/matmul chain peaks at 0.75 MiB when run
# eagerly in the order below, and at 2.25 MiB once horizontal fusion has
# batched the ten relus together. Shapes are those of the report: every tensor
# is f32[256, 256] (262144 bytes).
#
# Ten independent paths, each
#     p_i = relu(x_i); m_i = matmul(p_i, w_i); r_i = relu(m_i)
# feed a chain that combines them:
#     acc_0 = matmul(r_0, v); acc_i = matmul(acc_{{i-1}}, r_i)   for i = 1..9
# That is 20 matmuls in all: 10 in the paths, 10 in the chain. Inputs
# (x_i, w_i, v) are parameters.
#
{note}#
# seed004_chain_efficient.trace and seed004_chain_stages.trace hold the same
# graph; only the order of the statements differs.
# Written by tools/gen/seed004.py; do not edit by hand.
"""

NOTE_EFF = """\
# Depth-first order: each path is written right before the chain consumes it.
# Peak of live intermediates and outputs in this order (parameters not
# counted): 3 tensors = 786432 bytes (0.75 MiB), reached e.g. at m_1 = matmul
# (p_1, w_1) while acc_0 and p_1 are still live.
"""

NOTE_STG = """\
# Stage-by-stage order (what horizontal fusion of the ten relus produces): all
# ten relus, then all ten path matmuls, then all ten relus, then the chain.
# Peak in this order: 11 tensors = 2883584 bytes (e.g. the ten p_i plus m_0);
# a memory-aware scheduler should bring it back to 786432 bytes.
"""


def params():
    ps = []
    for i in range(N):
        ps.append("x%d: %s" % (i, SHAPE))
        ps.append("w%d: %s" % (i, SHAPE))
    ps.append("v: %s" % SHAPE)
    return ps


def path(i):
    return [
        ("p%d" % i, "relu(x%d)" % i),
        ("m%d" % i, "matmul(p%d, w%d)" % (i, i)),
        ("r%d" % i, "relu(m%d)" % i),
    ]


def chain(i):
    if i == 0:
        return ("acc0", "matmul(r0, v)")
    return ("acc%d" % i, "matmul(acc%d, r%d)" % (i - 1, i))


def efficient():
    st = []
    for i in range(N):
        st += path(i)
        st.append(chain(i))
    return st


def stages():
    paths = [path(i) for i in range(N)]
    st = []
    for k in range(3):
        st += [p[k] for p in paths]
    st += [chain(i) for i in range(N)]
    return st


def peak(stmts, outputs):
    last = {}
    for idx, (name, expr) in enumerate(stmts):
        for tok in expr.replace("(", " ").replace(")", " ").replace(",", " ").split():
            last[tok] = idx
    live, best = set(), 0
    for idx, (name, expr) in enumerate(stmts):
        live.add(name)
        best = max(best, len(live) * BYTES)
        for v in list(live):
            if v not in outputs and last.get(v, -1) <= idx:
                live.discard(v)
    return best


def render(name, order, note, stmts):
    out = [HEADER.format(order=order, note=note)]
    out.append("trace %s(\n    %s) {\n" % (name, ",\n    ".join(params())))
    for n, e in stmts:
        out.append("  %s = %s\n" % (n, e))
    out.append("  return acc%d\n}\n" % (N - 1))
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=os.path.join("tests", "traces"))
    ap.add_argument("--peak", action="store_true", help="print the peak bytes of both orders")
    a = ap.parse_args()
    outs = {"acc%d" % (N - 1)}
    eff, stg = efficient(), stages()
    assert sorted(eff) == sorted(stg)
    assert sum(e.startswith("matmul") for _, e in eff) == 20
    if a.peak:
        print("efficient", peak(eff, outs))
        print("stages", peak(stg, outs))
        return 0
    for fname, tname, order, note, st in (
        ("seed004_chain_efficient.trace", "seed004_chain_efficient", "efficient", NOTE_EFF, eff),
        ("seed004_chain_stages.trace", "seed004_chain_stages", "stages", NOTE_STG, stg),
    ):
        with open(os.path.join(a.out_dir, fname), "w") as f:
            f.write(render(tname, order, note, st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
