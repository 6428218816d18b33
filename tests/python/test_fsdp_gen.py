"""The FSDP Llama generator (tools/gen/fsdp_llama.py) computes a true
training step: at world 1 (every shard the whole weight, the collectives the
identity) its loss and every gradient agree with torch.autograd on the same
model, run on the reference interpreter. The hand-written backward (RMSNorm,
rotary, softmax attention, SwiGLU, lm_head and cross-entropy, embedding) is
what this checks; tests/test_comm.c checks the collectives at world 2, 4, 8."""

import os
import sys
import unittest

import fzcheck

fzcheck.need_torch()

import torch  # noqa: E402

import fusec  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gen"))
import fsdp_llama  # noqa: E402

L, H, NH, I, V, B, T = 2, 32, 4, 64, 48, 2, 8
D = H // NH


def model(ids, target, cos, sin, mask, p):
    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g

    def rot(x):
        return torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)

    def heads(x):
        return x.reshape(B, T, NH, D).permute(0, 2, 1, 3)

    x = p["embed"][ids]
    for i in range(L):
        q = "l%d_" % i
        n = rms(x, p[q + "attn_norm"])
        qh, kh, vh = (heads(n @ p[q + w].T) for w in ("wq", "wk", "wv"))
        qh = qh * cos + rot(qh) * sin
        kh = kh * cos + rot(kh) * sin
        s = (qh @ kh.transpose(2, 3)) * (1.0 / D ** 0.5)
        pr = torch.softmax(torch.where(mask, s, torch.tensor(-1e9)), -1)
        ctx = (pr @ vh).permute(0, 2, 1, 3).reshape(B, T, H)
        h = x + ctx @ p[q + "wo"].T
        n2 = rms(h, p[q + "mlp_norm"])
        a = n2 @ p[q + "w_gate"].T
        x = h + (torch.nn.functional.silu(a) * (n2 @ p[q + "w_up"].T)) @ p[q + "w_down"].T
    logits = rms(x, p["final_norm"]) @ p["lm_head"].T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1))


class TestFsdpGenerator(unittest.TestCase):
    def test_world1_matches_autograd(self):
        text = fsdp_llama.generate(1, L, H, NH, I, V, "f64", 1e-5, "fsdp")
        prog = fusec.Program(text, device="reference")
        g = torch.Generator().manual_seed(0)
        names = ["embed"]
        shapes = {"embed": (V, H)}
        for i in range(L):
            q = "l%d_" % i
            for nm, shp in (("attn_norm", (H,)), ("wq", (H, H)), ("wk", (H, H)),
                            ("wv", (H, H)), ("wo", (H, H)), ("mlp_norm", (H,)),
                            ("w_gate", (I, H)), ("w_up", (I, H)), ("w_down", (H, I))):
                names.append(q + nm)
                shapes[q + nm] = shp
        names += ["final_norm", "lm_head"]
        shapes.update({"final_norm": (H,), "lm_head": (V, H)})
        p = {}
        for nm in names:
            base = torch.ones(shapes[nm], dtype=torch.float64) if "norm" in nm else 0
            p[nm] = (base + 0.3 * torch.randn(shapes[nm], generator=g,
                                              dtype=torch.float64)).requires_grad_()
        ids = torch.randint(0, V, (B, T), generator=g)
        target = torch.randint(0, V, (B, T), generator=g)
        ang = torch.randn(T, D, generator=g, dtype=torch.float64)
        cos, sin = torch.cos(ang), torch.sin(ang)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        outs = prog(ids, target, cos, sin, mask, *[p[nm].detach() for nm in names])
        loss = model(ids, target, cos, sin, mask, p)
        grads = torch.autograd.grad(loss, [p[nm] for nm in names])
        self.assertLess(abs(float(outs[0]) - float(loss.detach())), 1e-9)
        for nm, got, want in zip(names, outs[1:], grads):
            err = float((got - want).abs().max() / (want.abs().max() + 1e-30))
            self.assertLess(err, 1e-9, nm)


if __name__ == "__main__":
    unittest.main()
