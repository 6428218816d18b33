#!/usr/bin/env python3
"""train_bench.py: Hugging Face families trained through
torch.compile(model, backend="fusec"), against eager PyTorch and Inductor.

    python3 tools/bench/train_bench.py train [--only llama,gpt2] [--steps 20]
    python3 tools/bench/train_bench.py dropout [--only ...]
    python3 tools/bench/train_bench.py first [--size tiny|1024]
    python3 tools/bench/train_bench.py steady [--size tiny|1024]
        [--json tools/bench/results/train_bench.json]

train: every family of tools/hf_families.py plus Mixtral, from its
default config (SDPA attention, use_cache=False, the model's own labels=
loss) with a tiny size and dropout 0, on a batch whose attention mask has
zeros (left padding on the first row): AdamW for --steps steps, eagerly and
under the backend, from the same weights. Reports per family the worst
relative loss difference over the steps (f32; the bar is 1e-4), the
largest parameter difference after the steps (bar 1e-3), then the sequence
length changing every step (8, 12, 16, then 8 again): the programs
prepared after Dynamo marks the length dynamic (at the second length)
against those after the last (the bar: no new program), and the nodes
left to PyTorch with their ops.
dropout: the same models with every dropout at 0.1, on a fixed batch:
the mean loss of the last 5 steps against the first 5 (the bar: it falls),
the random nodes (dropout's rand_like, ...) fusec ran and those left to
PyTorch (the bar: none), the kernels compiled after the first step (each
step draws a new seed; the bar: none), and eager's losses from the same
weights for the scale (other masks: not equal).
first: the first training step (Dynamo, AOTAutograd, compiling, running
forward and backward) in a fresh process, with a cold and then a warm
cache, for fusec and Inductor, on a tiny Llama and a Llama of hidden 1024
and 4 layers.
steady: the median step (forward, backward, AdamW) after warm-up: eager,
fusec and Inductor, at 1 thread and at PyTorch's default thread count.

Times are wall seconds on whatever machine runs it; on a shared machine
they move with the other load.
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
try:
    import fusec  # noqa: F401  (the installed package)
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # noqa: E402

import fusec.torch as ft  # noqa: E402

_DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop",
             "embd_pdrop", "attn_pdrop", "dropout",
             "attention_probs_dropout_prob", "hidden_dropout_prob",
             "dropout_rate", "activation_dropout", "summary_first_dropout")


def families():
    import hf_families
    import transformers as tr
    cfgs = dict(hf_families._cfgs())
    V, H, NH, KVH, I, L = (hf_families.V, hf_families.H, hf_families.NH,
                           hf_families.KVH, hf_families.I, hf_families.L)
    cfgs["gpt2"] = (tr.GPT2Config(vocab_size=V, n_embd=H, n_layer=L,
                                  n_head=NH, n_positions=64),
                    tr.GPT2LMHeadModel, "causal")
    cfgs["mixtral"] = (tr.MixtralConfig(vocab_size=V, hidden_size=H,
                                        intermediate_size=I,
                                        num_hidden_layers=L,
                                        num_attention_heads=NH,
                                        num_key_value_heads=KVH,
                                        num_local_experts=4,
                                        num_experts_per_tok=2),
                       tr.MixtralForCausalLM, "causal")
    return cfgs


def make(family, dropout=0.0, seed=0):
    cfg, cls, task = copy.deepcopy(families()[family])
    for k in _DROPOUTS:
        if hasattr(cfg, k) and isinstance(getattr(cfg, k), float):
            setattr(cfg, k, dropout)
    if getattr(cls, "_supports_sdpa", True):  # BLOOM: eager attention
        cfg._attn_implementation = "sdpa"
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    torch.manual_seed(seed)
    return cls(cfg).train(), task


def batch(task, seq, seed=1, n=2, vocab=128):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    mask = torch.ones(n, seq, dtype=torch.long)
    mask[0, :2] = 0  # left padding on the first row

    def loss(m):
        kw = {"attention_mask": mask, "labels": ids}
        if task != "mlm":
            kw["use_cache"] = False
        return m(input_ids=ids, **kw).loss
    return loss


def train(model, losses_of, steps, lr=1e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    for s in range(steps):
        loss = losses_of(s)(model)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def run_train(family, steps, options):
    row = {"family": family}
    try:
        ref, task = make(family)
    except Exception as e:  # noqa: BLE001: a family this transformers lacks
        row["error"] = "build: %s" % str(e).splitlines()[0][:160]
        return row
    model = copy.deepcopy(ref)
    torch._dynamo.reset()
    ft.stats(reset=True)
    cm = torch.compile(model, backend=ft.backend, options=options)
    fixed = batch(task, 8)
    t0 = time.time()
    try:
        want = train(ref, lambda s: fixed, steps)
        got = train(cm, lambda s: fixed, steps)
    except Exception as e:  # noqa: BLE001: reported, not hidden
        row["error"] = "%s: %s" % (type(e).__name__,
                                   str(e).splitlines()[0][:200])
        return row
    row["seconds"] = round(time.time() - t0, 1)
    row["loss_rel_max"] = max(rel(g, w) for g, w in zip(got, want))
    row["param_abs_max"] = max((p - q).abs().max().item() for p, q in
                               zip(model.parameters(), ref.parameters()))
    st = ft.stats()
    row["programs_fixed"] = st["programs"]
    ex = ft.explain()
    row["fallback_nodes"] = len(ex.fallbacks)
    ops = {}
    for _, c in ex.fallbacks:
        ops[c.op] = ops.get(c.op, 0) + 1
    row["fallback_ops"] = ops
    # the length changing every step: 12 (Dynamo marks it dynamic), 16,
    # then 8 again; compared with eager on the same batches
    lens = (12, 16, 8)
    seen = []

    def by_len(s):
        seen.append(ft.stats()["programs"])
        return batch(task, lens[s], seed=10 + s)
    got = train(cm, by_len, len(lens))
    after = ft.stats()["programs"]
    want = train(ref, lambda s: batch(task, lens[s], seed=10 + s), len(lens))
    row["dyn_loss_rel_max"] = max(rel(g, w) for g, w in zip(got, want))
    # programs once the second length has compiled, and after the last
    row["programs_at_mark"] = seen[1]
    row["programs_after"] = after
    row["graphs"] = st["graphs"]
    row["fallback_parts"] = ft.stats()["fallback_parts"]
    row["ok"] = (row["loss_rel_max"] <= 1e-4 and row["param_abs_max"] <= 1e-3
                 and row["programs_after"] == row["programs_at_mark"])
    return row


_RANDOM = ("rand", "rand_like", "randn", "randn_like", "bernoulli",
           "uniform", "native_dropout")


def run_dropout(family, steps, options):
    """Every dropout of the config at 0.1, AdamW on a fixed batch under the
    backend (and eagerly from the same weights, for the scale: the masks
    differ, so the losses do too). Reports the losses, the random nodes
    fusec ran and those left to PyTorch, and the kernels compiled after
    the first step (each step draws a new seed: the bar is none)."""
    row = {"family": family}
    try:
        model, task = make(family, dropout=0.1)
    except Exception as e:  # noqa: BLE001
        row["error"] = "build: %s" % str(e).splitlines()[0][:160]
        return row
    ref = copy.deepcopy(model)
    row["dropouts"] = {k: getattr(model.config, k) for k in _DROPOUTS
                       if isinstance(getattr(model.config, k, None), float)}
    torch._dynamo.reset()
    ft.stats(reset=True)
    cm = torch.compile(model, backend=ft.backend, options=options)
    fixed = batch(task, 8)
    compiles = []

    def fixed_of(s):
        compiles.append(ft.stats()["kernel_compiles"])
        return fixed
    t0 = time.time()
    try:
        torch.manual_seed(1)
        losses = train(cm, fixed_of, steps, lr=3e-3)
    except Exception as e:  # noqa: BLE001
        row["error"] = "%s: %s" % (type(e).__name__,
                                   str(e).splitlines()[0][:200])
        return row
    row["seconds"] = round(time.time() - t0, 1)
    torch.manual_seed(1)
    eager = train(ref, lambda s: fixed, steps, lr=3e-3)
    ex = ft.explain()
    claims = [c for g in ex.graphs for c in g["claims"]]

    def random(c):
        return c.op.split(".")[:2] in (["aten", r] for r in _RANDOM)
    row["random_nodes_fusec"] = sum(1 for c in claims
                                    if c.claimed and random(c))
    row["random_nodes_pytorch"] = sum(1 for c in claims
                                      if not c.claimed and random(c))
    row["fallback_nodes"] = len(ex.fallbacks)
    row["fallback_ops"] = sorted(set(c.op for _, c in ex.fallbacks))
    row["compiles_after_step1"] = ft.stats()["kernel_compiles"] - compiles[1]
    row["losses"] = [round(x, 5) for x in losses]
    row["eager_losses"] = [round(x, 5) for x in eager]
    first, last = statistics.mean(losses[:5]), statistics.mean(losses[-5:])
    row.update(first5=first, last5=last, falls=last < first,
               eager_first5=statistics.mean(eager[:5]),
               eager_last5=statistics.mean(eager[-5:]))
    row["ok"] = (row["falls"] and row["random_nodes_pytorch"] == 0 and
                 row["compiles_after_step1"] == 0)
    return row


def llama(size):
    import transformers as tr
    if size == "tiny":
        cfg = tr.LlamaConfig(vocab_size=128, hidden_size=64,
                             intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2)
    else:
        cfg = tr.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                             num_hidden_layers=4, num_attention_heads=16,
                             num_key_value_heads=16)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    torch.manual_seed(0)
    return tr.LlamaForCausalLM(cfg).train(), cfg.vocab_size


def one_first_step(backend, size, seq):
    """In this process: the first step's seconds (prints JSON)."""
    model, vocab = llama(size)
    loss_of = batch("causal", seq, vocab=vocab)
    if backend == "fusec":
        cm = torch.compile(model, backend=ft.backend,
                           options={"cache_dir": os.environ["BENCH_CACHE"]})
    else:
        cm = torch.compile(model, backend="inductor")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0 = time.time()
    loss_of(cm).backward()
    opt.step()
    dt = time.time() - t0
    print(json.dumps({"seconds": dt}))


