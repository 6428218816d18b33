"""Real model code, exported and run on the reference interpreter against
PyTorch: a nanoGPT block in plain torch, Hugging Face LlamaForCausalLM and
GPT2LMHeadModel from small configs with random weights; forward, forward +
backward through torch.autograd.grad, and forward + backward with activation
checkpointing on every layer; f32 and bf16.

Error measure: per output, ||fusec - torch|| / ||torch|| and
max|fusec - torch| / max|torch|, both within 1e-5 for f32 and 1e-2 for bf16;
the worst output of each trace counts. The exporter writes bf16
traces that round where PyTorch's CPU kernels round (fusec.torch: layer_norm
and its backward, log_softmax, scaled_dot_product_attention, products with
a Python number), so bf16 results agree to a few elements that differ by
one rounding, far inside 1e-2. FUSEC_TEST_VERBOSE=1 prints
the figures; FUSEC_TEST_DEVICE picks the device (default "reference")."""

import os
import sys
import unittest

import fzcheck

fzcheck.need_torch()

import torch  # noqa: E402

import fusec  # noqa: E402
import fusec.torch as ft  # noqa: E402
from fusec import examples  # noqa: E402

try:
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False

VERBOSE = os.environ.get("FUSEC_TEST_VERBOSE")
# the device the exported models run on: the interpreter by default; ctest
# also runs them on "emu", the GPU's kernels emulated on the CPU
DEVICE = os.environ.get("FUSEC_TEST_DEVICE", "reference")


class TestModels(unittest.TestCase):
    def check(self, model, kind, dtype):
        if model != "nanogpt" and not HAVE_HF:
            self.skipTest("transformers is not installed")
        step, args = examples.build(model, kind, dtype=dtype)
        stats = {}
        # compared with eager PyTorch on this machine: reproduce its
        # per-thread bf16 partial sums (layer_norm's weight/bias gradients).
        # The GPU's kernels (emu) have no f32 attention backward: there
        # nanoGPT's f32 backward writes scaled_dot_product_attention as
        # its math (test_sdpa tests the primitive's f32 backward on cpu)
        math = DEVICE in ("emu", "cuda") and dtype == torch.float32 and \
            kind != "fwd"
        text = ft.export(step, *args, stats=stats,
                         cpu_threads=torch.get_num_threads(),
                         attention="math" if math else "primitive")
        prog = fusec.Program(text, device=DEVICE)
        params, data = args
        out = prog(*[t.detach() for t in params.values()], data)
        ref = step(*args)
        en, em = fzcheck.worst(out, ref)
        tol = fzcheck.TOL[str(dtype).split(".")[1]]
        if VERBOSE:
            sys.stderr.write("\n%s %s %s: %d ops, rel err %.2e (norm) "
                             "%.2e (max)\n" % (model, kind, dtype,
                                               stats["op_count"], en, em))
        self.assertLessEqual(en, tol)
        self.assertLessEqual(em, tol)
        _OPS[model, kind, dtype] = stats["op_count"]
        if kind == "ckpt":
            # the recomputed forward is in the trace: more ops than "bwd"
            # (counted by that test, which runs first, or here)
            if (model, "bwd", dtype) not in _OPS:
                s2 = {}
                s_step, s_args = examples.build(model, "bwd", dtype=dtype)
                ft.export(s_step, *s_args, stats=s2,
                          cpu_threads=torch.get_num_threads())
                _OPS[model, "bwd", dtype] = s2["op_count"]
            self.assertGreater(stats["op_count"], _OPS[model, "bwd", dtype])


_OPS = {}  # (model, kind, dtype) -> op count of its export


class TestFamilies(unittest.TestCase):
    """One family of tools/hf_families.py (which sweeps twelve) in CI: OPT,
    whose learned positions come from cumsum(attention_mask) and whose
    first row is left-padded, loss and every gradient, f32."""

    def test_opt_bwd_f32(self):
        if not HAVE_HF:
            self.skipTest("transformers is not installed")
        sys.path.insert(0, os.path.join(fzcheck.ROOT, "tools"))
        import hf_families
        row = hf_families.run("opt", torch.float32, "reference")
        if VERBOSE:
            sys.stderr.write("\nopt bwd f32: %s\n" % row)
        self.assertTrue(row["exports"], row["why"])
        self.assertTrue(row["matches"], row)
        self.assertIsNotNone(row["ops"])


def _add(model, kind, dtype):
    def t(self):
        self.check(model, kind, dtype)
    name = "test_%s_%s_%s" % (model, kind, str(dtype).split(".")[1])
    setattr(TestModels, name, t)


for _m in examples.MODELS:
    for _k in examples.KINDS:
        for _d in (torch.float32, torch.bfloat16):
            _add(_m, _k, _d)


if __name__ == "__main__":
    unittest.main()
