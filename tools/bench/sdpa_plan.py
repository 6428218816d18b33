#!/usr/bin/env python3
"""sdpa_plan.py: the planned peak memory of a tiny Hugging Face Llama's
training step with its default SDPA attention, exported through the
attention primitive and through SDPA's math, at T = 512 and 2048.

The step is loss and every gradient (torch.autograd.grad) of
LlamaForCausalLM (hidden 128, 4 query heads over 2 kv heads, head dim 32,
2 layers, MLP 256, vocab 256; random weights), B = 1, no padding mask
(transformers then passes SDPA is_causal=True and enable_gqa=True). It is
exported twice with fake tensors (no data):

  primitive  fusec.torch.export(step, ...): scaled_dot_product_attention as
             attention / attention_dq / attention_dkv (the forward saves o
             and the log-sum-exp)
  math       export(..., attention="math"): matmul, mask, softmax, matmul
             (the exporter's form before; the partitioner does not fuse it
             in f32 either: PyTorch's backward of it reads the saved
             probabilities)

and each trace is planned with `fusec plan --json`: peak bytes of the
planned schedule, kernels, library calls; and the trace's values of T x T
size are counted (any value whose last two extents are T, T).

    tools/bench/sdpa_plan.py [--T 512 2048] [--out FILE]

Writes tools/bench/results/sdpa_plan-<host>-<utc time>.json and prints a
table. Run from the repository root with a built tree (build/).
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
os.environ.setdefault("FUSEC_LIBRARY", os.path.join(ROOT, "build",
                                                    "libfusec.so"))

import torch  # noqa: E402

import fusec.torch as ft  # noqa: E402


def model():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096,
                      attn_implementation="sdpa", use_cache=False,
                      tie_word_embeddings=False)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def export(m, T, attention):
    names = [n for n, _ in m.named_parameters()]
    tensors = dict(m.named_parameters())
    tensors.update(m.named_buffers())

    def step(params, ids):
        loss = torch.func.functional_call(
            m, params, (ids,), {"labels": ids, "use_cache": False}).loss
        return (loss,) + torch.autograd.grad(loss,
                                             [params[n] for n in names])
    ids = torch.zeros((1, T), dtype=torch.int64, device="meta")
    return ft.export(step, tensors, ids, fake=True, attention=attention,
                     name="llama_step")


def plan(text):
    with tempfile.NamedTemporaryFile("w", suffix=".trace", delete=False) as f:
        f.write(text)
    try:
        out = subprocess.run([os.path.join(ROOT, "build", "tools", "fusec"),
                              "plan",
                              f.name, "--json"], capture_output=True,
                             text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    return json.loads(out)


def tt_values(text, T):
    """Types and shapes in the trace whose last two extents are T, T."""
    pat = re.compile(r"\[([^\]]*)\]")
    n = 0
    for m in pat.finditer(text):
        dims = [d.strip() for d in m.group(1).split(",")]
        if len(dims) >= 2 and dims[-1] == str(T) and dims[-2] == str(T):
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--out")
    a = ap.parse_args()
    m = model()
    rows = []
    for T in a.T:
        for attention in ("primitive", "math"):
            text = export(m, T, attention)
            p = plan(text)
            rows.append({"T": T, "attention": attention,
                         "peak_bytes": p["peak_bytes"],
                         "kernels": p["kernels"],
                         "library_calls": p["library_calls"],
                         "tt_shapes": tt_values(text, T),
                         "attention_ops": text.count(" attention(")})
            r = rows[-1]
            print("T=%-5d %-9s peak %10.2f MiB  kernels %3d  library calls "
                  "%3d  T x T shapes %d" % (T, attention,
                                             r["peak_bytes"] / 2 ** 20,
                                             r["kernels"],
                                             r["library_calls"],
                                             r["tt_shapes"]), flush=True)
    for attention in ("primitive", "math"):
        ps = [r["peak_bytes"] for r in rows if r["attention"] == attention]
        if len(ps) >= 2:
            print("%s: peak(T=%d) / peak(T=%d) = %.2f (T ratio %.1f)" % (
                attention, a.T[-1], a.T[0], ps[-1] / ps[0],
                a.T[-1] / a.T[0]))
    res = {"bench": "sdpa_plan", "host": platform.node(),
           "utc": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
           "torch": torch.__version__, "rows": rows}
    out = a.out or os.path.join(ROOT, "tools", "bench", "results",
                                "sdpa_plan-%s-%s.json" % (res["host"],
                                                          res["utc"]))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
