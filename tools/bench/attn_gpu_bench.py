#!/usr/bin/env python3
"""attn_gpu_bench.py: fusec's fused attention kernels on a GPU against
PyTorch's scaled_dot_product_attention on the same card, in TFLOP/s.

    PYTHONPATH=tools/python FUSEC_LIBRARY=build/libfusec.so \\
        python3 tools/bench/attn_gpu_bench.py [--device cuda] [--T 1024,4096,16384]
        [--D 64,128] [--dtype bf16] [--no-causal] [--budget S] [--json FILE]

Issue 22's GPU figures: causal attention at sequence lengths 1k, 4k and
16k, head dims 64 and 128, forward and backward apart. The shapes are
those FlashAttention-2's benchmark uses: 16k tokens per batch (B = 16384 /
T) and a model width of 2048 (H = 2048 / D heads), so every case does the
same work per token of the model.

  fusec   two fusec.Program objects on CUDA tensors, on torch's current
          stream: the forward `o, lse = attention(q, k, v, causal=true)`
          and the backward `dq = attention_dq(...)`, `dk, dv =
          attention_dkv(...)` from q, k, v, o, lse and do (the kernels of
          codegen/attention_gpu.c: mma.sync m16n8k16, ldmatrix, cp.async)
  torch   F.scaled_dot_product_attention (whichever of its fused kernels
          PyTorch picks on the card: FlashAttention or cuDNN); the backward
          is torch.autograd.grad of the same forward output, retained

FLOPs counted as FlashAttention's benchmark counts them: forward 4 B H T^2
D (two products of T x T x D), halved when causal; backward 2.5 times the
forward (five products where the forward has two). Time: CUDA events
around back-to-back calls after a queued sleep, best of 3 batches (the
timer of gpu_bench.py), 3 to 20 calls a batch. Each case's outputs and gradients are compared
with PyTorch's (max |fusec - torch| over max |torch|), so a fast wrong
answer shows; bf16 answers agree to a few bf16 ulps (2^-8 relative each).

--device cpu runs the plumbing on small sizes without a GPU (fusec's CPU
kernels against PyTorch's CPU SDPA; its times mean nothing here).

Exit status: 0, or 1 when a case failed or disagreed (more than 2^-5 of
the largest magnitude: far past rounding, a wrong kernel).
"""
import argparse
import faulthandler
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

AGREE = 2.0 ** -5  # of the largest magnitude: bf16 rounding is 2^-8


def traces(B, H, T, D, dt, causal):
    x = "%s[%d, %d, %d, %d]" % (dt, B, H, T, D)
    c = ", causal=true" if causal else ""
    fwd = ("trace attn_fwd(q: {x}, k: {x}, v: {x}) {{\n"
           "  o, lse = attention(q, k, v{c})\n"
           "  return o, lse\n}}\n").format(x=x, c=c)
    bwd = ("trace attn_bwd(q: {x}, k: {x}, v: {x}, o: {x}, lse: f32[{b}, {h}, {t}],"
           " do: {x}) {{\n"
           "  dq = attention_dq(q, k, v, o, lse, do{c})\n"
           "  dk, dv = attention_dkv(q, k, v, o, lse, do{c})\n"
           "  return dq, dk, dv\n}}\n").format(x=x, b=B, h=H, t=T, c=c)
    return fwd, bwd


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def timed(fn, dev):
    """Seconds per call (gpu_bench's timer), with as many calls per batch
    as fit in about 0.2 s (3 to 20): a slow kernel costs no minutes."""
    import torch
    from gpu_bench import seconds
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    once = time.perf_counter() - t0
    return seconds(fn, dev, iters=max(3, min(20, int(0.2 / max(once, 1e-6)))))


