#!/usr/bin/env python3
"""cpu_bench.py: fusec's CPU target against PyTorch eager and torch.compile.

Every case runs the same function three ways in one process, on the same
inputs, interleaved round by round (so that a burst of load from another
process hits all three alike), and reports the median over the rounds:

  eager     the PyTorch function as written
  compile   torch.compile of it (inductor's C++ code for the CPU)
  fusec     fusec.Program(text, device="cpu") on the trace of it
  run       `fusec run FILE --device cpu --iters N` on the same trace (its
            seconds_per_iter; random inputs of the same shapes), a second
            view of fusec's time without the Python binding

Cases: the five memory-bound fusions of issue 15 (rms_norm bf16 4096x4096,
layer_norm f32 2048x1600, softmax f32 4096x2048, gelu(tanh)+bias bf16
4096x4096, swiglu bf16 4096x4096) and a Llama decoder block (RMSNorm,
attention with RoPE, SwiGLU MLP; f32) forward, and forward plus backward
(the gradients of a loss by torch.autograd.grad), both exported to trace
text with fusec.torch.export. Times are microseconds; GB/s is the bytes of
the inputs and outputs over the time (the traffic a fused kernel needs at
least; for the Llama block it is only indicative).

    tools/bench/cpu_bench.py                   everything, 20 rounds
    tools/bench/cpu_bench.py --cases rms_norm,softmax --rounds 10
    tools/bench/cpu_bench.py --threads 1       one thread for all three

Fresh outputs. Every way but `run` returns a fresh output tensor per call
(torch.empty over glibc malloc). Whether a 13 to 32 MiB block comes back
from glibc's heap or from a fresh mmap, whose first touch page-faults (tens
of ms on a busy VM, often more than the kernel), depends on what the process
freed before: the same allocation costs 1 ms in one round and 13 ms in the
next. That cost is in eager, compile and fusec alike but does not cancel in
their ratios; `run` writes into buffers it keeps, so it shows the kernels.

Writes tools/bench/results/cpu_bench-<host>-<utc time>.json (or --out) and
prints a table. The JSON holds the machine (CPUs, load average before and
after, torch version, the BLAS fusec opened), every case's medians, and the
summary the issue asks for: the geometric mean of compile/fusec over the
memory-bound fusions, the worst of them, and the Llama block forward's
fusec/eager. Run it from the repository root with a built tree (build/),
PYTHONPATH=tools/python, and the venv that has torch.
"""

import argparse
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusec  # noqa: E402

MEMORY_BOUND = ("rms_norm", "layer_norm", "softmax", "gelu_bias", "swiglu")


# ---- the cases -----------------------------------------------------------------

def case_rms_norm(g):
    x = torch.randn(4096, 4096, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=g)).bfloat16()

    def fn(x, w):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
        return (xf * r * w.float()).bfloat16()
    text = """trace rms_norm(x: bf16[4096, 4096], w: bf16[4096]) {
  y = rms_norm(x, w, dims=[1], eps=1e-5)
  return y
}
"""
    return fn, (x, w), text


def case_layer_norm(g):
    x = torch.randn(2048, 1600, generator=g)
    w = 1 + 0.1 * torch.randn(1600, generator=g)
    b = 0.1 * torch.randn(1600, generator=g)

    def fn(x, w, b):
        return F.layer_norm(x, (1600,), w, b, 1e-5)
    text = """trace layer_norm(x: f32[2048, 1600], w: f32[1600], b: f32[1600]) {
  y = layer_norm(x, w, b, dims=[1], eps=1e-5)
  return y
}
"""
    return fn, (x, w, b), text


def case_softmax(g):
    x = torch.randn(4096, 2048, generator=g)

    def fn(x):
        return torch.softmax(x, dim=1)
    text = """trace softmax(x: f32[4096, 2048]) {
  y = softmax(x, dim=1)
  return y
}
"""
    return fn, (x,), text


def case_gelu_bias(g):
    x = torch.randn(4096, 4096, generator=g).bfloat16()
    b = torch.randn(4096, generator=g).bfloat16()

    def fn(x, b):
        return F.gelu(x + b, approximate="tanh")
    text = """trace gelu_bias(x: bf16[4096, 4096], b: bf16[4096]) {
  y = gelu(add(x, b), approximate=tanh)
  return y
}
"""
    return fn, (x, b), text


def case_swiglu(g):
    a = torch.randn(4096, 4096, generator=g).bfloat16()
    u = torch.randn(4096, 4096, generator=g).bfloat16()

    def fn(a, u):
        return F.silu(a) * u
    text = """trace swiglu(g: bf16[4096, 4096], u: bf16[4096, 4096]) {
  y = mul(silu(g), u)
  return y
}
"""
    return fn, (a, u), text


