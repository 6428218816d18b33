#!/usr/bin/env python3
"""gpu_bench.py: memory-bound fusions on a GPU, fusec beside eager PyTorch
and torch.compile, as bandwidth.

    PYTHONPATH=tools/python FUSEC_LIBRARY=build/libfusec.so \\
        python3 tools/bench/gpu_bench.py [--device cuda] [--budget SECONDS]
        [--dtypes bf16,f32] [--shapes 8192x8192,...] [--no-compile]
        [--quick] [--json FILE]

The fusions a transformer step spends its memory-bound time in, each one
trace with concrete extents [R, C] (R rows of C): rms_norm, layer_norm,
softmax, cross_entropy forward and backward (the mean loss and the logits'
gradient), gelu(x + bias), swiglu (silu(g) * u), rotary
(heads of 128, cos and sin per row, rotate_half), and add + rms_norm (the
residual stream: both h = x + r and rms_norm(h) returned). Each runs three
ways on the same inputs: fusec.Program on CUDA tensors, eager PyTorch
(its fused kernels where it has them: F.rms_norm, F.layer_norm, softmax,
F.cross_entropy with autograd), and torch.compile of the eager function.

cross_entropy's trace is the one fusec.torch.export makes of that same
eager function (the loss, and its gradient by autograd: what the
torch.compile backend hands fusec), exported from meta tensors of the
row's shape and dtype. cross_entropy_twice, not run unless --fusions
names it, is the hand-written trace timed until session 14: the loss by
the cross_entropy op beside a softmax written out for the gradient, so
that the row's max and sum are computed twice (fusec has no
common-subexpression pass: two kernels each read the logits).

Time: CUDA events around 20 back-to-back calls, the best of 3 batches; a
torch.cuda._sleep is queued first so that the host has queued every call
before the GPU reaches them (otherwise a call's host time would be timed
too: a 4096x4096 bf16 kernel takes about 20 us). Bandwidth counts the
bytes a fusion must move at least (each input read once, each output
written once); fraction = that bandwidth over a device-to-device copy's
(read + write) measured at the same size, so the L2 cache (50 MB on an
H100) flatters neither side. The largest copy (1 GiB) is reported as the
device's bandwidth. Each configuration's fusec output is compared with
eager's first (agrees: max error within 2 bf16 ulps, or 1e-4 for f32, of
the output's largest magnitude).

Order and budget: every fusion at 8192x8192, bf16 then f32, first; then
the other shapes likewise; the run stops starting
configurations when --budget seconds are spent (torch.compile's compiles
are most of it) and lists what it skipped. The JSON file is rewritten
after every configuration. Summary: the geometric mean of fusec's fraction
of copy bandwidth, and of its speed over torch.compile with the worst
case (goals of issue 24: >= 0.9, >= 1.2, none below 0.9).

--device cpu (with --quick: 256x512, f32, no torch.compile) runs the same
plumbing without a GPU: tools/gpu/run.sh's dry run.

Exit status: 0, or 1 when a configuration failed or disagreed with eager.
"""
import argparse
import faulthandler
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

SHAPES = ("8192x8192", "4096x4096", "16384x8192", "32768x8192")
HEAD = 128  # rotary's head_dim
DT = {"bf16": "bfloat16", "f32": "float32"}


# ---- the fusions: trace text, eager function, inputs, bytes moved ----------

