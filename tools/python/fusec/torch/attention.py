"""fusec.torch.attention: scaled_dot_product_attention, to the attention
primitive where it maps, else as traceable math.

While exporting (and in the torch.compile backend) F.scaled_dot_product_attention
is replaced by sdpa(): a form the attention primitive can take becomes
two custom ops, fusec::sdpa_attention (o and the rows' log-sum-exp, lse)
and, in the backward, fusec::sdpa_attention_backward (dq, dk, dv from
q, k, v, o, lse and do: the forward saves o and lse only). The writer
(handlers at the end of this module) writes them as

    o, lse = attention(q, k, v, mask?, causal=true, scale=S)
    dq = attention_dq(q, k, v, o, lse, do, mask?, causal=true, scale=S)
    dk, dv = attention_dkv(q, k, v, o, lse, do, mask?, causal=true, scale=S)

so no T x T buffer is written, forward or backward. What maps: q, k, v
[batch..., H, T, D] of f32, f16 or bf16 with the same batch dims; head dims
multiples of 16 up to 256 (the host and GPU kernels' tiles); causal
(upper-left, as SDPA's is_causal); scale; a bool mask (false hides a key)
or an additive float mask of q's dtype that broadcasts to the scores
[batch..., Hq, Tq, Tk] and needs no gradient; GQA through enable_gqa (kv
heads read in place, query head h reads kv head h / (Hq / Hkv)). kv heads
repeated before the call (transformers' repeat_kv when a padding mask
is given: broadcast_in_dim + reshape in the trace) are read unrepeated
too: the partitioner folds an interleaved repeat that only attention ops
read into the regions (ir/attention.c), and attention_dkv writes the
group sums the backward's reshape and sum would have made.

Any other form (dropout, a mask that needs a gradient or has another
dtype, another head dim, f64, rank < 3) runs as its math (sdpa_math:
matmul, mask, softmax, matmul; for f16/bf16 _FlashCPU, which rounds where
PyTorch's CPU flash kernel rounds), and the reason is kept in NOTES, which
fusec.torch.explain() prints. export(attention="math") writes every call
as its math. Dropout inside attention is refused while exporting unless
random ops are (export(random=True)): then it is the math's dropout, as in
the backend.

The custom ops also run in PyTorch (their reference bodies below, in f32 or
f64 with the T x T scores): a part of a graph that fusec does not take
still runs where eager runs.

Not here: the kernels (codegen/attention.c, attention_gpu.c) and the
decomposed form's recognition (ir/attention.c), which is what eager
attention's matmul/softmax/matmul becomes.
"""

import functools
import math
from typing import Optional, Tuple

import torch

from .ops import _h
from .values import ExportError, V, _Refused, _fmt_num

# (what, why) for every call written as math instead of the primitive
NOTES = []
_NOTES_MAX = 256


class _MathAttention:
    """Replaces F.scaled_dot_product_attention, while tracing, by sdpa()
    (or, with primitive=False, always by its math). A patch of the module
    attribute rather than a TorchFunctionMode, because checkpoint's
    recomputation runs in the autograd engine, where Python modes are not
    active.

    transformers' mask code asks is_tracing(mask) before it reads a
    mask's values (to pass SDPA is_causal=True instead of an all-ones
    padding mask); make_fx's real-tensor tracing is tracing, but its
    tensors are neither fake nor proxies, so while exporting
    transformers.masking_utils.is_tracing answers True and the mask is
    built, never read. random: dropout_p is honoured (export(random=True)),
    not refused."""

    def __init__(self, primitive=True, random=False):
        self.primitive = primitive
        self.random = random

    def __enter__(self):
        import sys
        import torch.nn.functional as F
        self.saved = F.scaled_dot_product_attention
        f = _sdpa_export if self.primitive else _sdpa_math
        F.scaled_dot_product_attention = functools.partial(f, random=True) \
            if self.random else f
        self.mu = sys.modules.get("transformers.masking_utils")
        if self.mu is not None and hasattr(self.mu, "is_tracing"):
            self.saved_tracing = self.mu.is_tracing
            self.mu.is_tracing = lambda *a, **k: True
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F
        F.scaled_dot_product_attention = self.saved
        if self.mu is not None and hasattr(self, "saved_tracing"):
            self.mu.is_tracing = self.saved_tracing
        return False


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
               scale=None, enable_gqa=False, random=False):
    if dropout_p and not random:
        raise ExportError("scaled_dot_product_attention with dropout_p=%g: "
                          "random ops are exported only with "
                          "export(..., random=True); or use 0" % dropout_p)
    return sdpa_math(q, k, v, attn_mask, dropout_p, is_causal, scale,
                     enable_gqa)