def run_case(T, D, dt, causal, dev):
    import torch
    import torch.nn.functional as F
    import fusec
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
    B, H = max(1, 16384 // T), max(1, 2048 // D)
    if dev.type == "cpu":
        B, H = 1, 2
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(B, H, T, D, generator=g, device=dev).to(tdt)
                   for _ in range(4))
    row = {"T": T, "D": D, "B": B, "H": H, "dtype": dt, "causal": causal}
    fwd_t, bwd_t = traces(B, H, T, D, dt, causal)
    pf = fusec.Program(fwd_t, device=dev.type)
    pb = fusec.Program(bwd_t, device=dev.type)
    if pf.device != dev.type or pb.device != dev.type:
        raise RuntimeError("fusec ran on %s, not %s" % (pf.device, dev.type))

    o, lse = pf(q, k, v)
    dq, dk, dv = pb(q, k, v, o, lse, do)
    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
    ot = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
    gt = torch.autograd.grad(ot, (qq, kk, vv), do, retain_graph=True)
    row["rel_err"] = {"o": rel(o, ot), "dq": rel(dq, gt[0]),
                      "dk": rel(dk, gt[1]), "dv": rel(dv, gt[2])}
    row["agrees"] = max(row["rel_err"].values()) <= AGREE

    flops = 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)
    with torch.no_grad():
        tf = {"fusec": timed(lambda: pf(q, k, v), dev),
              "torch": timed(lambda: F.scaled_dot_product_attention(
                  q, k, v, is_causal=causal), dev)}
    tb = {"fusec": timed(lambda: pb(q, k, v, o, lse, do), dev),
          "torch": timed(lambda: torch.autograd.grad(
              ot, (qq, kk, vv), do, retain_graph=True), dev)}
    for who in ("fusec", "torch"):
        row[who] = {"fwd_ms": tf[who] * 1e3, "bwd_ms": tb[who] * 1e3,
                    "fwd_TFLOPs": flops / tf[who] / 1e12,
                    "bwd_TFLOPs": 2.5 * flops / tb[who] / 1e12}
    row["fwd_fusec_over_torch"] = tf["torch"] / tf["fusec"]
    row["bwd_fusec_over_torch"] = tb["torch"] / tb["fusec"]
    return row


def main():
    faulthandler.enable()  # a crash names its Python line in the log
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--T", default="1024,4096,16384")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--budget", type=float, default=300,
                    help="seconds: start no case after this")
    ap.add_argument("--json", help="write the results here (after each case)")
    a = ap.parse_args()
    t_start = time.time()
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print("attn_gpu_bench: skipped: torch sees no CUDA device")
        return 77
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if a.device == "cuda" else "cpu"
    doc = {"device": name, "torch": torch.__version__,
           "sdpa_backends": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                             "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                             "mem_efficient":
                                 torch.backends.cuda.mem_efficient_sdp_enabled()},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "what": "fused attention, fusec against F.scaled_dot_product_attention: "
                   "TFLOP/s forward and backward (FlashAttention's FLOP count)",
           "rows": [], "skipped": []}
    bad = 0
    print("%6s %4s %3s %3s %-4s | %9s %9s %6s | %9s %9s %6s | %s" % (
        "T", "D", "B", "H", "dt", "fwd fusec", "torch", "ratio", "bwd fusec",
        "torch", "ratio", "max rel err"))
    for T in (int(x) for x in a.T.split(",")):
        for D in (int(x) for x in a.D.split(",")):
            if time.time() - t_start > a.budget:
                doc["skipped"].append("T=%d D=%d" % (T, D))
                continue
            try:
                r = run_case(T, D, a.dtype, not a.no_causal, dev)
            except Exception as e:  # reported per case, the rest go on
                r = {"T": T, "D": D, "dtype": a.dtype,
                     "error": "%s: %s" % (type(e).__name__, e)}
            doc["rows"].append(r)
            if "error" in r:
                bad += 1
                print("%6d %4d FAIL %s" % (T, D, r["error"]), flush=True)
            else:
                bad += not r["agrees"]
                print("%6d %4d %3d %3d %-4s | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f | %.1e%s" % (
                    T, D, r["B"], r["H"], r["dtype"], r["fusec"]["fwd_TFLOPs"],
                    r["torch"]["fwd_TFLOPs"], r["fwd_fusec_over_torch"],
                    r["fusec"]["bwd_TFLOPs"], r["torch"]["bwd_TFLOPs"],
                    r["bwd_fusec_over_torch"], max(r["rel_err"].values()),
                    "" if r["agrees"] else " DISAGREES"), flush=True)
            if a.json:
                with open(a.json + ".tmp", "w") as f:
                    json.dump(doc, f, indent=1)
                os.replace(a.json + ".tmp", a.json)
    if a.device == "cuda":
        torch.cuda.synchronize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