def traces(r, c, d):
    h = c // HEAD
    half = HEAD // 2
    return {
        "rms_norm": """trace rms_norm(x: {d}[{r}, {c}], w: {d}[{c}]) {{
  y = rms_norm(x, w, dims=[1], eps=1e-5)
  return y
}}""",
        "layer_norm": """trace layer_norm(x: {d}[{r}, {c}], w: {d}[{c}], b: {d}[{c}]) {{
  y = layer_norm(x, w, b, dims=[1], eps=1e-5)
  return y
}}""",
        "softmax": """trace softmax(x: {d}[{r}, {c}]) {{
  y = softmax(x, dim=1)
  return y
}}""",
        "cross_entropy_twice": """trace cross_entropy(logits: {d}[{r}, {c}], target: i64[{r}]) {{
  loss = cross_entropy(logits, target)
  lf = cast(logits, dtype=f32)
  m = amax(lf, dims=[1], keepdim=true)
  e = exp(sub(lf, m))
  p = div(e, sum(e, dims=[1], keepdim=true))
  hot = cast(eq(unsqueeze(target, dim=1), iota(length={c}, dtype=i64)), dtype=f32)
  g = cast(mul(sub(p, hot), {inv_r}), dtype={d})
  return loss, g
}}""",
        "gelu_bias": """trace gelu_bias(x: {d}[{r}, {c}], b: {d}[{c}]) {{
  y = gelu(add(x, b), approximate=tanh)
  return y
}}""",
        "swiglu": """trace swiglu(g: {d}[{r}, {c}], u: {d}[{r}, {c}]) {{
  y = mul(silu(g), u)
  return y
}}""",
        "rotary": """trace rotary(x: {d}[{r}, {c}], cos: {d}[{r}, {hd}], sin: {d}[{r}, {hd}]) {{
  x3 = reshape(x, shape=[{r}, {h}, {hd}])
  x1 = slice(x3, start=[0, 0, 0], end=[{r}, {h}, {half}])
  x2 = slice(x3, start=[0, 0, {half}], end=[{r}, {h}, {hd}])
  rh = cat(neg(x2), x1, dim=2)
  y3 = add(mul(x3, unsqueeze(cos, dim=1)), mul(rh, unsqueeze(sin, dim=1)))
  y = reshape(y3, shape=[{r}, {c}])
  return y
}}""",
        "add_rms_norm": """trace add_rms_norm(x: {d}[{r}, {c}], res: {d}[{r}, {c}], w: {d}[{c}]) {{
  h = add(x, res)
  y = rms_norm(h, w, dims=[1], eps=1e-5)
  return h, y
}}""",
    }, dict(r=r, c=c, d=d, h=h, hd=HEAD, half=half, inv_r=repr(1.0 / r))


def exported_cross_entropy(r, c, dt):
    """fusec.torch.export's trace of eager_fns' cross_entropy step (the
    mean loss and the logits' gradient) at R x C of dt."""
    import torch
    import torch.nn.functional as F
    import fusec.torch

    def step(logits, target):
        loss = F.cross_entropy(logits, target)
        return (loss,) + tuple(torch.autograd.grad(loss, (logits,)))
    logits = torch.empty(r, c, dtype=dt, device="meta").requires_grad_()
    target = torch.empty(r, dtype=torch.int64, device="meta")
    return fusec.torch.export(step, logits, target, name="cross_entropy")