def run_first(size, seq):
    rows = []
    for backend in ("fusec", "inductor"):
        cache = tempfile.mkdtemp(prefix="bench-%s-" % backend)
        env = dict(os.environ, BENCH_CACHE=cache,
                   TORCHINDUCTOR_CACHE_DIR=cache)
        for temp in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, __file__, "_first", backend, size,
                 str(seq)], env=env, capture_output=True, text=True)
            try:
                sec = json.loads(out.stdout.strip().splitlines()[-1])[
                    "seconds"]
            except (IndexError, ValueError):
                sec = None
                print(out.stderr[-2000:], file=sys.stderr)
            rows.append({"size": size, "backend": backend, "cache": temp,
                         "seconds": sec})
            print(rows[-1], flush=True)
    return rows


def run_steady(size, seq, iters):
    rows = []
    default = torch.get_num_threads()
    for threads in (1, default):
        torch.set_num_threads(threads)
        for backend in ("eager", "fusec", "inductor"):
            model, vocab = llama(size)
            loss_of = batch("causal", seq, vocab=vocab)
            torch._dynamo.reset()
            if backend == "fusec":
                m = torch.compile(model, backend=ft.backend,
                                  options={"threads": threads})
            elif backend == "inductor":
                m = torch.compile(model, backend="inductor")
            else:
                m = model
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            times = []
            for i in range(iters + 2):
                t0 = time.time()
                loss_of(m).backward()
                opt.step()
                opt.zero_grad()
                times.append(time.time() - t0)
            rows.append({"size": size, "threads": threads,
                         "backend": backend,
                         "median_step_s": statistics.median(times[2:])})
            print(rows[-1], flush=True)
    torch.set_num_threads(default)
    return rows


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_first":
        one_first_step(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("train", "dropout", "first", "steady"))
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--size", default="tiny", choices=("tiny", "1024"))
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    opts = {"device": a.device}
    fams = [f for f in families() if not a.only or f in a.only.split(",")]
    rows = []
    if a.what in ("train", "dropout"):
        for f in fams:
            fn = run_train if a.what == "train" else run_dropout
            rows.append(fn(f, a.steps, opts))
            print(json.dumps(rows[-1]), flush=True)
    elif a.what == "first":
        rows = run_first(a.size, a.seq)
    else:
        rows = run_steady(a.size, a.seq, a.iters)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        old = []
        if os.path.exists(a.json):
            with open(a.json) as f:
                old = json.load(f)
        old.append({"what": a.what, "argv": sys.argv[1:],
                    "torch": torch.__version__, "threads":
                    torch.get_num_threads(), "rows": rows})
        with open(a.json, "w") as f:
            json.dump(old, f, indent=1)
    bad = [r for r in rows if r.get("error") or r.get("ok") is False or
           r.get("falls") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
