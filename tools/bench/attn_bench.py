#!/usr/bin/env python3
"""attn_bench.py: fusec's fused attention on the CPU against PyTorch's SDPA.

Causal attention forward plus backward, the three cases of issue 22:

  f32        B=1, H=16, T=2048, D=64, f32
  bf16       the same in bf16
  gqa_bf16   16 query heads over 4 kv heads (GQA 16:4), bf16

Each runs two ways in one process, on the same inputs, interleaved round by
round (a burst of load from another process hits both alike), and the
median over the rounds is reported:

  torch   F.scaled_dot_product_attention(q, k, v, is_causal=True,
          enable_gqa=...) and .backward(do) through autograd: PyTorch's own
          CPU kernel (flash attention for the CPU), forward and backward
  fusec   fusec.Program(text, device="cpu") on one trace:
              o, lse = attention(q, k, v, causal=true)
              dq = attention_dq(q, k, v, o, lse, do, causal=true)
              dk, dv = attention_dkv(q, k, v, o, lse, do, causal=true)
          (the three fused kernels of codegen/attention.c)

The gradients of the first round are compared with torch's (max abs error
relative to the largest gradient), so a fast wrong answer is seen. The
summary is torch time / fusec time per case and their geometric mean (the
issue's goal: >= 1.0).

    tools/bench/attn_bench.py                     the three cases, 5 rounds
    tools/bench/attn_bench.py --cases f32 --T 512 --rounds 3
    tools/bench/attn_bench.py --parts             also each pass alone: torch's
                                                  forward and backward, fusec's
                                                  attention, attention_dq and
                                                  attention_dkv (one trace each)
    tools/bench/attn_bench.py --small             a training step's short sequences
                                                  (issue 25.3): B=4, H 4 and 16,
                                                  T 128 and 512, D 64 and 128,
                                                  f32 and bf16, 20 rounds

--decode times a decode step instead: one query row per head (--tq for
more) against a KV cache of T keys, forward only, no mask (the row sees
every key), torch's SDPA against fusec's attention, 20 steps a round; the
default T is 4096 and D 128 there (a 7B model's head).

--mask gives the causal rule as a bool tensor [B, 1, T, T] instead: torch's
attn_mask and fusec's mask operand (a trace input), as HF's Llama hands SDPA
its mask under torch.compile (the kernels then read the mask block by block).

--B, --H (query heads; the kv heads keep the case's ratio), --T and --D take
comma-separated lists; every combination runs. At short sequences one step
is a few milliseconds, so --small takes more rounds (and several steps per
round, --reps) for a steady median.

Writes tools/bench/results/attn_bench-<host>-<utc time>.json (or --out) and
prints a table. Run from the repository root with a built tree (build/) and
the venv that has torch.
"""

import argparse
import json
import math
import os
import platform
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusec  # noqa: E402

CASES = {
    "f32": (16, 16, "f32", torch.float32),
    "bf16": (16, 16, "bf16", torch.bfloat16),
    "gqa_bf16": (16, 4, "bf16", torch.bfloat16),
}


def rule(B, T, mask):
    """(the trace parameter, the causal rule as attention arguments)"""
    if mask:
        return ", m: bool[%d, 1, %d, %d]" % (B, T, T), ", m"
    return "", ", causal=true"


def sdpa(q, k, v, mask):
    """torch's SDPA, causal by is_causal or by the bool tensor mask"""
    gqa = k.shape[1] != q.shape[1]
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def trace_text(B, H, HKV, T, D, dt, mask=False):
    q = "%s[%d, %d, %d, %d]" % (dt, B, H, T, D)
    kv = "%s[%d, %d, %d, %d]" % (dt, B, HKV, T, D)
    mp, c = rule(B, T, mask)
    return ("trace attn(q: %s, k: %s, v: %s, do: %s%s) {\n"
            "  o, lse = attention(q, k, v%s)\n"
            "  dq = attention_dq(q, k, v, o, lse, do%s)\n"
            "  dk, dv = attention_dkv(q, k, v, o, lse, do%s)\n"
            "  return o, dq, dk, dv\n}\n" % (q, kv, kv, q, mp, c, c, c))


def pass_traces(B, H, HKV, T, D, dt, mask=False):
    """fusec's three passes, one trace each (the --parts breakdown)."""
    q = "%s[%d, %d, %d, %d]" % (dt, B, H, T, D)
    kv = "%s[%d, %d, %d, %d]" % (dt, B, HKV, T, D)
    lse = "f32[%d, %d, %d]" % (B, H, T)
    mp, c = rule(B, T, mask)
    args = "q: %s, k: %s, v: %s, o: %s, lse: %s, do: %s%s" % (q, kv, kv, q, lse, q, mp)
    return {
        "fwd": "trace fwd(q: %s, k: %s, v: %s%s) {\n  o, lse = attention(q, k, v%s)\n"
               "  return o, lse\n}\n" % (q, kv, kv, mp, c),
        "dq": "trace dq(%s) {\n  dq = attention_dq(q, k, v, o, lse, do%s)\n"
              "  return dq\n}\n" % (args, c),
        "dkv": "trace dkv(%s) {\n  dk, dv = attention_dkv(q, k, v, o, lse, do%s)\n"
               "  return dk, dv\n}\n" % (args, c),
    }