def eager_fns():
    import torch
    import torch.nn.functional as F

    def rotary(x, cos, sin):
        r, c = x.shape
        x3 = x.view(r, c // HEAD, HEAD)
        x1, x2 = x3[..., :HEAD // 2], x3[..., HEAD // 2:]
        rh = torch.cat((-x2, x1), dim=-1)
        return (x3 * cos[:, None] + rh * sin[:, None]).view(r, c)

    def ce_step(fwd):
        # the forward through `fwd` (F.cross_entropy, or torch.compile of
        # it: AOTAutograd then compiles the backward too), the logits'
        # gradient by autograd
        def step(logits, target):
            with torch.enable_grad():
                lg = logits.detach().requires_grad_(True)
                loss = fwd(lg, target)
                g, = torch.autograd.grad(loss, lg)
            return loss.detach(), g
        return step
    cross_entropy = ce_step(F.cross_entropy)
    cross_entropy.compiled = lambda: ce_step(torch.compile(F.cross_entropy, dynamic=False))

    def add_rms_norm(x, res, w):
        h = x + res
        return h, F.rms_norm(h, (h.shape[-1],), w, 1e-5)

    return {
        "rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-5),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "cross_entropy": cross_entropy,
        "cross_entropy_twice": cross_entropy,
        "gelu_bias": lambda x, b: F.gelu(x + b, approximate="tanh"),
        "swiglu": lambda g, u: F.silu(g) * u,
        "rotary": rotary,
        "add_rms_norm": add_rms_norm,
    }


def inputs(name, r, c, dt, dev):
    import torch
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dt)
    if name == "rms_norm":
        return rnd(r, c), rnd(c)
    if name == "layer_norm":
        return rnd(r, c), rnd(c), rnd(c)
    if name == "softmax":
        return (rnd(r, c),)
    if name in ("cross_entropy", "cross_entropy_twice"):
        return rnd(r, c), torch.randint(0, c, (r,), generator=g, device=dev)
    if name in ("gelu_bias",):
        return rnd(r, c), rnd(c)
    if name == "swiglu":
        return rnd(r, c), rnd(r, c)
    if name == "rotary":
        ang = torch.rand((r, HEAD), generator=g, device=dev) * 6.3
        return rnd(r, c), ang.cos().to(dt), ang.sin().to(dt)
    if name == "add_rms_norm":
        return rnd(r, c), rnd(r, c), rnd(c)
    raise ValueError(name)


def bytes_moved(ins, outs):
    """Each input read once, each output written once."""
    return sum(t.numel() * t.element_size() for t in list(ins) + list(outs))


# ---- timing -------------------------------------------------------------------

def seconds(fn, dev, iters=20, batches=3):
    """The best of `batches` batches of `iters` calls, per call."""
    import torch
    fn()
    best = math.inf
    for _ in range(batches):
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda._sleep(20_000_000)  # ~10 ms: the calls queue behind it
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                fn()
            e.record()
            e.synchronize()
            best = min(best, s.elapsed_time(e) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            best = min(best, (time.perf_counter() - t0) / iters)
    return best


def copy_tbps(n_bytes, dt, dev):
    """Device-to-device copy of n_bytes: (read + write) / time, in TB/s."""
    import torch
    n = max(1, n_bytes // torch.tensor([], dtype=dt).element_size())
    x = torch.ones(n, dtype=dt, device=dev)
    y = torch.empty_like(x)
    s = seconds(lambda: y.copy_(x), dev)
    return 2 * x.numel() * x.element_size() / s / 1e12


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def agrees(got, want, dt):
    import torch
    ulp = 2.0 ** -7 if dt == torch.bfloat16 else 1e-4
    for g, w in zip(as_tuple(got), as_tuple(want)):
        g, w = g.double(), w.double()
        scale = max(w.abs().max().item(), 1e-30)
        if (g - w).abs().max().item() > 2 * ulp * scale:
            return False
    return True


# ---- the run -------------------------------------------------------------------

def geomean(v):
    v = [x for x in v if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--budget", type=float, default=600,
                    help="seconds: start no configuration after this")
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--fusions", default="")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave torch.compile out")
    ap.add_argument("--quick", action="store_true",
                    help="256x512, f32, no torch.compile: the plumbing")
    ap.add_argument("--json", help="write the results here (after each row)")
    a = ap.parse_args()
    faulthandler.enable()  # a crash names its Python line in the log
    t_start = time.time()
    import torch
    import fusec
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: skipped: torch sees no CUDA device")
        return 77
    if a.quick:
        a.shapes, a.dtypes, a.no_compile = "256x512", "f32", True
    dev = torch.device(a.device)
    if a.device == "cpu":
        torch.set_num_threads(1)  # the plumbing, steadily, beside other work
    name = torch.cuda.get_device_name(dev) if a.device == "cuda" else "cpu"
    eager = eager_fns()
    names = (a.fusions.split(",") if a.fusions else
             [f for f in eager if f != "cross_entropy_twice"])
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    rows, skipped, bad = [], [], 0
    copy_big = {}
    doc = {"device": name, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "what": "memory-bound fusions: fusec, eager PyTorch, torch.compile; "
                   "TB/s of the bytes each must move, and that over a "
                   "device-to-device copy of the same size",
           "copy_TBps_1GiB": copy_big, "rows": rows, "skipped": skipped}

    def write():
        done = [r for r in rows if "fusec" in r]
        doc["summary"] = {
            "fusec_fraction_of_copy_geomean":
                geomean([r["fusec"]["fraction_of_copy"] for r in done]),
            "fusec_over_compile_geomean":
                geomean([r.get("fusec_over_compile") for r in done]),
            "fusec_over_compile_min":
                min([r["fusec_over_compile"] for r in done
                     if r.get("fusec_over_compile")], default=None),
            "fusec_over_eager_geomean":
                geomean([r.get("fusec_over_eager") for r in done]),
        }
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(a.json + ".tmp", a.json)

    order = [(dname, shp, fu) for shp in shapes
             for dname in a.dtypes.split(",") for fu in names]
    if not a.no_compile:
        # one compiled graph per fusion, dtype and shape (dynamic=False):
        # more than Dynamo keeps per function by default (8)
        cfg = torch._dynamo.config
        for k in ("cache_size_limit", "recompile_limit"):
            if hasattr(cfg, k):
                setattr(cfg, k, 256)
    print("%-13s %-11s %-4s %9s %9s %9s %6s %6s" % (
        "fusion", "shape", "dt", "fusec", "eager", "compile", "f/copy", "f/cmp"))
    for dname, (r, c), fu in order:
        if time.time() - t_start > a.budget:
            skipped.append("%s %dx%d %s" % (fu, r, c, dname))
            continue
        dt = getattr(torch, DT[dname])
        row = {"fusion": fu, "shape": [r, c], "dtype": dname}
        rows.append(row)
        try:
            ins = inputs(fu, r, c, dt, dev)
            text, fmt = traces(r, c, dname)
            src = (exported_cross_entropy(r, c, dt) if fu == "cross_entropy" else
                   text[fu].format(**fmt))
            prog = fusec.Program(src, device=a.device)
            if prog.device != a.device:
                raise RuntimeError("ran on %s" % prog.device)
            fn_e = eager[fu]
            want = fn_e(*ins)
            got = prog(*ins)
            row["agrees"] = agrees(got, want, dt)
            n = bytes_moved(ins, as_tuple(got))
            row["bytes"] = n
            row["copy_TBps"] = copy_tbps(n // 2, dt, dev)
            impls = [("fusec", lambda: prog(*ins)), ("eager", lambda: fn_e(*ins))]
            if not a.no_compile:
                fn_c = (fn_e.compiled() if hasattr(fn_e, "compiled") else
                        torch.compile(fn_e, dynamic=False))
                impls.append(("compile", lambda: fn_c(*ins)))
            for label, fn in impls:
                s = seconds(fn, dev)
                row[label] = {"seconds": s, "TBps": n / s / 1e12,
                              "fraction_of_copy": n / s / 1e12 / row["copy_TBps"]}
            fs = row["fusec"]["seconds"]
            row["fusec_over_eager"] = row["eager"]["seconds"] / fs
            if "compile" in row:
                row["fusec_over_compile"] = row["compile"]["seconds"] / fs
            bad += not row["agrees"]
        except Exception as e:  # reported per row, the run goes on
            row["error"] = "%s: %s" % (type(e).__name__, e)
            bad += 1
        if "error" in row:
            print("%-13s %-11s %-4s FAIL %s" % (fu, "%dx%d" % (r, c), dname, row["error"]))
        else:
            print("%-13s %-11s %-4s %9.3f %9.3f %9s %6.2f %6s%s" % (
                fu, "%dx%d" % (r, c), dname, row["fusec"]["TBps"],
                row["eager"]["TBps"],
                "%.3f" % row["compile"]["TBps"] if "compile" in row else "-",
                row["fusec"]["fraction_of_copy"],
                "%.2f" % row["fusec_over_compile"] if "compile" in row else "-",
                "" if row["agrees"] else "  DISAGREES with eager"), flush=True)
        write()
    for dname in a.dtypes.split(","):
        if time.time() - t_start < a.budget + 30:
            dt = getattr(torch, DT[dname])
            copy_big[dname] = copy_tbps(1 << 29 if a.device == "cuda" else 1 << 22,
                                        dt, dev)
    write()
    s = doc["summary"]
    print("copy (TB/s): %s; fusec/copy geomean %s, fusec/compile geomean %s "
          "(min %s); %d skipped for time" % (
              ", ".join("%s %.3f" % kv for kv in copy_big.items()),
              *("%.2f" % v if v else "-" for v in (
                  s["fusec_fraction_of_copy_geomean"],
                  s["fusec_over_compile_geomean"], s["fusec_over_compile_min"])),
              len(skipped)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
