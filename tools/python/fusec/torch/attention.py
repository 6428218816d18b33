"""fusec.torch.attention: scaled_dot_product_attention as traceable math.

While exporting, F.scaled_dot_product_attention is replaced by its math
(_MathAttention, _sdpa_math); for f16/bf16 by _FlashCPU, an autograd
Function that rounds where PyTorch's CPU flash kernel rounds. Dropout
inside attention is refused here (random ops are not exported).

Not here: any fusec statement; these are PyTorch functions that make_fx
traces like the rest of the model.
"""

import math

import torch

from .values import ExportError


class _MathAttention:
    """Replaces F.scaled_dot_product_attention, while tracing, by its math
    (matmul, mask, softmax, matmul): PyTorch's own lowering goes to a fused
    CPU kernel whose backward has no decomposition. For f16/bf16 it rounds
    where that kernel rounds (_FlashCPU). A patch of the module
    attribute rather than a TorchFunctionMode, because checkpoint's
    recomputation runs in the autograd engine, where Python modes are not
    active."""

    def __enter__(self):
        import torch.nn.functional as F
        self.saved = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = _sdpa_math
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F
        F.scaled_dot_product_attention = self.saved
        return False


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
               scale=None, enable_gqa=False):
    if dropout_p:
        raise ExportError("scaled_dot_product_attention with dropout_p=%g: "
                          "random ops cannot be exported; use 0" % dropout_p)
    return sdpa_math(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)


def sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
              scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention as matmul, mask, softmax, dropout
    (the backend's: dropout_p is honoured), matmul."""
    dt = q.dtype
    L, S = q.size(-2), k.size(-2)
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    if enable_gqa and k.dim() >= 3 and k.size(-3) != q.size(-3):
        rep = q.size(-3) // k.size(-3)
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=torch.float32,
                                device=q.device).masked_fill(
                                    ~attn_mask, float("-inf"))
    if dt in (torch.float16, torch.bfloat16) and not dropout_p:
        return _FlashCPU.apply(q, k, v, attn_mask, is_causal, scale)
    att = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        att = att + attn_mask.to(att.dtype)
    if attn_mask is not None:  # a row with every key masked gives 0, as
        # PyTorch's math attention (its _safe_softmax) gives, not nan
        # (such rows are zeroed before the softmax too, so that its
        # backward sees no nan either)
        dead = att.amax(-1, keepdim=True) == float("-inf")
        att = torch.softmax(att.masked_fill(dead, 0), dim=-1)
        att = att.masked_fill(dead, 0)
    else:
        att = torch.softmax(att, dim=-1)
    if dropout_p:
        att = torch.dropout(att, dropout_p, True)
    return att @ v


def _flash_scores(q, k, mask, causal, scale):
    """q @ k^T * scale, masked, in f32."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        L, S = q.size(-2), k.size(-2)
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s + mask.float()
    return s


class _FlashCPU(torch.autograd.Function):
    """scaled_dot_product_attention for f16/bf16 as PyTorch's CPU flash
    attention kernel computes it, as one block of keys (short sequences
    match it bit for bit; longer ones differ in a few roundings where the
    kernel's online softmax rescales). Forward: scores, max, exp and row
    sum in f32; the probabilities are rounded to the input dtype for the
    product with v; divided by the f32 row sum; rounded once. Backward:
    probabilities recomputed in f32 from the log-sum-exp; dv from the
    rounded probabilities; the score gradient rounded to the input dtype
    for the products giving dq and dk; every product accumulates in f32
    and rounds once."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale):
        dt = q.dtype
        s = _flash_scores(q, k, mask, causal, scale)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        o = ((p.to(dt).float() @ v.float()) / l).to(dt)
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, go):
        q, k, v, o, lse, mask = ctx.saved_tensors
        dt = q.dtype
        s = _flash_scores(q, k, mask, ctx.causal, ctx.scale)
        p = torch.exp(s - lse)
        gf = go.float()
        dv = (p.to(dt).float().transpose(-2, -1) @ gf).to(dt)
        dp = gf @ v.float().transpose(-2, -1)
        dsum = (gf * o.float()).sum(-1, keepdim=True)
        ds = (p * (dp - dsum)).to(dt).float()
        dq = ((ds @ k.float()) * ctx.scale).to(dt)
        dk = ((ds.transpose(-2, -1) @ q.float()) * ctx.scale).to(dt)
        return dq, dk, dv, None, None, None