def run_parts(B, H, HKV, T, D, dt, q, k, v, do, rounds, reps=1, m=None):
    """Median ms of each pass alone, interleaved round by round."""
    progs = {n: fusec.Program(t, device="cpu")
             for n, t in pass_traces(B, H, HKV, T, D, dt, m is not None).items()}
    ms = () if m is None else (m,)
    o, lse = progs["fwd"](q, k, v, *ms)
    args = {"fwd": (q, k, v) + ms, "dq": (q, k, v, o, lse, do) + ms,
            "dkv": (q, k, v, o, lse, do) + ms}
    ts = {n: [] for n in ("torch_fwd", "torch_bwd", "fwd", "dq", "dkv")}
    for r in range(rounds + 1):
        got = {"torch_fwd": 0.0, "torch_bwd": 0.0}
        for _ in range(reps):
            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
            t0 = time.perf_counter()
            oo = sdpa(qq, kk, vv, m)
            t1 = time.perf_counter()
            oo.backward(do)
            t2 = time.perf_counter()
            got["torch_fwd"] += (t1 - t0) / reps
            got["torch_bwd"] += (t2 - t1) / reps
        for n, p in progs.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                p(*args[n])
            got[n] = (time.perf_counter() - t0) / reps
        if r:  # the first round warms up
            for n, x in got.items():
                ts[n].append(x)
    return {n: statistics.median(x) * 1e3 for n, x in ts.items()}