def _sdpa_export(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None, enable_gqa=False, random=False):
    if dropout_p:
        return _sdpa_math(q, k, v, attn_mask, dropout_p, is_causal, scale,
                          enable_gqa, random)
    return sdpa(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)


def why_not(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
            enable_gqa=False, target=None):
    """None when the call maps to the attention primitive, else why not.
    target: the fusec target the backward will run on ("cpu", "emu",
    "cuda"), None for a trace (any target)."""
    if dropout_p:
        return "dropout_p=%g (the primitive has no dropout)" % dropout_p
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "q, k, v are not all tensors"
    if q.dim() < 3 or q.dim() != k.dim() or q.dim() != v.dim():
        return "q, k, v of ranks %d, %d, %d (the primitive takes [batch..., " \
            "H, T, D], the same rank each)" % (q.dim(), k.dim(), v.dim())
    dt = q.dtype
    if dt not in (torch.float32, torch.float16, torch.bfloat16) or \
            k.dtype != dt or v.dtype != dt:
        return "dtypes %s, %s, %s (the kernels take f32, f16 and bf16)" % (
            q.dtype, k.dtype, v.dtype)
    d, dv = int(q.shape[-1]), int(v.shape[-1])
    if d % 16 or dv % 16 or d > 256 or dv > 256 or int(k.shape[-1]) != d:
        return "head dims %d and %d (the kernels take multiples of 16 up " \
            "to 256)" % (d, dv)
    if tuple(q.shape[:-3]) != tuple(k.shape[:-3]) or \
            tuple(k.shape[:-1]) != tuple(v.shape[:-1]):
        return "batch dims of q %s, k %s, v %s differ" % (
            tuple(q.shape), tuple(k.shape), tuple(v.shape))
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq != hkv and not (enable_gqa and hq % hkv == 0):
        return "%s query heads and %s kv heads without enable_gqa" % (hq, hkv)
    if attn_mask is not None:
        m = attn_mask
        if m.dtype != torch.bool and m.dtype != dt:
            return "a %s mask with %s q (the primitive adds a mask of q's " \
                "dtype)" % (m.dtype, dt)
        if m.requires_grad:
            return "a mask that requires grad (the primitive gives no " \
                "mask gradient)"
        want = tuple(q.shape[:-1]) + (k.shape[-2],)
        if m.dim() > len(want) or any(
                e != 1 and e != w for e, w in
                zip(tuple(m.shape)[::-1], want[::-1])):
            return "a mask %s that does not broadcast to the scores %s" % (
                tuple(m.shape), want)
    return None


_SINKS = []  # lists that an export in progress collects its notes in


def _note(why, q):
    n = ("scaled_dot_product_attention %s%s" % (
        str(q.dtype).split(".")[-1], list(q.shape)), why)
    if len(NOTES) < _NOTES_MAX:
        NOTES.append(n)
    for s in _SINKS:
        if n not in s:
            s.append(n)


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
         scale=None, enable_gqa=False, target=None):
    """F.scaled_dot_product_attention through the attention primitive
    (fusec::sdpa_attention) where why_not() finds nothing against it,
    else its math (sdpa_math), noted in NOTES."""
    why = why_not(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa,
                  target)
    if why is not None:
        _note(why, q)
        return sdpa_math(q, k, v, attn_mask, dropout_p, is_causal, scale,
                         enable_gqa)
    if scale is None:
        scale = 1.0 / math.sqrt(int(q.shape[-1]))
    o, _ = torch.ops.fusec.sdpa_attention(q, k, v, attn_mask,
                                          bool(is_causal), float(scale))
    return o


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


# ---- The custom ops: what the primitive computes, in PyTorch ----------------

def _acc(dt):
    return torch.float64 if dt == torch.float64 else torch.float32


def _ref_scores(q, k, mask, causal, scale):
    """Logits [batch..., Hq, Tq, Tk] in f32 (f64), -inf where hidden; kv
    heads repeated to the query heads."""
    acc = _acc(q.dtype)
    g = q.shape[-3] // k.shape[-3]
    if g > 1:
        k = k.repeat_interleave(g, dim=-3)
    s = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * scale
    if causal:
        L, S = q.shape[-2], k.shape[-2]
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            s = s.masked_fill(~mask, float("-inf"))
        else:
            s = s + mask.to(acc)
    return s