# A Llama decoder block in plain PyTorch (what transformers' LlamaDecoderLayer
# computes, without its caching and masking plumbing).
LLAMA = dict(batch=1, seq=512, hidden=1024, heads=8, inter=2816)


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def _rotate(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama_block(x, n1, wq, wk, wv, wo, n2, wg, wu, wd, cos, sin):
    B, T, C = x.shape
    H = LLAMA["heads"]
    D = C // H
    h = _rms(x, n1)
    q = (h @ wq.t()).view(B, T, H, D).transpose(1, 2)
    k = (h @ wk.t()).view(B, T, H, D).transpose(1, 2)
    v = (h @ wv.t()).view(B, T, H, D).transpose(1, 2)
    q = q * cos + _rotate(q) * sin
    k = k * cos + _rotate(k) * sin
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + a.transpose(1, 2).reshape(B, T, C) @ wo.t()
    h = _rms(x, n2)
    return x + (F.silu(h @ wg.t()) * (h @ wu.t())) @ wd.t()


def llama_block_bwd(x, n1, wq, wk, wv, wo, n2, wg, wu, wd, cos, sin):
    ws = (x, n1, wq, wk, wv, wo, n2, wg, wu, wd)
    y = llama_block(x, n1, wq, wk, wv, wo, n2, wg, wu, wd, cos, sin)
    loss = (y * y).mean()
    return (loss,) + tuple(torch.autograd.grad(loss, ws))


def _llama_inputs(g):
    c = LLAMA
    C, I, T = c["hidden"], c["inter"], c["seq"]
    D = C // c["heads"]

    def w(o, i):
        return torch.randn(o, i, generator=g) / math.sqrt(i)
    x = torch.randn(c["batch"], T, C, generator=g)
    n1 = 1 + 0.1 * torch.randn(C, generator=g)
    n2 = 1 + 0.1 * torch.randn(C, generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    f = torch.outer(torch.arange(T).float(), inv)
    emb = torch.cat((f, f), dim=-1)
    return (x, n1, w(C, C), w(C, C), w(C, C), w(C, C), n2, w(I, C), w(I, C),
            w(C, I), emb.cos().contiguous(), emb.sin().contiguous())


def case_llama_fwd(g):
    args = _llama_inputs(g)
    text = fusec.torch.export(llama_block, *args, name="llama_block_fwd")
    return llama_block, args, text


def case_llama_bwd(g):
    args = _llama_inputs(g)
    grad_args = tuple(a.requires_grad_(i < 10) for i, a in enumerate(args))

    def fn(*a):
        return llama_block_bwd(*a)
    text = fusec.torch.export(fn, *grad_args, name="llama_block_bwd")
    return fn, grad_args, text


CASES = {
    "rms_norm": case_rms_norm,
    "layer_norm": case_layer_norm,
    "softmax": case_softmax,
    "gelu_bias": case_gelu_bias,
    "swiglu": case_swiglu,
    "llama_fwd": case_llama_fwd,
    "llama_bwd": case_llama_bwd,
}


# ---- timing ----------------------------------------------------------------------

def _nbytes(ts):
    n = 0
    for t in ts if isinstance(ts, (tuple, list)) else (ts,):
        if isinstance(t, torch.Tensor):
            n += t.numel() * t.element_size()
    return n


def _timed(f, args):
    t0 = time.perf_counter()
    out = f(*args)
    return time.perf_counter() - t0, out


def fusec_run_iters(fusec_bin, text, iters, env):
    """seconds_per_iter of `fusec run --iters`, or None with the reason."""
    with tempfile.NamedTemporaryFile("w", suffix=".trace", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        p = subprocess.run([fusec_bin, "run", path, "--device", "cpu",
                            "--iters", str(iters), "--json"],
                           capture_output=True, text=True, env=env,
                           timeout=1800)
        if p.returncode != 0:
            return None, (p.stderr or p.stdout).strip()[-300:]
        return json.loads(p.stdout)["seconds_per_iter"], None
    finally:
        os.unlink(path)


def bench_case(name, rounds, warmup, fusec_bin, env, ways):
    g = torch.Generator().manual_seed(0)
    fn, args, text = CASES[name](g)
    res = {"case": name}
    runners = {}
    if "eager" in ways:
        runners["eager"] = fn
    if "compile" in ways:
        t0 = time.perf_counter()
        runners["compile"] = torch.compile(fn)
        runners["compile"](*args)  # compiles
        res["compile_seconds"] = time.perf_counter() - t0
    if "fusec" in ways:
        t0 = time.perf_counter()
        prog = fusec.Program(text, device="cpu")
        runners["fusec"] = prog
        out_f = prog(*[a.detach() for a in args])
        res["fusec_first_call_seconds"] = time.perf_counter() - t0
    fargs = tuple(a.detach() for a in args)
    out = fn(*args)
    res["bytes"] = _nbytes(fargs) + _nbytes(out)
    if "fusec" in ways:
        # the same answer as eager, as a sanity check of what is timed
        outs_f = out_f if isinstance(out_f, tuple) else (out_f,)
        outs_e = out if isinstance(out, tuple) else (out,)
        worst = 0.0
        for a, b in zip(outs_f, outs_e):
            a, b = a.float(), b.detach().float()
            scale = max(1.0, b.abs().max().item())
            worst = max(worst, (a - b).abs().max().item() / scale)
        res["fusec_vs_eager_max_err"] = worst
    for _ in range(warmup):
        for k, f in runners.items():
            f(*(fargs if k == "fusec" else args))
    times = {k: [] for k in runners}
    for _ in range(rounds):
        for k, f in runners.items():
            dt, _ = _timed(f, fargs if k == "fusec" else args)
            times[k].append(dt)
    for k, ts in times.items():
        med = statistics.median(ts)
        res[k + "_us"] = med * 1e6
        res[k + "_GBps"] = res["bytes"] / med / 1e9
    if "run" in ways:
        spi, why = fusec_run_iters(fusec_bin, text, rounds, env)
        if spi is not None:
            res["run_us"] = spi * 1e6
            res["run_GBps"] = res["bytes"] / spi / 1e9
        else:
            res["run_error"] = why
    return res


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated: %s" % ", ".join(CASES))
    ap.add_argument("--rounds", type=int, default=20,
                    help="timed rounds per case (median reported)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for PyTorch and fusec (0: the CPUs)")
    ap.add_argument("--ways", default="eager,compile,fusec,run",
                    help="which of eager, compile, fusec, run to measure")
    ap.add_argument("--fusec", default=os.path.join(ROOT, "build", "tools", "fusec"),
                    help="the fusec binary for the run figures")
    ap.add_argument("--out", default=None, help="JSON file to write")
    a = ap.parse_args()
    names = [c for c in a.cases.split(",") if c]
    for c in names:
        if c not in CASES:
            ap.error("unknown case %r (cases: %s)" % (c, ", ".join(CASES)))
    ways = set(w for w in a.ways.split(",") if w)
    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    env = dict(os.environ)
    env["FUSEC_THREADS"] = str(threads)
    os.environ["FUSEC_THREADS"] = str(threads)

    load0 = os.getloadavg()
    results = []
    for c in names:
        r = bench_case(c, a.rounds, a.warmup, a.fusec, env, ways)
        results.append(r)
        print(json.dumps(r), file=sys.stderr)
    load1 = os.getloadavg()

    summary = {}
    ratios = [r["compile_us"] / r["fusec_us"] for r in results
              if r["case"] in MEMORY_BOUND and "compile_us" in r and "fusec_us" in r]
    if ratios:
        summary["memory_bound_geomean_compile_over_fusec"] = geomean(ratios)
        summary["memory_bound_worst_compile_over_fusec"] = min(ratios)
    ratios = [r["compile_us"] / r["run_us"] for r in results
              if r["case"] in MEMORY_BOUND and "compile_us" in r and "run_us" in r]
    if ratios:
        summary["memory_bound_geomean_compile_over_run"] = geomean(ratios)
        summary["memory_bound_worst_compile_over_run"] = min(ratios)
    for r in results:
        if r["case"].startswith("llama") and "eager_us" in r:
            for k in ("fusec", "run"):
                if k + "_us" in r:
                    summary[r["case"] + "_%s_over_eager" % k] = r[k + "_us"] / r["eager_us"]

    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "threads": threads,
        "loadavg_before": load0,
        "loadavg_after": load1,
        "torch": torch.__version__,
        "rounds": a.rounds,
        "llama_config": LLAMA,
        "results": results,
        "summary": summary,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    doc["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    out = a.out
    if not out:
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        out = os.path.join(HERE, "results", "cpu_bench-%s-%s.json" % (
            doc["host"], time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")

    cols = ["eager", "compile", "fusec", "run"]
    print("%-11s %s %s" % ("case", "".join("%14s" % (c + " us") for c in cols),
                           "  compile/fusec  GB/s(fusec)"))
    for r in results:
        cells = "".join("%14.0f" % r[c + "_us"] if c + "_us" in r else "%14s" % "-"
                        for c in cols)
        ratio = r["compile_us"] / r["fusec_us"] if "compile_us" in r and "fusec_us" in r else None
        print("%-11s %s  %13s  %11s" % (r["case"], cells,
                                         "%.2f" % ratio if ratio else "-",
                                         "%.1f" % r["fusec_GBps"] if "fusec_GBps" in r else "-"))
    for k, v in summary.items():
        print("%s: %.3f" % (k, v))
    print("load average before %s, after %s; written to %s" % (
        "/".join("%.1f" % x for x in load0), "/".join("%.1f" % x for x in load1), out))


if __name__ == "__main__":
    main()