def case_heads(name, H=0):
    """(query heads, kv heads, fusec dtype, torch dtype) of a case; at H
    query heads when H is given, the case's ratio to kv heads kept."""
    H0, HKV, dt, tdt = CASES[name]
    if H:
        return H, max(1, H * HKV // H0), dt, tdt
    return H0, HKV, dt, tdt


def operands(B, H, HKV, tq, T, D, tdt):
    """Random q [B, H, tq, D], k and v [B, HKV, T, D], and the generator
    that drew them (seed 0)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, tq, D, generator=g).to(tdt)
    k = torch.randn(B, HKV, T, D, generator=g).to(tdt)
    v = torch.randn(B, HKV, T, D, generator=g).to(tdt)
    return q, k, v, g


def run_case(name, B, T, D, rounds, parts=False, H=0, reps=1, mask=False):
    H, HKV, dt, tdt = case_heads(name, H)
    q, k, v, g = operands(B, H, HKV, T, T, D, tdt)
    do = torch.randn(B, H, T, D, generator=g).to(tdt)
    m = None
    if mask:
        m = torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T).contiguous()
    ms = () if m is None else (m,)

    def torch_step():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        o = sdpa(qq, kk, vv, m)
        o.backward(do)
        return o, qq.grad, kk.grad, vv.grad

    prog = fusec.Program(trace_text(B, H, HKV, T, D, dt, mask), device="cpu")

    def fusec_step():
        return prog(q, k, v, do, *ms)

    # warm up and compare once
    ref = torch_step()
    got = fusec_step()
    errs = {}
    for nm, a, b in zip(("o", "dq", "dk", "dv"), got, ref):
        a, b = a.detach().float(), b.detach().float()
        errs[nm] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    tt, tf = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch_step()
        t1 = time.perf_counter()
        for _ in range(reps):
            fusec_step()
        t2 = time.perf_counter()
        tt.append((t1 - t0) / reps)
        tf.append((t2 - t1) / reps)
    r = {"case": name, "B": B, "H": H, "HKV": HKV, "T": T, "D": D, "dtype": dt,
         "mask": bool(mask),
         "torch_ms": statistics.median(tt) * 1e3, "fusec_ms": statistics.median(tf) * 1e3,
         "torch_ms_all": [x * 1e3 for x in tt], "fusec_ms_all": [x * 1e3 for x in tf],
         "rel_err": errs}
    r["torch_over_fusec"] = r["torch_ms"] / r["fusec_ms"]
    if parts:
        r["parts_ms"] = run_parts(B, H, HKV, T, D, dt, q, k, v, do, rounds, reps, m)
    return r


def run_decode(name, B, T, D, rounds, H=0, reps=20, tq=1):
    """A decode step: tq query rows per head against T cached keys."""
    H, HKV, dt, tdt = case_heads(name, H)
    q, k, v, _ = operands(B, H, HKV, tq, T, D, tdt)
    prog = fusec.Program(
        "trace dec(q: %s[%d, %d, %d, %d], k: %s[%d, %d, %d, %d], v: %s[%d, %d, %d, %d]) {\n"
        "  o, lse = attention(q, k, v)\n  return o\n}\n"
        % (dt, B, H, tq, D, dt, B, HKV, T, D, dt, B, HKV, T, D), device="cpu")
    gqa = HKV != H
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    got = prog(q, k, v)
    err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
    tt, tf = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        t1 = time.perf_counter()
        for _ in range(reps):
            prog(q, k, v)
        t2 = time.perf_counter()
        tt.append((t1 - t0) / reps)
        tf.append((t2 - t1) / reps)
    r = {"case": name, "decode": True, "tq": tq, "B": B, "H": H, "HKV": HKV, "T": T,
         "D": D, "dtype": dt, "mask": False,
         "torch_ms": statistics.median(tt) * 1e3, "fusec_ms": statistics.median(tf) * 1e3,
         "torch_ms_all": [x * 1e3 for x in tt], "fusec_ms_all": [x * 1e3 for x in tf],
         "rel_err": {"o": err}}
    r["torch_over_fusec"] = r["torch_ms"] / r["fusec_ms"]
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(prog="attn_bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--B", default="1")
    ap.add_argument("--H", default="0", help="query heads (0: the case's 16)")
    ap.add_argument("--T", default="2048")
    ap.add_argument("--D", default="64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=1, help="steps per round")
    ap.add_argument("--small", action="store_true",
                    help="B=4, H=4,16, T=128,512, D=64,128, f32 and bf16, 20 rounds")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (fusec: FUSEC_THREADS); 0: all")
    ap.add_argument("--mask", action="store_true",
                    help="the causal rule as a bool tensor [B, 1, T, T] (HF's Llama)")
    ap.add_argument("--parts", action="store_true",
                    help="also time each pass alone (torch fwd, bwd; fusec fwd, dq, dkv)")
    ap.add_argument("--decode", action="store_true",
                    help="a decode step: --tq query rows against T cached keys, forward")
    ap.add_argument("--tq", type=int, default=1, help="query rows of a decode step")
    ap.add_argument("--note", default="", help="a note kept in the JSON (the machine's load)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.small:
        a.B, a.H, a.T, a.D = "4", "4,16", "128,512", "64,128"
        if a.cases == ",".join(CASES):
            a.cases = "f32,bf16"
        a.rounds = max(a.rounds, 20)
    if a.decode:
        a.T = "4096" if a.T == "2048" else a.T
        a.D = "128" if a.D == "64" else a.D
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["FUSEC_THREADS"] = str(a.threads)
    load0 = os.getloadavg()
    results = []
    ints = lambda x: [int(v) for v in x.split(",")]  # noqa: E731
    print("%-10s %3s %3s %5s %4s %10s %10s %8s  %s" % (
        "case", "B", "H", "T", "D", "torch ms", "fusec ms", "t/f", "rel err (o dq dk dv)"))
    for name in a.cases.split(","):
        for B in ints(a.B):
            for H in ints(a.H):
                for T in ints(a.T):
                    for D in ints(a.D):
                        if a.decode:
                            r = run_decode(name, B, T, D, a.rounds, H,
                                           max(a.reps, 20), a.tq)
                        else:
                            r = run_case(name, B, T, D, a.rounds, a.parts, H, a.reps,
                                         a.mask)
                        results.append(r)
                        e = r["rel_err"]
                        print("%-10s %3d %3d %5d %4d %10.3f %10.3f %8.2f  %s" % (
                            name, B, r["H"], T, D, r["torch_ms"], r["fusec_ms"],
                            r["torch_over_fusec"],
                            " ".join("%.1e" % e[x] for x in ("o", "dq", "dk", "dv")
                                     if x in e)),
                            flush=True)
                        if a.parts:
                            print("  parts ms: " + "  ".join(
                                "%s %.2f" % kv for kv in r["parts_ms"].items()), flush=True)
    load1 = os.getloadavg()
    geo = math.exp(sum(math.log(r["torch_over_fusec"]) for r in results) / len(results))
    print("geomean torch/fusec: %.2f (load %.1f -> %.1f)" % (geo, load0[0], load1[0]))
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = a.out or os.path.join(HERE, "results", "attn_bench-%s-%s.json" %
                                (socket.gethostname(), now))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"bench": "attn_bench", "utc": now, "host": socket.gethostname(),
                   "cpus": os.cpu_count(), "machine": platform.machine(),
                   "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                   "load_before": load0, "load_after": load1, "note": a.note,
                   "geomean_torch_over_fusec": geo, "results": results}, f, indent=1)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
