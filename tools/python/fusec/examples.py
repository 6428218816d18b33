"""fusec.examples: the models the exporter is tested and measured on.

Each builder returns (step, args): `step(*args)` is a plain function of
tensors that fusec.torch.export traces, and `args` are its example
arguments: a dict of the model's parameters and buffers (they become the
trace's parameters, named after the module path) and the batch of token ids.

    kind="fwd"   logits = model(ids)
    kind="bwd"   (loss, *grads) of a causal-LM loss, through
                 torch.autograd.grad: forward and backward in one trace
    kind="ckpt"  as "bwd", with activation checkpointing on every layer
                 (torch.utils.checkpoint, non-reentrant): the backward
                 recomputes each layer's forward

Models:
  nanogpt  one transformer block of nanoGPT, written in plain torch (LayerNorm,
           causal self-attention through scaled_dot_product_attention, GELU
           MLP), with a mean-square loss for the backward
  llama    Hugging Face LlamaForCausalLM (RMSNorm, RoPE, GQA, SwiGLU)
  gpt2     Hugging Face GPT2LMHeadModel

Sizes: "tiny" (2 layers, hidden 64, vocab 128; the test size) or "7b"
(Llama-2-7B: hidden 4096, 32 heads, MLP 11008, vocab 32000, 32 layers);
layers= overrides the depth. meta=True builds the model on the meta device,
so a 7B model costs no memory (export it with fake=True).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["build", "KINDS", "MODELS"]

KINDS = ("fwd", "bwd", "ckpt")
MODELS = ("nanogpt", "llama", "gpt2")


# ---- nanoGPT block (after Karpathy's model.py) -----------------------------

class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, bias=True):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd, bias=True):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias=True):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, bias)
        self.checkpointing = False

    def _body(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def forward(self, x):
        if self.checkpointing:
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class _Step(nn.Module):
    """model(data) -> logits, or with wrt: (loss, *d loss/d wrt)."""

    def __init__(self, m, hf):
        super().__init__()
        self.m, self.hf = m, hf

    def forward(self, data, wrt):
        if self.hf:
            # An explicit all-ones attention mask: without one, transformers
            # looks for packed sequences in the position ids, a
            # data-dependent branch that cannot be traced.
            kw = {"use_cache": False, "attention_mask": torch.ones_like(data)}
            if wrt is None:
                return self.m(data, **kw).logits
            loss = self.m(data, labels=data, **kw).loss
        else:
            y = self.m(data)
            if wrt is None:
                return y
            loss = (y.float() * y.float()).mean()
        return (loss,) + tuple(torch.autograd.grad(loss, wrt))


# ---- builders ----------------------------------------------------------------

_SIZES = {
    "tiny": dict(hidden=64, heads=4, kv_heads=2, inter=128, vocab=128,
                 layers=2),
    "7b": dict(hidden=4096, heads=32, kv_heads=32, inter=11008, vocab=32000,
               layers=32),
}


def _hf_model(name, sz, layers, dtype, attn="eager"):
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=sz["vocab"], hidden_size=sz["hidden"],
                          intermediate_size=sz["inter"],
                          num_hidden_layers=layers,
                          num_attention_heads=sz["heads"],
                          num_key_value_heads=sz["kv_heads"],
                          max_position_embeddings=4096, rms_norm_eps=1e-5,
                          attention_dropout=0.0, tie_word_embeddings=False)
        cfg._attn_implementation = attn
        return LlamaForCausalLM(cfg).to(dtype)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=sz["vocab"], n_embd=sz["hidden"],
                     n_layer=layers, n_head=sz["heads"], n_positions=4096,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = attn
    return GPT2LMHeadModel(cfg).to(dtype)


def build(model="llama", kind="fwd", size="tiny", layers=None, batch=2,
          seq=8, dtype=torch.float32, meta=False, seed=0, attn="eager"):
    """(step, args) for one model and kind; see the module docstring.
    attn: the transformers models' attention ("eager", or "sdpa":
    scaled_dot_product_attention)."""
    if model not in MODELS:
        raise ValueError("model must be one of %s" % ", ".join(MODELS))
    if kind not in KINDS:
        raise ValueError("kind must be one of %s" % ", ".join(KINDS))
    sz = _SIZES[size]
    layers = layers or sz["layers"]
    torch.manual_seed(seed)
    dev = torch.device("meta") if meta else torch.device("cpu")
    with dev:
        if model == "nanogpt":
            m = Block(sz["hidden"], sz["heads"]).to(dtype)
        else:
            m = _hf_model(model, sz, layers, dtype, attn)
    if not meta and model == "nanogpt":
        # LayerNorm starts at weight 1, bias 0; perturb so its gradients and
        # its affine part are exercised
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    ckpt = kind == "ckpt"
    if model == "nanogpt":
        m.checkpointing = ckpt
    elif ckpt:
        m.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train(ckpt)  # HF checkpoints only in training mode; dropout is 0

    pnames = [n for n, _ in m.named_parameters()]
    tensors = dict(m.named_parameters())
    tensors.update(m.named_buffers())
    if meta:
        ids = torch.zeros((batch, seq), dtype=torch.int64, device="meta")
        x = torch.zeros((batch, seq, sz["hidden"]), dtype=dtype,
                        device="meta")
    else:
        g = torch.Generator().manual_seed(seed + 1)
        ids = torch.randint(0, sz["vocab"], (batch, seq), generator=g)
        x = torch.randn((batch, seq, sz["hidden"]), generator=g).to(dtype)
    # The backward runs inside functional_call, so that checkpoint's
    # recomputation (which reads the module's attributes during the
    # backward) sees the traced parameters, not the module's own tensors.
    wrap = _Step(m, model != "nanogpt")

    def call(params, data, grads):
        return torch.func.functional_call(
            wrap, {"m." + k: v for k, v in params.items()},
            (data, [params[n] for n in pnames] if grads else None))

    def fwd(params, data):
        return call(params, data, False)

    def loss_and_grads(params, data):
        return call(params, data, True)
    data = x if model == "nanogpt" else ids
    step = fwd if kind == "fwd" else loss_and_grads
    step.__name__ = "%s_%s" % (model, kind)
    return step, (tensors, data)
