#!/usr/bin/env python3
"""Write an N-layer Llama forward trace in fusec's trace format.

    python3 tools/gen/llama.py --layers N [--hidden 4096] [--heads 32]
        [--intermediate 11008] [--vocab 32000] [--dtype bf16] [--eps 1e-5]
        [--attention primitive|decomposed] [--name NAME] [-o FILE]

The defaults are Llama-2-7B's shapes (hidden 4096, 32 heads of head_dim 128,
intermediate 11008, vocabulary 32000, rms_norm_eps 1e-5, bf16). Batch B and
sequence T are symbolic. The model: embedding lookup (take), N identical
decoder layers (rms_norm, q/k/v projections, rotary embedding with
rotate_half, causal attention with a bool[T, T] mask, o_proj, residual,
rms_norm, SwiGLU MLP with silu, residual), final rms_norm, lm_head linear.
Each layer's weights are separate parameters (layer<i>_...); the rotary
tables cos/sin [T, head_dim] and the mask are shared by all layers.

Attention is written as the primitive (`o, lse = attention(q, k, v, mask,
scale=...)`: FlashAttention's numerics, probabilities never rounded to the
model's dtype, no T x T buffer), or with --attention decomposed as eager
attention writes it (matmul, scale, where on the mask, softmax in the
model's dtype, matmul), which the partitioner fuses only where the
probabilities are not rounded to a narrower dtype (ir/attention.c).

Standard library only. The output is deterministic: the same arguments give
the same bytes.
"""
import argparse
import sys

DTYPES = ("f64", "f32", "f16", "bf16")


