"""scaled_dot_product_attention through the attention primitive: export
and the torch.compile backend, forward and backward, against PyTorch.

The exporter writes F.scaled_dot_product_attention as `attention` and its
backward as `attention_dq` / `attention_dkv` (fusec.torch.attention);
these tests check each form of the call the primitive takes (causal,
scale, a bool or an additive mask broadcast over heads or rows, GQA by
enable_gqa, query and key lengths that differ), the forms it does not
take (kept as math, with the reason), Hugging Face Llama and GPT-2 with
attn_implementation "sdpa" and "eager", and the backend training through
the primitive.

Tolerances:
  f32: 1e-5 relative (norm-wise and max-wise) against PyTorch, as the other
  exporter tests: both compute in f32, in other orders.
  bf16: against the exact result (f64 from the same bf16 inputs), not bit
  for bit against PyTorch's CPU flash kernel. The primitive accumulates
  in f32 (its error grows as sqrt(T) * 2^-24, nothing at these lengths
  against bf16's 2^-9) and rounds each output once (at most 2^-9
  relative per element); the backward reads the bf16 o, as PyTorch's
  does, in di = rowsum(do * o), one more such term. So the norm-wise
  error is at most 2 * 2^-9 = 2^-8, whatever the key count (checked at
  T = 40 and 300). PyTorch's kernel rounds the probabilities and the score
  gradient to bf16 before its products as well, so fusec must also be no
  less accurate than PyTorch's own result (its error plus 2^-10).
  Whole models in bf16 (where every other op rounds as PyTorch's does):
  the gradients' error against the model in f64 at most 1.25x PyTorch's
  bf16 gradients' own.
  On the GPU's kernels (emu) the tensor-core products take the
  probabilities and the score gradient rounded to bf16, as PyTorch's
  kernel does: two more terms of at most 2^-9 each, so the bound there is
  4 * 2^-9 = 2^-7 (and still no less accurate than PyTorch).

FUSEC_TEST_DEVICE: the device the exported traces run on (default
"reference", the interpreter; ctest also runs "cpu" and "emu").
FUSEC_TEST_VERBOSE=1 prints the errors.
"""

import copy
import os
import sys
import unittest

import fzcheck

fzcheck.need_torch()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusec  # noqa: E402
import fusec.torch as ft  # noqa: E402
from fusec import examples  # noqa: E402
from fusec.torch import attention as fattn  # noqa: E402

try:
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False

DEVICE = os.environ.get("FUSEC_TEST_DEVICE", "reference")
VERBOSE = os.environ.get("FUSEC_TEST_VERBOSE")
GPU_KERNELS = DEVICE in ("emu", "cuda")
BF16_TOL = 2.0 ** -7 if GPU_KERNELS else 2.0 ** -8


def say(fmt, *a):
    if VERBOSE:
        sys.stderr.write("\n" + fmt % a)


def nerr(got, want):
    g, w = got.double(), want.double()
    return ((g - w).norm() / (w.norm() or 1.0)).item()


def attention_fn(backward, **kw):
    """f(q, k, v, [mask,] go): SDPA's output, and with backward its
    gradients of q, k, v for the output gradient go."""
    def f(q, k, v, *rest):
        mask = rest[0] if len(rest) == 2 else None
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
        if not backward:
            return o
        return (o,) + torch.autograd.grad(o, (q, k, v), rest[-1])
    return f


