#!/usr/bin/env python3
"""Write one rank's FSDP (ZeRO-3) Llama training step (forward + backward) at world N.

    python3 tools/gen/fsdp_llama.py --world N --layers L [--hidden 4096]
        [--heads 32] [--intermediate 11008] [--vocab 32000] [--dtype bf16]
        [--eps 1e-5] [--attention primitive|decomposed] [--name NAME] [-o FILE]

Defaults are Llama-2-7B's shapes. Batch B and sequence T are symbolic.

What one rank holds and does (PyTorch FSDP with FULL_SHARD, reshard after
forward, no activation checkpointing):
  - every parameter is a shard: rows r*out/N .. (r+1)*out/N of the weight
    (dim 0), so a [4096, 4096] projection is a [4096/N, 4096] parameter and
    a norm weight [4096] is [4096/N];
  - forward: before each layer, its 9 shards are all-gathered (all_gather
    dim 0) and waited on, then the layer runs; the embedding and the final
    norm and lm_head likewise;
  - backward (written out by hand, what autograd produces): before each
    layer's backward its shards are gathered again; each weight gradient,
    full size, is reduce-scattered (reduce_scatter dim 0) back to a shard;
  - the loss is the mean cross-entropy over this rank's tokens, divided by
    N, so that the summed gradients are the mean over all ranks' tokens.

The written order is the naive one users report: each layer issues its
gathers at its top and waits on them at once, and each gradient's
reduce-scatter is waited on at the end of its layer's backward. `fusec plan`
and `fusec sim` show what communication scheduling makes of it.

Attention is the primitive by default (attention, attention_dq,
attention_dkv: FlashAttention-2, the output and the log-sum-exp kept for
the backward); --attention decomposed writes it as matmul/softmax/matmul
with the probabilities kept for a hand-written backward, which takes any
head dim and runs on every target (the attention kernels want head dims
that are multiples of 16, and the GPU's backward bf16 or f16).

Outputs: loss, then one gradient shard per parameter shard, in parameter
order. Standard library only; deterministic.
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


class Writer:
    def __init__(self):
        self.lines = []

    def __call__(self, s):
        self.lines.append("  " + s + "\n")

    def text(self):
        return "".join(self.lines)


def generate(world, layers, hidden, heads, inter, vocab, dt, eps, name,
             attention="primitive"):
    N = world
    D = hidden // heads
    half = D // 2
    scale = repr(1.0 / (D ** 0.5))
    eps_s = repr(float(eps))
    H, I, V = hidden, inter, vocab
    head = []
    h = head.append
    h("# FSDP (ZeRO-3) Llama training step, one rank of world %d: %d layer%s, hidden %d,\n"
      % (N, layers, "" if layers == 1 else "s", H))
    h("# %d heads of head_dim %d, intermediate %d, vocabulary %d, %s; symbolic B and T.\n"
      % (heads, D, I, V, dt))
    h("# Parameters are shards along dim 0, all-gathered per layer (forward, and again\n")
    h("# for backward); gradients are reduce-scattered back to shards.\n")
    h("# Written by: python3 tools/gen/fsdp_llama.py --world %d --layers %d --hidden %d "
      "--heads %d --intermediate %d --vocab %d --dtype %s --eps %s\n"
      % (N, layers, H, heads, I, V, dt, eps_s))
    h("\n")

    # parameter shards: name -> (full shape)
    params = [("embed", (V, H))]
    for i in range(layers):
        p = "l%d_" % i
        params += [(p + "attn_norm", (H,)), (p + "wq", (H, H)), (p + "wk", (H, H)),
                   (p + "wv", (H, H)), (p + "wo", (H, H)), (p + "mlp_norm", (H,)),
                   (p + "w_gate", (I, H)), (p + "w_up", (I, H)), (p + "w_down", (H, I))]
    params += [("final_norm", (H,)), ("lm_head", (V, H))]
    for nm, shp in params:
        if shp[0] % N:
            raise SystemExit("fsdp_llama.py: %s has %d rows, not divisible by world %d"
                             % (nm, shp[0], N))

    def shard_type(shp):
        return "%s[%s]" % (dt, ", ".join([str(shp[0] // N)] + [str(x) for x in shp[1:]]))

    ps = ["ids: i64[B, T]", "target: i64[B, T]", "cos: %s[T, %d]" % (dt, D),
          "sin: %s[T, %d]" % (dt, D), "mask: bool[T, T]"]
    ps += ["%s_s: %s" % (nm, shard_type(shp)) for nm, shp in params]

    w = Writer()
    gathered = [0]

    def gather(names, tag):
        """Gather names' shards at once, then wait on each (the naive order)."""
        for nm in names:
            w("%s_%sf = all_gather(%s_s, dim=0)" % (nm, tag, nm))
        for nm in names:
            w("%s_%s = wait(%s_%sf)" % (nm, tag, nm, tag))

    grads = {}
    pending = []

    def scatter(nm, g):
        w("%s_gf = reduce_scatter(%s, dim=0)" % (nm, g))
        pending.append(nm)

    def flush():
        for nm in pending:
            w("%s_g = wait(%s_gf)" % (nm, nm))
            grads[nm] = nm + "_g"
        del pending[:]

    def rms(x, g, out):
        w("%s_r = rsqrt(add(mean(mul(%s, %s), dims=[2], keepdim=true), %s))" % (out, x, x, eps_s))
        w("%s_xh = mul(%s, %s_r)" % (out, x, out))
        w("%s = mul(%s_xh, %s)" % (out, out, g))

    def rms_back(x, g, out, dn, dx):
        """dx of n = xh * g, xh = x * r; also reduce-scatters dg."""
        w("%s_dxh = mul(%s, %s)" % (out, dn, g))
        w("%s_dg = sum(mul(%s, %s_xh), dims=[0, 1])" % (out, dn, out))
        w("%s = mul(%s_r, sub(%s_dxh, mul(%s_xh, mean(mul(%s_dxh, %s_xh), dims=[2], keepdim=true))))"
          % (dx, out, out, out, out, out))
        return out + "_dg"

    def flat(x, d):
        return "reshape(%s, shape=[-1, %d])" % (x, d)

    def wgrad(dy, dout, x, din):
        """dW = dyᵀ x over all tokens: [out, in]."""
        return "matmul(transpose(%s, 0, 1), %s)" % (flat(dy, dout), flat(x, din))

    split = "shape=[B, T, %d, %d]" % (heads, D)
    perm = "dims=[0, 2, 1, 3]"
    lo = "start=[0, 0, 0, 0], end=[B, %d, T, %d], step=[1, 1, 1, 1]" % (heads, half)
    hi = "start=[0, 0, 0, %d], end=[B, %d, T, %d], step=[1, 1, 1, 1]" % (half, heads, D)
    merge = "shape=[B, T, %d]" % H
    lnames = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"]

    def rot(x):
        return "cat(neg(slice(%s, %s)), slice(%s, %s), dim=3)" % (x, hi, x, lo)

    def rot_t(u):
        return "cat(slice(%s, %s), neg(slice(%s, %s)), dim=3)" % (u, hi, u, lo)

    def heads_of(x):
        return "permute(reshape(%s, %s), %s)" % (x, split, perm)

    def unheads(x):
        return "reshape(permute(%s, %s), %s)" % (x, perm, merge)

    # ---- forward ----
    w("# forward")
    gather(["embed"], "a")
    w("x0 = take(embed_a, ids, dim=0)")
    x = "x0"
    for i in range(layers):
        s = "l%d" % i
        p = s + "_"
        w("# layer %d" % i)
        gather([p + n for n in lnames], "a")
        rms(x, p + "attn_norm_a", s + "_n1")
        for t in ("q", "k", "v"):
            w("%s_%s = %s" % (s, t, heads_of("linear(%s_n1, %sw%s_a)" % (s, p, t))))
        for t in ("q", "k"):
            w("%s_%sr = add(mul(%s_%s, cos), mul(%s, sin))" % (s, t, s, t, rot(s + "_" + t)))
        if attention == "primitive":
            # FlashAttention: o and the log-sum-exp are kept for the
            # backward, not the probabilities
            w("%s_o, %s_lse = attention(%s_qr, %s_kr, %s_v, mask, scale=%s)"
              % (s, s, s, s, s, scale))
        else:
            w("%s_sc = mul(matmul(%s_qr, transpose(%s_kr, 2, 3)), %s)" % (s, s, s, scale))
            w("%s_pr = softmax(where(mask, %s_sc, -1e9), dim=-1)" % (s, s))
            w("%s_o = matmul(%s_pr, %s_v)" % (s, s, s))
        w("%s_ctx = %s" % (s, unheads(s + "_o")))
        w("%s_h = add(%s, linear(%s_ctx, %swo_a))" % (s, x, s, p))
        rms(s + "_h", p + "mlp_norm_a", s + "_n2")
        w("%s_a = linear(%s_n2, %sw_gate_a)" % (s, s, p))
        w("%s_sg = mul(%s_a, sigmoid(%s_a))" % (s, s, s))
        w("%s_u = linear(%s_n2, %sw_up_a)" % (s, s, p))
        w("%s_m = mul(%s_sg, %s_u)" % (s, s, s))
        w("%s_y = add(%s_h, linear(%s_m, %sw_down_a))" % (s, s, s, p))
        x = s + "_y"
    w("# head and loss")
    gather(["final_norm", "lm_head"], "a")
    rms(x, "final_norm_a", "fn")
    w("logits = linear(fn, lm_head_a)")
    w("loss = div(cross_entropy(logits, target), %s)" % (repr(float(N))))

    # ---- backward ----
    w("# backward: d loss / d logits = (softmax - onehot) / (B*T*N)")
    w("ntok = mul(mul(full(shape=[], value=B, dtype=%s), full(shape=[], value=T, dtype=%s)), %s)"
      % (dt, dt, repr(float(N))))
    w("onehot = cast(eq(broadcast_in_dim(iota(length=%d, dtype=i64), shape=[B, T, %d], dims=[2]), "
      "unsqueeze(target, dim=2)), dtype=%s)" % (V, V, dt))
    w("dlogits = div(sub(softmax(logits, dim=-1), onehot), ntok)")
    gather(["lm_head"], "b")
    scatter("lm_head", wgrad("dlogits", V, "fn", H))
    w("dfn = linear(dlogits, transpose(lm_head_b, 0, 1))")
    gather(["final_norm"], "b")
    dfin = rms_back(x, "final_norm_b", "fn", "dfn", "dx_top")
    scatter("final_norm", dfin)
    flush()
    dx = "dx_top"
    for i in reversed(range(layers)):
        s = "l%d" % i
        p = s + "_"
        w("# layer %d backward" % i)
        gather([p + n for n in lnames], "b")
        # MLP: y = h + down(m), m = silu(a) * u
        w("%s_dm = linear(%s, transpose(%sw_down_b, 0, 1))" % (s, dx, p))
        scatter(p + "w_down", wgrad(dx, H, s + "_m", I))
        w("%s_dsg = mul(%s_dm, %s_u)" % (s, s, s))
        w("%s_du = mul(%s_dm, %s_sg)" % (s, s, s))
        w("%s_sig = sigmoid(%s_a)" % (s, s))
        w("%s_da = mul(%s_dsg, add(%s_sig, mul(%s_sg, sub(1.0, %s_sig))))" % (s, s, s, s, s))
        scatter(p + "w_up", wgrad(s + "_du", I, s + "_n2", H))
        scatter(p + "w_gate", wgrad(s + "_da", I, s + "_n2", H))
        w("%s_dn2 = add(linear(%s_du, transpose(%sw_up_b, 0, 1)), linear(%s_da, transpose(%sw_gate_b, 0, 1)))"
          % (s, s, p, s, p))
        dg2 = rms_back(s + "_h", p + "mlp_norm_b", s + "_n2", s + "_dn2", s + "_dhn")
        scatter(p + "mlp_norm", dg2)
        w("%s_dh = add(%s, %s_dhn)" % (s, dx, s))
        # attention: h = x + wo(ctx)
        w("%s_dctx = %s" % (s, heads_of("linear(%s_dh, transpose(%swo_b, 0, 1))" % (s, p))))
        scatter(p + "wo", wgrad(s + "_dh", H, s + "_ctx", H))
        if attention == "primitive":
            args = "%s_qr, %s_kr, %s_v, %s_o, %s_lse, %s_dctx, mask, scale=%s" % (
                s, s, s, s, s, s, scale)
            w("%s_dqr = attention_dq(%s)" % (s, args))
            w("%s_dkr, %s_dv = attention_dkv(%s)" % (s, s, args))
        else:
            w("%s_dp = matmul(%s_dctx, transpose(%s_v, 2, 3))" % (s, s, s))
            w("%s_dv = matmul(transpose(%s_pr, 2, 3), %s_dctx)" % (s, s, s))
            w("%s_ds = mul(mul(%s_pr, sub(%s_dp, sum(mul(%s_dp, %s_pr), dims=[3], keepdim=true))), %s)"
              % (s, s, s, s, s, scale))
            w("%s_dqr = matmul(%s_ds, %s_kr)" % (s, s, s))
            w("%s_dkr = matmul(transpose(%s_ds, 2, 3), %s_qr)" % (s, s, s))
        for t in ("q", "k"):
            w("%s_d%sh = add(mul(%s_d%sr, cos), %s)" % (s, t, s, t, rot_t("mul(%s_d%sr, sin)" % (s, t))))
            w("%s_d%s = %s" % (s, t, unheads("%s_d%sh" % (s, t))))
        w("%s_dv2 = %s" % (s, unheads(s + "_dv")))
        for t, dv in (("q", s + "_dq"), ("k", s + "_dk"), ("v", s + "_dv2")):
            scatter(p + "w" + t, wgrad(dv, H, s + "_n1", H))
        w("%s_dn1 = add(add(linear(%s_dq, transpose(%swq_b, 0, 1)), linear(%s_dk, transpose(%swk_b, 0, 1))), "
          "linear(%s_dv2, transpose(%swv_b, 0, 1)))" % (s, s, p, s, p, s, p))
        xin = "x0" if i == 0 else "l%d_y" % (i - 1)
        dg1 = rms_back(xin, p + "attn_norm_b", s + "_n1", s + "_dn1", s + "_dxn")
        scatter(p + "attn_norm", dg1)
        w("%s_dx = add(%s_dh, %s_dxn)" % (s, s, s))
        flush()
        dx = s + "_dx"
    w("# embedding backward")
    w("dembed = index_add(full(shape=[%d, %d], value=0, dtype=%s), reshape(ids, shape=[-1]), %s, dim=0)"
      % (V, H, dt, flat(dx, H)))
    scatter("embed", "dembed")
    flush()
    outs = ["loss"] + [grads[nm] for nm, _ in params]
    w("return " + ", ".join(outs))
    return ("".join(head) + "trace %s(\n    %s) world %d {\n" % (name, ",\n    ".join(ps), N)
            + w.text() + "}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="fsdp_llama.py",
        description="Write one rank's FSDP (ZeRO-3) Llama forward+backward trace at world N "
                    "(defaults: Llama-2-7B shapes; symbolic batch B and sequence T).")
    ap.add_argument("--world", type=positive, required=True, help="number of ranks N")
    ap.add_argument("--layers", type=nonneg, required=True, help="number of decoder layers")
    ap.add_argument("--hidden", type=positive, default=4096, help="hidden size (default 4096)")
    ap.add_argument("--heads", type=positive, default=32, help="attention heads (default 32)")
    ap.add_argument("--intermediate", type=positive, default=11008,
                    help="MLP intermediate size (default 11008)")
    ap.add_argument("--vocab", type=positive, default=32000, help="vocabulary size (default 32000)")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16", help="dtype (default bf16)")
    ap.add_argument("--eps", type=float, default=1e-5, help="rms_norm epsilon (default 1e-5)")
    ap.add_argument("--attention", choices=("primitive", "decomposed"), default="primitive",
                    help="attention as the fused primitive (default) or as "
                         "matmul/softmax/matmul with the probabilities saved")
    ap.add_argument("--name", default="fsdp_llama", help="trace name (default fsdp_llama)")
    ap.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    a = ap.parse_args(argv)
    if a.hidden % a.heads:
        ap.error("--hidden (%d) must be a multiple of --heads (%d)" % (a.hidden, a.heads))
    if (a.hidden // a.heads) % 2:
        ap.error("head_dim (%d) must be even for rotary embedding" % (a.hidden // a.heads))
    for what, v in (("--hidden", a.hidden), ("--intermediate", a.intermediate),
                    ("--vocab", a.vocab)):
        if v % a.world:
            ap.error("%s (%d) must be a multiple of --world (%d): every weight is "
                     "sharded along dim 0" % (what, v, a.world))
    if not (a.name[:1].isalpha() or a.name[:1] == "_") or \
            not all(c.isalnum() or c == "_" for c in a.name):
        ap.error("--name must be an identifier")
    text = generate(a.world, a.layers, a.hidden, a.heads, a.intermediate, a.vocab,
                    a.dtype, a.eps, a.name, a.attention)
    if a.output and a.output != "-":
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
