#!/usr/bin/env python3
"""hf_families.py: the exporter on the model families people run.

Builds each Hugging Face family below from a tiny config with random
weights (nothing is downloaded), and exports one training step, the loss
and the gradient of every parameter (torch.autograd.grad), with
fusec.torch.export; then runs the trace (on the interpreter, or with
--device cpu on generated code) and compares every output with eager
PyTorch: ||fusec - torch|| / ||torch|| and max|fusec - torch| / max|torch|,
the worst output counting (see worst()), within 1e-5 for f32 and 1e-2 for bf16 (the
project's rule, tests/python/fzcheck.py).

    PYTHONPATH=tools/python python3 tools/hf_families.py [--dtype f32,bf16]
        [--device reference|cpu] [--only llama,t5] [--markdown]

Prints one row per family and dtype: whether it exports (else the first
line of the ExportError), whether it matches, the relative errors and the
trace's op count. Exit status 1 when any row fails.

The decoders get an attention mask with left padding on the first row, so
the mask-derived position ids (cumsum) and attention biases are exercised;
the encoder (BERT) a masked-LM loss, T5 a sequence-to-sequence loss, both
without a mask (see step()).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "python"))

import torch  # noqa: E402

import fusec  # noqa: E402
import fusec.torch as ft  # noqa: E402

V, H, NH, KVH, I, L = 128, 64, 4, 2, 128, 2   # vocab, hidden, heads, ...


def _cfgs():
    import transformers as tr
    dec = dict(vocab_size=V, hidden_size=H, intermediate_size=I,
               num_hidden_layers=L, num_attention_heads=NH)
    return {
        "llama": (tr.LlamaConfig(**dec, num_key_value_heads=KVH),
                  tr.LlamaForCausalLM, "causal"),
        "mistral": (tr.MistralConfig(**dec, num_key_value_heads=KVH,
                                     sliding_window=None),
                    tr.MistralForCausalLM, "causal"),
        "qwen2": (tr.Qwen2Config(**dec, num_key_value_heads=KVH),
                  tr.Qwen2ForCausalLM, "causal"),
        "gemma": (tr.GemmaConfig(**dec, num_key_value_heads=KVH,
                                 head_dim=H // NH),
                  tr.GemmaForCausalLM, "causal"),
        "phi3": (tr.Phi3Config(**dec, num_key_value_heads=KVH,
                               pad_token_id=0, bos_token_id=1,
                               eos_token_id=2),
                 tr.Phi3ForCausalLM, "causal"),
        "gpt_neox": (tr.GPTNeoXConfig(**dec), tr.GPTNeoXForCausalLM,
                     "causal"),
        "gptj": (tr.GPTJConfig(vocab_size=V, n_embd=H, n_layer=L, n_head=NH,
                               rotary_dim=8, n_positions=64),
                 tr.GPTJForCausalLM, "causal"),
        "opt": (tr.OPTConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L,
                             ffn_dim=I, num_attention_heads=NH,
                             word_embed_proj_dim=H,
                             max_position_embeddings=64, pad_token_id=1),
                tr.OPTForCausalLM, "causal"),
        "bloom": (tr.BloomConfig(vocab_size=V, hidden_size=H, n_layer=L,
                                 n_head=NH),
                  tr.BloomForCausalLM, "causal"),
        "falcon": (tr.FalconConfig(vocab_size=V, hidden_size=H,
                                   num_hidden_layers=L,
                                   num_attention_heads=NH),
                   tr.FalconForCausalLM, "causal"),
        "bert": (tr.BertConfig(vocab_size=V, hidden_size=H,
                               num_hidden_layers=L, num_attention_heads=NH,
                               intermediate_size=I,
                               max_position_embeddings=64),
                 tr.BertForMaskedLM, "mlm"),
        "t5": (tr.T5Config(vocab_size=V, d_model=H, d_kv=H // NH, d_ff=I,
                           num_layers=L, num_heads=NH,
                           decoder_start_token_id=0, pad_token_id=0),
               tr.T5ForConditionalGeneration, "seq2seq"),
    }


def build(family, dtype, batch=2, seq=8, seed=0):
    """(step, (params, ids, mask)) for one family: step returns the loss
    and the gradient of every parameter."""
    cfg, cls, task = _cfgs()[family]
    for k in ("attention_dropout", "hidden_dropout", "resid_pdrop",
              "embd_pdrop", "attn_pdrop", "dropout", "attention_probs_dropout_prob",
              "hidden_dropout_prob", "dropout_rate", "activation_dropout"):
        if hasattr(cfg, k):
            setattr(cfg, k, 0.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = cls(cfg).to(dtype)
    m.eval()
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(3, V, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if task == "causal":
        mask[0, :2] = 0          # left padding on the first row
    pnames = [n for n, _ in m.named_parameters()]
    params = dict(m.named_parameters())
    params.update(m.named_buffers())

    def step(params, ids, mask):
        # BERT, T5: transformers skips an all-ones bidirectional mask by
        # testing padding_mask.all() in Python, a branch on data that no
        # trace can record (the exporter refuses it, naming the line): no
        # mask for them
        kw = {"attention_mask": mask if task == "causal" else None,
              "labels": ids}
        if task != "mlm":
            kw["use_cache"] = False
        out = torch.func.functional_call(m, params, (ids,), kw)
        loss = out.loss
        grads = torch.autograd.grad(loss, [params[n] for n in pnames],
                                    allow_unused=True)
        return (loss,) + tuple(gr for gr in grads if gr is not None)
    step.__name__ = family
    return step, (params, ids, mask)


def worst(outs, refs):
    """The worst (norm-wise, max-wise) relative error over the outputs. An
    output whose values are a thousandth of the largest output's or less is
    measured against that thousandth: a gradient that is zero analytically
    (OPT's key-projection bias: softmax ignores a constant added to a row
    of scores) is rounding noise on both sides, ~1e-10 here, and its
    relative error means nothing."""
    refs = [r.detach().double() for r in refs]
    floor = 1e-3 * max((r.abs().max().item() for r in refs if r.numel()),
                       default=1.0)
    en = em = 0.0
    for o, r in zip(outs, refs):
        d = o.double() - r
        en = max(en, d.norm().item() / max(r.norm().item(), floor, 1e-300))
        em = max(em, d.abs().max().item() / max(r.abs().max().item(), floor,
                                                1e-300))
    return en, em


def run(family, dtype, device):
    row = {"family": family, "dtype": str(dtype).split(".")[1],
           "exports": False, "matches": False, "ops": None, "err": (None,
                                                                     None),
           "why": ""}
    try:
        step, args = build(family, dtype)
    except Exception as e:  # noqa: BLE001: a family this transformers lacks
        row["why"] = "build: %s" % str(e).splitlines()[0][:120]
        return row
    stats = {}
    t0 = time.time()
    try:
        # compared with eager PyTorch on this machine: reproduce its
        # per-thread bf16 partial sums (layer_norm's weight/bias gradients)
        text = ft.export(step, *args, stats=stats,
                         cpu_threads=torch.get_num_threads())
    except ft.ExportError as e:
        lines = str(e).splitlines()
        row["why"] = "; ".join(x.strip() for x in lines[1:4])[:200]
        return row
    row["exports"] = True
    row["ops"] = stats["op_count"]
    row["export_s"] = time.time() - t0
    params, ids, mask = args
    try:
        prog = fusec.Program(text, device=device)
        out = prog(*[t.detach() for t in params.values()], ids, mask)
    except fusec.FusecError as e:
        row["why"] = "run: %s" % " ".join(str(e).split())[:200]
        return row
    ref = step(*args)
    en, em = worst(out, ref)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    row["err"] = (en, em)
    row["matches"] = en <= tol and em <= tol
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--device", default="reference",
                    choices=("reference", "cpu"))
    ap.add_argument("--only", default="")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    dts = {"f32": torch.float32, "bf16": torch.bfloat16}
    fams = [f for f in _cfgs() if not a.only or f in a.only.split(",")]
    rows = []
    if a.markdown:
        print("| family | dtype | exports | matches PyTorch | rel. error "
              "(norm, max) | op count |")
        print("| --- | --- | --- | --- | --- | --- |")
    for f in fams:
        for d in a.dtype.split(","):
            r = run(f, dts[d], a.device)
            rows.append(r)
            en, em = r["err"]
            errs = "%.1e, %.1e" % (en, em) if en is not None else "-"
            if a.markdown:
                print("| %s | %s | %s | %s | %s | %s |" % (
                    f, d, "yes" if r["exports"] else "no: " + r["why"],
                    "yes" if r["matches"] else "no", errs,
                    r["ops"] if r["ops"] is not None else "-"))
            else:
                print("%-9s %-5s exports=%-3s matches=%-3s err=%-18s ops=%s %s"
                      % (f, d, "yes" if r["exports"] else "no",
                         "yes" if r["matches"] else "no", errs, r["ops"],
                         r["why"]))
            sys.stdout.flush()
    return 0 if all(r["matches"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