def inputs(dtype, b=2, hq=4, hkv=4, tq=40, tk=40, d=32, mask=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, hkv, tk, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, hkv, tk, d, generator=g).to(dtype).requires_grad_()
    go = torch.randn(b, hq, tq, d, generator=g).to(dtype)
    args = [q, k, v]
    if mask == "pad":      # bool, over the keys: [B, 1, 1, Tk]
        m = torch.ones(b, 1, 1, tk, dtype=torch.bool)
        m[1, ..., : tk // 3] = False
        args.append(m)
    elif mask == "rows":   # bool, per batch and row: [B, 1, Tq, Tk]
        m = torch.rand(b, 1, tq, tk, generator=g) > 0.3
        m[..., 0] = True   # no row without a visible key
        args.append(m)
    elif mask == "bias":   # additive, broadcast over batch and heads
        i = torch.arange(tq).unsqueeze(1).float()
        j = torch.arange(tk).unsqueeze(0).float()
        args.append((-0.1 * (i - j).abs()).to(dtype))  # ALiBi-like
    return args + [go]


# (name, inputs' keywords, SDPA's keywords)
CASES = [
    ("causal", dict(), dict(is_causal=True)),
    ("scale_tq_ne_tk", dict(tq=24, tk=40, d=16), dict(scale=0.3)),
    ("causal_tq_gt_tk", dict(tq=40, tk=24, d=16), dict(is_causal=True)),
    ("bool_pad_mask", dict(mask="pad", d=64), dict()),
    ("bool_row_mask", dict(mask="rows", d=16), dict()),
    ("float_bias", dict(mask="bias"), dict()),
    ("gqa_causal", dict(hq=8, hkv=2, d=64), dict(is_causal=True,
                                                  enable_gqa=True)),
    ("gqa_pad_mask", dict(hq=8, hkv=2, mask="pad"), dict(enable_gqa=True)),
    ("long_causal", dict(b=1, hq=2, hkv=2, tq=300, tk=300, d=64),
     dict(is_causal=True)),
]


class TestVariants(unittest.TestCase):
    def export_run(self, f, args):
        text = ft.export(f, *args)
        out = fusec.Program(text, device=DEVICE)(*[a.detach() for a in args])
        return text, out if isinstance(out, tuple) else (out,)

    def check_f32(self, name, ikw, skw):
        backward = True
        args = inputs(torch.float32, **ikw)
        f = attention_fn(backward, **skw)
        text, out = self.export_run(f, args)
        self.assertIn("attention(", text)
        if backward:
            self.assertIn("attention_dq(", text)
            self.assertIn("attention_dkv(", text)
        self.assertNotIn("softmax", text)
        ref = f(*args)
        en, em = fzcheck.worst(out, ref if backward else (ref,))
        say("%s f32: %.2e (norm) %.2e (max)", name, en, em)
        self.assertLessEqual(en, 1e-5)
        self.assertLessEqual(em, 1e-5)

    def check_bf16(self, name, ikw, skw):
        args = inputs(torch.bfloat16, **ikw)
        f = attention_fn(True, **skw)
        text, out = self.export_run(f, args)
        self.assertIn("attention_dkv(", text)
        ref = f(*args)
        exact = f(*[a.detach().double().requires_grad_()
                    if a.is_floating_point() and a.requires_grad else
                    (a.double() if a.is_floating_point() else a)
                    for a in args])
        for what, o, r, e in zip(("o", "dq", "dk", "dv"), out, ref, exact):
            ef, et = nerr(o, e), nerr(r, e)
            say("%s bf16 %s: fusec %.2e, PyTorch %.2e (against f64)",
                name, what, ef, et)
            self.assertLessEqual(ef, BF16_TOL, what)
            self.assertLessEqual(ef, et + 2.0 ** -10, what)


def _add_case(name, ikw, skw):
    setattr(TestVariants, "test_%s_f32" % name,
            lambda self: self.check_f32(name, ikw, skw))
    setattr(TestVariants, "test_%s_bf16" % name,
            lambda self: self.check_bf16(name, ikw, skw))


for _c in CASES:
    _add_case(*_c)


class TestFallbacks(unittest.TestCase):
    """Forms the primitive does not take are written as math, and say
    why (fusec.torch.attention.NOTES, which explain() prints)."""

    def check_math(self, f, args, why):
        stats = {}
        text = ft.export(f, *args, stats=stats)
        self.assertNotIn("attention(", text)
        self.assertIn("softmax", text)
        notes = stats["attention_math"]
        self.assertTrue(any(why in n for _, n in notes), notes)
        out = fusec.Program(text, device="reference")(
            *[a.detach() for a in args])
        en, em = fzcheck.worst(out, f(*args))
        self.assertLessEqual(en, 1e-5)

    def test_head_dim_8(self):
        self.check_math(attention_fn(True, is_causal=True),
                        inputs(torch.float32, d=8, tq=8, tk=8), "head dims 8")

    def test_mask_that_needs_grad(self):
        args = inputs(torch.float32, mask="bias", d=16, tq=8, tk=8)
        args[3].requires_grad_()

        def f(q, k, v, m, go):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            return (o,) + torch.autograd.grad(o, (q, k, v, m), go)
        self.check_math(f, args, "requires grad")

    def test_math_on_request(self):
        args = inputs(torch.float32, d=16, tq=8, tk=8)
        text = ft.export(attention_fn(True, is_causal=True), *args,
                         attention="math")
        self.assertNotIn("attention(", text)

    def test_gpu_target_f32_backward(self):
        """The GPU's kernels have an f32 backward: every target takes an
        f32 attention with gradients."""
        q, k, v, _ = inputs(torch.float32, d=16, tq=8, tk=8)
        for target in ("cpu", "emu", "cuda"):
            self.assertIsNone(fattn.why_not(q, k, v, target=target))


class TestModels(unittest.TestCase):
    """Hugging Face Llama (GQA 4:2) and GPT-2, tiny configs with random
    weights (head dim 16), loss and every gradient through
    torch.autograd.grad, exported with SDPA attention and with eager."""

    def check(self, model, attn, dtype):
        if not HAVE_HF:
            self.skipTest("transformers is not installed")
        step, args = examples.build(model, "bwd", dtype=dtype, attn=attn,
                                    seq=24)
        params, data = args
        text = ft.export(step, *args)
        if attn == "sdpa":
            self.assertIn("attention_dq(", text)
            self.assertIn("attention_dkv(", text)
        else:  # eager attention: matmul, softmax, matmul (the partitioner
            # finds the decomposed form)
            self.assertNotIn("attention(", text)
        out = fusec.Program(text, device=DEVICE)(
            *[t.detach() for t in params.values()], data)
        ref = step(*args)
        en, em = fzcheck.worst(out, ref)
        if dtype == torch.float32:
            say("%s %s f32: %.2e (norm) %.2e (max)", model, attn, en, em)
            self.assertLessEqual(en, 1e-5)
            self.assertLessEqual(em, 1e-5)
            return
        exact = step({k: v.double() if v.is_floating_point() else v
                      for k, v in params.items()}, data)
        ef = max(nerr(o, e) for o, e in zip(out, exact))
        et = max(nerr(r, e) for r, e in zip(ref, exact))
        say("%s %s bf16: against PyTorch %.2e (norm) %.2e (max); against "
            "f64 fusec %.2e, PyTorch %.2e", model, attn, en, em, ef, et)
        self.assertLessEqual(ef, 1.25 * et)


for _m in ("llama", "gpt2"):
    for _a in ("sdpa", "eager"):
        for _d in (torch.float32, torch.bfloat16):
            setattr(TestModels, "test_%s_%s_%s" % (
                _m, _a, str(_d).split(".")[1]),
                (lambda m, a, d: lambda self: self.check(m, a, d))(
                    _m, _a, _d))


class TestBackend(unittest.TestCase):
    """torch.compile(backend=fusec.torch.backend): a tiny HF Llama with
    its default SDPA attention (head dim 16, GQA 4:2, a padding mask)
    trains through the primitive: its forward and backward programs hold
    attention and attention_dq/dkv, and the gradients match eager's."""

    def test_llama_sdpa_trains_through_the_primitive(self):
        if not HAVE_HF:
            self.skipTest("transformers is not installed")
        from transformers import LlamaConfig, LlamaForCausalLM
        dev = DEVICE if DEVICE in ("cpu", "emu") else "cpu"
        # on the GPU's kernels (emu), the tensor-core backward (bf16)
        dtype = torch.bfloat16 if dev == "emu" else torch.float32
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=64,
                          attn_implementation="sdpa", use_cache=False)
        ref = LlamaForCausalLM(cfg).to(dtype)
        model = copy.deepcopy(ref)
        ids = torch.randint(0, 96, (2, 24))
        mask = torch.ones(2, 24, dtype=torch.long)
        mask[1, :5] = 0
        ft.stats(reset=True)
        torch._dynamo.reset()
        cache = os.environ.get("FUSEC_CACHE_DIR") or fzcheck.scratch_dir(
            "fusec-sdpa-")
        cm = torch.compile(model, backend=ft.backend,
                           options={"device": dev, "cache_dir": cache})
        got = cm(input_ids=ids, attention_mask=mask, labels=ids).loss
        got.backward()
        want = ref(input_ids=ids, attention_mask=mask, labels=ids).loss
        want.backward()
        ex = ft.explain()
        self.assertEqual(ft.stats()["fallback_parts"], 0, str(ex))
        self.assertEqual(ex.attention, [])
        texts = {g["kind"]: "".join(p.text or "" for p in g["parts"])
                 for g in ex.graphs}
        self.assertIn("attention(", texts["forward"])
        self.assertIn("attention_dq(", texts["backward"])
        self.assertIn("attention_dkv(", texts["backward"])
        # no T x T value anywhere but the bool mask HF builds ([2, 1, 24,
        # 24], read by the kernel where it lies): none saved for the
        # backward (its parameters), none written (shape attributes)
        import re
        for kind, text in texts.items():
            tt = [m.group(0) for m in re.finditer(r"\w*\[[^\]]*\]", text)
                  if m.group(0).endswith("24, 24]") and
                  m.group(0) != "bool[2, 1, 24, 24]"]
            self.assertEqual(tt, [], kind)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        self.assertLessEqual(abs(got.item() - want.item()),
                             tol * abs(want.item()))
        worst = 0.0
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            worst = max(worst, nerr(p.grad, q.grad))
        say("backend llama sdpa %s on %s: gradients %.2e (norm)", dtype,
            dev, worst)
        self.assertLessEqual(worst, 1e-5 if dtype == torch.float32 else
                             2e-2)

    def test_f32_backward_on_gpu_kernels(self):
        """On emu an f32 SDPA with a backward runs the primitive (the GPU's
        f32 backward kernels), nothing stays math, and the gradients are
        PyTorch's within f32's 1e-5."""
        q, k, v, go = inputs(torch.float32, d=16, tq=8, tk=8)
        ft.stats(reset=True)
        torch._dynamo.reset()
        f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), backend=ft.backend,
            options={"device": "emu"})
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        f(qq, kk, vv).backward(go)
        self.assertEqual(ft.explain().attention, [], str(ft.explain()))
        rq, rk, rv = (t.detach().requires_grad_() for t in (q, k, v))
        F.scaled_dot_product_attention(rq, rk, rv, is_causal=True).backward(go)
        for got, want in ((qq, rq), (kk, rk), (vv, rv)):
            self.assertLessEqual(nerr(got.grad, want.grad), 1e-5)


if __name__ == "__main__":
    unittest.main()