def _ref_probs(s, lse):
    """exp(s - lse), 0 in a row that sees no key (lse -inf)."""
    dead = torch.isneginf(lse)
    return torch.exp(s - torch.where(dead, 0, lse).unsqueeze(-1))


def _kv_sum(x, hkv):
    """[batch..., Hq, T, D] summed over the query heads of each kv head."""
    hq = x.shape[-3]
    if hq == hkv:
        return x
    sh = x.shape[:-3] + (hkv, hq // hkv) + x.shape[-2:]
    return x.reshape(sh).sum(-3)


@torch.library.custom_op("fusec::sdpa_attention", mutates_args=())
def _sdpa_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: Optional[torch.Tensor], causal: bool,
             scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """o, lse = attention(q, k, v, mask?, causal=, scale=) (ops.def)."""
    s = _ref_scores(q, k, mask, causal, scale)
    lse = torch.logsumexp(s, -1)
    p = _ref_probs(s, lse)
    g = q.shape[-3] // v.shape[-3]
    vv = v.repeat_interleave(g, dim=-3) if g > 1 else v
    o = (p @ vv.to(p.dtype)).to(q.dtype)
    return o, lse.contiguous()


@_sdpa_op.register_fake
def _sdpa_fake(q, k, v, mask, causal, scale):
    o = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    lse = q.new_empty(tuple(q.shape[:-1]), dtype=_acc(q.dtype))
    return o, lse


@torch.library.custom_op("fusec::sdpa_attention_backward", mutates_args=())
def _sdpa_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 mask: Optional[torch.Tensor], causal: bool,
                 scale: float) -> Tuple[torch.Tensor, torch.Tensor,
                                        torch.Tensor]:
    """dq = attention_dq(...), dk, dv = attention_dkv(...) (ops.def), as
    FlashAttention-2 computes them: p from lse, di = rowsum(do * o)."""
    acc = _acc(q.dtype)
    s = _ref_scores(q, k, mask, causal, scale)
    p = _ref_probs(s, lse.to(acc))
    hkv = k.shape[-3]
    g = q.shape[-3] // hkv
    vv = v.repeat_interleave(g, dim=-3) if g > 1 else v
    kk = k.repeat_interleave(g, dim=-3) if g > 1 else k
    dof = do.to(acc)
    dv = _kv_sum(p.transpose(-2, -1) @ dof, hkv)
    dp = dof @ vv.to(acc).transpose(-2, -1)
    di = (dof * o.to(acc)).sum(-1, keepdim=True)
    ds = p * (dp - di) * scale
    dq = ds @ kk.to(acc)
    dk = _kv_sum(ds.transpose(-2, -1) @ q.to(acc), hkv)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_sdpa_bwd_op.register_fake
def _sdpa_bwd_fake(do, q, k, v, o, lse, mask, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _sdpa_setup(ctx, inputs, output):
    q, k, v, mask, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _sdpa_backward(ctx, do, dlse):
    q, k, v, o, lse, mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.fusec.sdpa_attention_backward(
        do, q, k, v, o, lse, mask, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None


_sdpa_op.register_autograd(_sdpa_backward, setup_context=_sdpa_setup)


# ---- The writer's handlers: the custom ops as the primitive -------------------

def _attrs(causal, scale):
    a = [("causal", "true")] if causal else []
    return a + [("scale", _fmt_num(scale))]


def _operands(w, q, k, v, mask):
    for x in (q, k, v):
        if not isinstance(x, V):
            raise _Refused("attention of a non-tensor")
    return [mask] if isinstance(mask, V) else []


@_h("sdpa_attention")
def _attention(w, node, args, kwargs):
    q, k, v, mask, causal, scale = args
    (odt, oshape), (ldt, lshape) = w.out_meta()
    o, lse = w.emit("attention", [q, k, v] + _operands(w, q, k, v, mask),
                    _attrs(causal, scale), odt, oshape, nres=2)
    return [o, V(lse.name, ldt, lshape)]


@_h("sdpa_attention_backward")
def _attention_backward(w, node, args, kwargs):
    do, q, k, v, o, lse, mask, causal, scale = args
    ops = [q, k, v, o, lse, do] + _operands(w, q, k, v, mask)
    attrs = _attrs(causal, scale)
    dq = w.emit("attention_dq", ops, attrs, q.dtype, q.shape)
    dk, dv = w.emit("attention_dkv", ops, attrs, k.dtype, k.shape, nres=2)
    return [dq, dk, V(dv.name, v.dtype, v.shape)]
