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

Cases. The memory-bound fusions: rms_norm bf16 4096x4096, layer_norm f32
2048x1600, softmax f32 4096x2048, gelu(tanh)+bias bf16 4096x4096, swiglu
bf16 4096x4096 (issue 15's five); a residual add then rms_norm, and then
layer_norm, with both results as outputs (bf16 2048x4096: h = x + r,
y = norm(h)); rotary embedding (bf16 q of 4x1024x32x128, Llama's
rotate_half form); cross-entropy forward and backward (bf16 logits
2048x32000: the loss and the logits' gradient); the bf16 embedding backward
(8192 tokens into a 32000x1024 table); softmax backward (f32 4096x2048);
an AdamW update over 24 f32 tensors of 16.5 M elements in all (new
parameters, first and second moments); RMSNorm's weight gradient, a sum
over the outer dim (f32 512x1024: sum(g * x * r, 0), r a row's rstd). Then a Llama decoder block
(RMSNorm, attention with RoPE, SwiGLU MLP; f32) forward, and forward plus
backward (the gradients of a loss by torch.autograd.grad). Cases whose
trace is long are exported to trace text with fusec.torch.export; the rest
are written by hand. Times are microseconds; GB/s is the bytes of the
inputs and outputs over the time (the traffic a fused kernel needs at
least; for the Llama block it is only indicative). An input the trace
never reads (the embedding backward's table, which autograd asks for) is
not counted.

Copy bandwidth. Before each case, the machine's copy bandwidth is measured
the same way (a 256 MiB f32 tensor copied into another by PyTorch at the
same thread count, bytes read and written over the median time), and every
memory-bound case is also reported as a fraction of it (<way>_of_copy;
the case's own copy figure is copy_GBps, the summary's the median of
them): how close each way comes to what the memory system can move at
all. Each case against the copy measured just before it, because on a
shared machine the bandwidth wanders by more than the cases differ: one
copy at the start read 18.7 GB/s where the same machine had read 28.9 a
quarter of an hour before.

    tools/bench/cpu_bench.py                   everything, 20 rounds
    tools/bench/cpu_bench.py --cases rms_norm,softmax --rounds 10
    tools/bench/cpu_bench.py --threads 1       one thread for all three
    tools/bench/cpu_bench.py --cold            caches evicted before every call

Cold caches. A case of 64 MB fits this machine's 260 MB L3 and keeps part
of its working set there from one call to the next, by an amount that
depends on what the other ways touched in between; the copy it is
compared with (512 MiB) never does. --cold writes twice the last-level
cache before every timed call of eager, compile and fusec (Evictor), so
that each reads from memory as the copy does (`run` times its own
iterations in a process of its own and stays warm).

Fresh outputs. Every way but `run` returns a fresh output tensor per call.
Eager and compile take it from torch.empty over glibc malloc: whether a 13
to 32 MiB block comes back from glibc's heap or from a fresh mmap, whose
first touch page-faults (tens of ms on a busy VM, often more than the
kernel), depends on what the process freed before: the same allocation
costs 1 ms in one round and 13 ms in the next. fusec's Python binding
takes outputs of 64 KiB or more from the library's host cache
(runtime/host_cache.c): the previous round's output, released when the
benchmark dropped it, comes back still mapped, so fusec's figure is the
kernel plus the binding's overhead, as a framework calling it every step
sees it. `run` writes into buffers it keeps, so it shows the kernels.

Page faults. Each way's median minor page faults per call (<way>_faults)
and, per case, how the kernel's counters of huge-page faults and direct
compaction moved over the timed rounds (vmstat_delta): fusec advises the
outputs it is handed to use transparent huge pages (runtime/cpu.c), 512
times fewer faults, but where the system's THP defrag setting is
"madvise" and free memory is fragmented, such a fault may wait for the
kernel to compact memory (compact_stall counts those waits), which can
cost more than the faults it saves. <way>_min_us is the fastest round.

CPU time. At --threads 1 every way but `run` computes in the calling
thread, so each case also gets <way>_cpu_us, the median of that thread's CPU
time per call (time.thread_time): on a shared machine the wall time counts
the turns other processes take on the core, the CPU time does not (cache
and memory contention stay in both). Compare ways by it when the load
average is above the CPU count.

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
import re
import resource
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

MEMORY_BOUND = ("rms_norm", "layer_norm", "softmax", "gelu_bias", "swiglu",
                "add_rms_norm", "add_layer_norm", "rotary", "cross_entropy",
                "embedding_bwd", "softmax_bwd", "adamw", "rms_norm_wgrad")


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


def case_add_rms_norm(g):
    x = torch.randn(2048, 4096, generator=g).bfloat16()
    r = torch.randn(2048, 4096, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=g)).bfloat16()

    def fn(x, r, w):
        h = x + r
        return h, _rms(h.float(), w.float()).bfloat16()
    text = """trace add_rms_norm(x: bf16[2048, 4096], r: bf16[2048, 4096], w: bf16[4096]) {
  h = add(x, r)
  y = rms_norm(h, w, dims=[1], eps=1e-5)
  return h, y
}
"""
    return fn, (x, r, w), text


def case_add_layer_norm(g):
    x = torch.randn(2048, 4096, generator=g).bfloat16()
    r = torch.randn(2048, 4096, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(4096, generator=g)).bfloat16()
    b = (0.1 * torch.randn(4096, generator=g)).bfloat16()

    def fn(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (4096,), w, b, 1e-5)
    text = """trace add_layer_norm(x: bf16[2048, 4096], r: bf16[2048, 4096], w: bf16[4096], b: bf16[4096]) {
  h = add(x, r)
  y = layer_norm(h, w, b, dims=[1], eps=1e-5)
  return h, y
}
"""
    return fn, (x, r, w, b), text


def case_rotary(g):
    B, T, H, D = 4, 1024, 32, 128
    q = torch.randn(B, T, H, D, generator=g).bfloat16()
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    f = torch.outer(torch.arange(T).float(), inv)
    emb = torch.cat((f, f), dim=-1).view(T, 1, D)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()

    def fn(q, cos, sin):
        return q * cos + _rotate(q) * sin
    text = fusec.torch.export(fn, q, cos, sin, name="rotary")
    return fn, (q, cos, sin), text


def case_cross_entropy(g):
    N, V = 2048, 32000
    logits = torch.randn(N, V, generator=g).bfloat16().requires_grad_()
    target = torch.randint(0, V, (N,), generator=g)

    def fn(logits, target):
        loss = F.cross_entropy(logits.float(), target)
        return (loss,) + tuple(torch.autograd.grad(loss, (logits,)))
    text = fusec.torch.export(fn, logits, target, name="cross_entropy")
    return fn, (logits, target), text


def case_embedding_bwd(g):
    N, V, C = 8192, 32000, 1024
    table = torch.randn(V, C, generator=g).bfloat16().requires_grad_()
    idx = torch.randint(0, V, (N,), generator=g)
    dy = torch.randn(N, C, generator=g).bfloat16()

    def fn(table, idx, dy):
        y = F.embedding(idx, table)
        return torch.autograd.grad(y, (table,), dy)[0]
    text = fusec.torch.export(fn, table, idx, dy, name="embedding_bwd")
    return fn, (table, idx, dy), text


def case_softmax_bwd(g):
    y = torch.softmax(torch.randn(4096, 2048, generator=g), dim=1)
    dy = torch.randn(4096, 2048, generator=g)

    def fn(y, dy):
        return torch._softmax_backward_data(dy, y, 1, torch.float32)
    text = """trace softmax_bwd(y: f32[4096, 2048], dy: f32[4096, 2048]) {
  s = sum(mul(dy, y), dims=[1], keepdim=true)
  dx = mul(y, sub(dy, s))
  return dx
}
"""
    return fn, (y, dy), text


# AdamW's update at step 10 with torch.optim.AdamW's defaults but lr 1e-3:
# what a fused optimizer step computes for every parameter tensor of a
# model (here 24 of them, shapes of a small transformer's).
ADAMW = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01, step=10)
ADAMW_SHAPES = [(1024, 1024)] * 8 + [(2816, 1024)] * 4 + [(1024,)] * 8 + \
               [(32000, 128)] * 4


def case_adamw(g):
    c = ADAMW
    bc1, bc2 = 1 - c["b1"] ** c["step"], 1 - c["b2"] ** c["step"]
    args = []
    for shape in ADAMW_SHAPES:
        args += [torch.randn(*shape, generator=g),
                 0.01 * torch.randn(*shape, generator=g),
                 0.01 * torch.randn(*shape, generator=g),
                 1e-4 * torch.rand(*shape, generator=g)]

    def fn(*a):
        out = []
        for i in range(0, len(a), 4):
            p, gr, m, v = a[i:i + 4]
            m = c["b1"] * m + (1 - c["b1"]) * gr
            v = c["b2"] * v + (1 - c["b2"]) * gr * gr
            p = p * (1 - c["lr"] * c["wd"]) - \
                (c["lr"] / bc1) * m / (torch.sqrt(v / bc2) + c["eps"])
            out += [p, m, v]
        return tuple(out)
    text = fusec.torch.export(fn, *args, name="adamw")
    return fn, tuple(args), text


# A Llama decoder block in plain PyTorch (what transformers' LlamaDecoderLayer
# computes, without its caching and masking plumbing).
LLAMA = dict(batch=1, seq=512, hidden=1024, heads=8, inter=2816)


def case_rms_norm_wgrad(g):
    dy = torch.randn(512, 1024, generator=g)
    x = torch.randn(512, 1024, generator=g)
    r = torch.rand(512, 1, generator=g) + 0.5

    def fn(dy, x, r):
        return (dy * (x * r)).sum(0)
    text = """trace rms_norm_wgrad(g: f32[512, 1024], x: f32[512, 1024], r: f32[512, 1]) {
  y = sum(mul(g, mul(x, r)), dims=[0])
  return y
}
"""
    return fn, (dy, x, r), text


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
    "add_rms_norm": case_add_rms_norm,
    "add_layer_norm": case_add_layer_norm,
    "rotary": case_rotary,
    "cross_entropy": case_cross_entropy,
    "embedding_bwd": case_embedding_bwd,
    "softmax_bwd": case_softmax_bwd,
    "adamw": case_adamw,
    "rms_norm_wgrad": case_rms_norm_wgrad,
    "llama_fwd": case_llama_fwd,
    "llama_bwd": case_llama_bwd,
}


# ---- timing ----------------------------------------------------------------------

def _read_inputs(text):
    """Per parameter of the trace, in order: whether its body reads it."""
    head, body = text.split("{", 1)
    names = re.findall(r"(\w+)\s*:", head.split("(", 1)[1])
    return [re.search(r"\b%s\b" % re.escape(n), body) is not None for n in names]


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


def _timed_cpu(f, args):
    """Wall seconds, the calling thread's CPU seconds and the process's
    minor page faults of one call."""
    m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, t0 = time.thread_time(), time.perf_counter()
    out = f(*args)
    dt, ct = time.perf_counter() - t0, time.thread_time() - c0
    return dt, ct, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - m0, out


def _vmstat(keys=("compact_stall", "thp_fault_alloc", "thp_fault_fallback")):
    """The kernel's counters of huge-page faults and of direct compaction
    (a fault that waits for the kernel to make a huge page), or {}."""
    try:
        with open("/proc/vmstat") as f:
            return {k: int(v) for k, v in (line.split() for line in f) if k in keys}
    except (OSError, ValueError):
        return {}


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


def llc_bytes():
    """The last-level cache's size (sysfs), or 256 MiB."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = 0
    try:
        for d in os.listdir(base):
            try:
                with open(os.path.join(base, d, "size")) as f:
                    t = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
            best = max(best, int(t.rstrip("KMG")) * mult)
    except OSError:
        pass
    return best or 256 << 20


class Evictor:
    """--cold: writes a buffer of twice the last-level cache before each
    timed call, so that every way reads its inputs from memory as the copy
    does (the copy's 512 MiB never fit): a case of 64 MB otherwise keeps
    part of its working set in a 260 MB L3 from one call to the next, and
    how much depends on what the other ways touched in between."""

    def __init__(self):
        self.buf = torch.empty(2 * llc_bytes() // 4)
        self.k = 0

    def __call__(self):
        self.k += 1
        self.buf.fill_(float(self.k))


def bench_case(name, rounds, warmup, fusec_bin, env, ways, threads=0, evict=None):
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
    read = _read_inputs(text)
    assert len(read) == len(fargs), name
    res["bytes"] = _nbytes([a for a, r in zip(fargs, read) if r]) + _nbytes(out)
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
    cpu = {k: [] for k in runners}
    faults = {k: [] for k in runners}
    vm0 = _vmstat()
    for _ in range(rounds):
        for k, f in runners.items():
            if evict:
                evict()
            dt, ct, fl, _ = _timed_cpu(f, fargs if k == "fusec" else args)
            times[k].append(dt)
            cpu[k].append(ct)
            faults[k].append(fl)
    vm1 = _vmstat()
    for k, ts in times.items():
        med = statistics.median(ts)
        res[k + "_us"] = med * 1e6
        res[k + "_GBps"] = res["bytes"] / med / 1e9
        res[k + "_min_us"] = min(ts) * 1e6
        res[k + "_faults"] = statistics.median(faults[k])
        if threads == 1:
            res[k + "_cpu_us"] = statistics.median(cpu[k]) * 1e6
    # during the timed rounds, all ways together
    res["vmstat_delta"] = {k: vm1[k] - vm0[k] for k in vm1 if k in vm0}
    if "run" in ways:
        spi, why = fusec_run_iters(fusec_bin, text, rounds, env)
        if spi is not None:
            res["run_us"] = spi * 1e6
            res["run_GBps"] = res["bytes"] / spi / 1e9
        else:
            res["run_error"] = why
    return res


def copy_bandwidth(rounds, warmup):
    """GB/s of PyTorch copying a 256 MiB f32 tensor into another, counting
    the bytes read and the bytes written (the median over the rounds)."""
    n = 256 << 20
    src = torch.ones(n // 4)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    ts = []
    for _ in range(rounds):
        dt, _ = _timed(dst.copy_, (src,))
        ts.append(dt)
    return 2 * n / statistics.median(ts) / 1e9


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
    ap.add_argument("--cold", action="store_true",
                    help="evict the last-level cache before every timed call "
                         "(the run way, a process of its own, stays warm)")
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
    results, copies = [], []
    evict = Evictor() if a.cold else None
    for c in names:
        copy_gbps = copy_bandwidth(max(a.rounds, 5), a.warmup)
        copies.append(copy_gbps)
        print("copy bandwidth: %.1f GB/s" % copy_gbps, file=sys.stderr)
        r = bench_case(c, a.rounds, a.warmup, a.fusec, env, ways, threads, evict)
        r["copy_GBps"] = copy_gbps
        if c in MEMORY_BOUND:
            for k in ("eager", "compile", "fusec", "run"):
                if k + "_GBps" in r:
                    r[k + "_of_copy"] = r[k + "_GBps"] / copy_gbps
        results.append(r)
        print(json.dumps(r), file=sys.stderr)
    load1 = os.getloadavg()

    copy_gbps = statistics.median(copies)
    summary = {"copy_GBps": copy_gbps, "copy_GBps_min": min(copies),
               "copy_GBps_max": max(copies)}
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
    for k in ("fusec", "run"):
        fr = [r[k + "_of_copy"] for r in results if k + "_of_copy" in r]
        if fr:
            summary["memory_bound_geomean_%s_of_copy" % k] = geomean(fr)
            summary["memory_bound_worst_%s_of_copy" % k] = min(fr)
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
        "cold": a.cold,
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
    print("copy bandwidth %.1f GB/s (median of the cases' own, %.1f to %.1f)" % (
        copy_gbps, min(copies), max(copies)))
    print("%-14s %s %s" % ("case", "".join("%14s" % (c + " us") for c in cols),
                           "  compile/fusec  GB/s(fusec)  copy GB/s  of copy"))
    for r in results:
        cells = "".join("%14.0f" % r[c + "_us"] if c + "_us" in r else "%14s" % "-"
                        for c in cols)
        ratio = r["compile_us"] / r["fusec_us"] if "compile_us" in r and "fusec_us" in r else None
        print("%-14s %s  %13s  %11s  %9.1f  %7s" % (
            r["case"], cells, "%.2f" % ratio if ratio else "-",
            "%.1f" % r["fusec_GBps"] if "fusec_GBps" in r else "-", r["copy_GBps"],
            "%.0f%%" % (100 * r["fusec_of_copy"]) if "fusec_of_copy" in r else "-"))
    for k, v in summary.items():
        print("%s: %.3f" % (k, v))
    print("load average before %s, after %s; written to %s" % (
        "/".join("%.1f" % x for x in load0), "/".join("%.1f" % x for x in load1), out))


if __name__ == "__main__":
    main()