def positive(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("must be a positive integer, got %s" % s)
    return v


def nonneg(s):
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0, got %s" % s)
    return v


def fmt_float(x):
    r = repr(float(x))
    return r


def generate(layers, hidden, heads, inter, vocab, dtype, eps, name,
             attention="primitive"):
    D = hidden // heads
    half = D // 2
    scale = fmt_float(1.0 / (D ** 0.5))
    eps_s = fmt_float(eps)
    dt = dtype
    out = []
    w = out.append
    w("# Llama forward, %d layer%s: hidden %d, %d heads of head_dim %d, "
      "intermediate %d,\n" % (layers, "" if layers == 1 else "s", hidden, heads, D, inter))
    w("# vocabulary %d, rms_norm_eps %s, %s, symbolic batch B and sequence T.\n"
      % (vocab, eps_s, dt))
    w("# (Llama-2-7B: --hidden 4096 --heads 32 --intermediate 11008 --vocab 32000.)\n")
    w("# Each layer (HuggingFace LlamaDecoderLayer, eval, %s attention, no KV cache):\n"
      % ("fused (the attention primitive)" if attention == "primitive" else "eager"))
    w("#   h = x + o_proj(attn(rms_norm(x))); y = h + down(silu(gate(n)) * up(n)), n = rms_norm(h)\n")
    w("# cos/sin: rotary tables [T, head_dim]; mask: causal bool[T, T]; both shared by all layers.\n")
    w("# Written by: python3 tools/gen/llama.py --layers %d --hidden %d --heads %d "
      "--intermediate %d --vocab %d --dtype %s --eps %s%s\n"
      % (layers, hidden, heads, inter, vocab, dt, eps_s,
         "" if attention == "primitive" else " --attention decomposed"))
    w("\n")

    # parameters
    ps = [
        "ids: i64[B, T]",
        "cos: %s[T, %d]" % (dt, D),
        "sin: %s[T, %d]" % (dt, D),
        "mask: bool[T, T]",
        "embed: %s[%d, %d]" % (dt, vocab, hidden),
    ]
    hh = "%s[%d, %d]" % (dt, hidden, hidden)
    vec = "%s[%d]" % (dt, hidden)
    gu = "%s[%d, %d]" % (dt, inter, hidden)
    dn = "%s[%d, %d]" % (dt, hidden, inter)
    for i in range(layers):
        p = "l%d_" % i
        ps += [
            p + "attn_norm: " + vec,
            p + "wq: " + hh,
            p + "wk: " + hh,
            p + "wv: " + hh,
            p + "wo: " + hh,
            p + "mlp_norm: " + vec,
            p + "w_gate: " + gu,
            p + "w_up: " + gu,
            p + "w_down: " + dn,
        ]
    ps += ["final_norm: " + vec, "lm_head: %s[%d, %d]" % (dt, vocab, hidden)]
    w("trace %s(\n    %s) {\n" % (name, ",\n    ".join(ps)))

    split = "shape=[B, T, %d, %d]" % (heads, D)
    perm = "dims=[0, 2, 1, 3]"
    lo = "start=[0, 0, 0, 0], end=[B, %d, T, %d], step=[1, 1, 1, 1]" % (heads, half)
    hi = "start=[0, 0, 0, %d], end=[B, %d, T, %d], step=[1, 1, 1, 1]" % (half, heads, D)
    merge = "shape=[B, T, %d]" % hidden

    w("  x0 = take(embed, ids, dim=0)\n")
    x = "x0"
    for i in range(layers):
        p = "l%d_" % i
        s = "l%d" % i
        w("  # layer %d\n" % i)
        w("  %s_n1 = rms_norm(%s, %sattn_norm, dims=[2], eps=%s)\n" % (s, x, p, eps_s))
        for t in ("q", "k", "v"):
            w("  %s_%s = permute(reshape(linear(%s_n1, %sw%s), %s), %s)\n"
              % (s, t, s, p, t, split, perm))
        for t in ("q", "k"):
            w("  %s_%s1 = slice(%s_%s, %s)\n" % (s, t, s, t, lo))
            w("  %s_%s2 = slice(%s_%s, %s)\n" % (s, t, s, t, hi))
            w("  %s_%sr = add(mul(%s_%s, cos), mul(cat(neg(%s_%s2), %s_%s1, dim=3), sin))\n"
              % (s, t, s, t, s, t, s, t))
        if attention == "primitive":
            w("  %s_o, %s_lse = attention(%s_qr, %s_kr, %s_v, mask, scale=%s)\n"
              % (s, s, s, s, s, scale))
        else:
            w("  %s_sc = mul(matmul(%s_qr, transpose(%s_kr, 2, 3)), %s)\n" % (s, s, s, scale))
            w("  %s_pr = softmax(where(mask, %s_sc, -1e9), dim=-1)\n" % (s, s))
            w("  %s_o = matmul(%s_pr, %s_v)\n" % (s, s, s))
        w("  %s_ctx = reshape(permute(%s_o, %s), %s)\n" % (s, s, perm, merge))
        w("  %s_h = add(%s, linear(%s_ctx, %swo))\n" % (s, x, s, p))
        w("  %s_n2 = rms_norm(%s_h, %smlp_norm, dims=[2], eps=%s)\n" % (s, s, p, eps_s))
        w("  %s_g = silu(linear(%s_n2, %sw_gate))\n" % (s, s, p))
        w("  %s_u = linear(%s_n2, %sw_up)\n" % (s, s, p))
        w("  %s_y = add(%s_h, linear(mul(%s_g, %s_u), %sw_down))\n" % (s, s, s, s, p))
        x = "%s_y" % s
    w("  hn = rms_norm(%s, final_norm, dims=[2], eps=%s)\n" % (x, eps_s))
    w("  logits = linear(hn, lm_head)\n")
    w("  return logits\n}\n")
    return "".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="llama.py",
        description="Write an N-layer Llama forward trace (defaults: Llama-2-7B shapes; "
                    "symbolic batch B and sequence T).")
    ap.add_argument("--layers", type=nonneg, required=True, help="number of decoder layers")
    ap.add_argument("--hidden", type=positive, default=4096, help="hidden size (default 4096)")
    ap.add_argument("--heads", type=positive, default=32, help="attention heads (default 32)")
    ap.add_argument("--intermediate", type=positive, default=11008,
                    help="MLP intermediate size (default 11008)")
    ap.add_argument("--vocab", type=positive, default=32000, help="vocabulary size (default 32000)")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16", help="dtype (default bf16)")
    ap.add_argument("--eps", type=float, default=1e-5, help="rms_norm epsilon (default 1e-5)")
    ap.add_argument("--attention", choices=("primitive", "decomposed"), default="primitive",
                    help="attention as the fused primitive (default) or as eager "
                         "attention's matmul/softmax/matmul")
    ap.add_argument("--name", default="llama", help="trace name (default llama)")
    ap.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    a = ap.parse_args(argv)
    if a.hidden % a.heads:
        ap.error("--hidden (%d) must be a multiple of --heads (%d)" % (a.hidden, a.heads))
    if (a.hidden // a.heads) % 2:
        ap.error("head_dim (%d) must be even for rotary embedding" % (a.hidden // a.heads))
    if not (a.name[:1].isalpha() or a.name[:1] == "_") or \
            not all(c.isalnum() or c == "_" for c in a.name):
        ap.error("--name must be an identifier")
    text = generate(a.layers, a.hidden, a.heads, a.intermediate, a.vocab, a.dtype, a.eps, a.name,
                    a.attention)
    if a.output and a.output != "-":
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
