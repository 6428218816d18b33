#!/usr/bin/env python3
"""Write attention traces for checking the fused kernels against the
reference interpreter (fusec run --check).

    python3 tools/gen/attn_cases.py [--lengths 1,17,129] [--dims 64,80]
        [--dtypes f32,bf16] [--batch 1] [--heads 4] [-o FILE]

Per (length, head dim, dtype), the file holds:
  - the primitive forward and backward in one trace (o, lse = attention;
    dq = attention_dq; dk, dv = attention_dkv), in the variants: plain,
    causal, GQA 4:1 (4 query heads per kv head) causal, a bool padding
    mask [B, 1, 1, T] with a causal mask, a sliding window of 16 keys,
    softcap 30 with a float mask, and a bool mask [B, 1, T, T] made in the
    trace (causal, and the last quarter of the keys hidden: HF's Llama
    hands SDPA its causal mask so), which the kernels read block by block;
  - the same forward and backward with q, k, v and do the projections'
    [B, T, H D] seen as [B, H, T, D] (reshape, permute: what the exporter
    hands the ops), GQA 4:1 causal with a bool mask [B, 1, T, T], which
    the CPU's kernels read where they lie;
  - the decomposed forward eager attention writes (matmul, scale, where on
    an iota causal mask, softmax, matmul), which the partitioner makes the
    same region.
  - for T > 5, a decode step and a chunk of 5 queries against T keys
    (GQA 4:1, a bool padding mask), forward and backward.
Query and key lengths are the same (T) elsewhere; the padding mask hides
the last third of the keys of every batch. Standard library only; deterministic.
"""
import argparse
import sys


def ints(s):
    return [int(x) for x in s.split(",") if x]


def cases(T, D, dt, B, H):
    G = 4
    out = []
    w = out.append
    tag = "t%d_d%d_%s" % (T, D, dt)
    qkv = lambda hq, hk: "q: %s[%d, %d, %d, %d], k: %s[%d, %d, %d, %d], v: %s[%d, %d, %d, %d], do: %s[%d, %d, %d, %d]" % (
        dt, B, hq, T, D, dt, B, hk, T, D, dt, B, hk, T, D, dt, B, hq, T, D)
    variants = [
        ("plain", H, H, "", "", ""),
        ("causal", H, H, "", "", ", causal=true"),
        ("gqa", H, H // G if H >= G else 1, "", "", ", causal=true"),
        ("pad", H, H, ", pad: bool[%d, 1, 1, %d]" % (B, T), ", pad", ", causal=true"),
        ("window", H, H, "", "", ", causal=true, window=16"),
        ("softcap", H, H, ", bias: %s[%d, %d]" % (dt, T, T), ", bias", ", softcap=30.0"),
        ("bmask", H, H, "", ", m", ""),
    ]
    for name, hq, hk, mparam, marg, attrs in variants:
        w("trace %s_%s(%s%s) {\n" % (name, tag, qkv(hq, hk), mparam))
        if name == "bmask":
            w("  i = iota(length=%d, dtype=i64)\n" % T)
            w("  c = ge(reshape(i, shape=[%d, 1]), reshape(i, shape=[1, %d]))\n" % (T, T))
            w("  keep = lt(reshape(i, shape=[1, %d]), %d)\n" % (T, T - T // 4))
            w("  m = broadcast_in_dim(logical_and(c, keep), shape=[%d, 1, %d, %d], "
              "dims=[2, 3])\n" % (B, T, T))
        w("  o, lse = attention(q, k, v%s%s)\n" % (marg, attrs))
        w("  dq = attention_dq(q, k, v, o, lse, do%s%s)\n" % (marg, attrs))
        w("  dk, dv = attention_dkv(q, k, v, o, lse, do%s%s)\n" % (marg, attrs))
        w("  return o, lse, dq, dk, dv\n}\n")
    # operands through permutes of [B, T, H D] projections
    hk = H // G if H >= G else 1
    w("trace strided_%s(qp: %s[%d, %d, %d], kp: %s[%d, %d, %d], vp: %s[%d, %d, %d], "
      "dop: %s[%d, %d, %d]) {\n" % (tag, dt, B, T, H * D, dt, B, T, hk * D, dt, B, T,
                                   hk * D, dt, B, T, H * D))
    for x, h in (("q", H), ("k", hk), ("v", hk), ("do", H)):
        w("  %s = permute(reshape(%sp, shape=[%d, %d, %d, %d]), dims=[0, 2, 1, 3])\n"
          % (x, x, B, T, h, D))
    w("  i = iota(length=%d, dtype=i64)\n" % T)
    w("  c = ge(reshape(i, shape=[%d, 1]), reshape(i, shape=[1, %d]))\n" % (T, T))
    w("  m = broadcast_in_dim(c, shape=[%d, 1, %d, %d], dims=[2, 3])\n" % (B, T, T))
    w("  o, lse = attention(q, k, v, m, scale=0.125)\n")
    w("  dq = attention_dq(q, k, v, o, lse, do, m, scale=0.125)\n")
    w("  dk, dv = attention_dkv(q, k, v, o, lse, do, m, scale=0.125)\n")
    w("  return o, lse, dq, dk, dv\n}\n")
    # a decode step and a short chunk against a KV cache of T keys: 1 and
    # 5 query rows (fewer than a tile of the products), GQA 4:1, a bool
    # padding mask
    for tq in (1, 5) if T > 5 else ():
        w("trace decode%d_%s(q: %s[%d, %d, %d, %d], k: %s[%d, %d, %d, %d], "
          "v: %s[%d, %d, %d, %d], do: %s[%d, %d, %d, %d], pad: bool[%d, 1, 1, %d]) {\n"
          % (tq, tag, dt, B, H, tq, D, dt, B, hk, T, D, dt, B, hk, T, D, dt, B, H, tq, D,
             B, T))
        w("  o, lse = attention(q, k, v, pad)\n")
        w("  dq = attention_dq(q, k, v, o, lse, do, pad)\n")
        w("  dk, dv = attention_dkv(q, k, v, o, lse, do, pad)\n")
        w("  return o, lse, dq, dk, dv\n}\n")
    # the decomposed form, with an iota causal mask and a scale
    w("trace eager_%s(%s) {\n" % (tag, qkv(H, H)))
    w("  i = iota(length=%d, dtype=i64)\n" % T)
    w("  causal = ge(reshape(i, shape=[%d, 1]), reshape(i, shape=[1, %d]))\n" % (T, T))
    w("  s = mul(matmul(q, transpose(k, 2, 3)), %r)\n" % (1.0 / D ** 0.5))
    w("  p = softmax(where(causal, s, -1e9), dim=-1)\n")
    w("  o = matmul(p, v)\n")
    w("  return o\n}\n")
    return "".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="attn_cases.py", description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=ints, default=[1, 17, 129])
    ap.add_argument("--dims", type=ints, default=[64, 80])
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    text = "".join(cases(T, D, dt, a.batch, a.heads) for T in a.lengths for D in a.dims
                   for dt in a.dtypes.split(","))
    if a.output and a.output != "-":
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
