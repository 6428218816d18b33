#!/usr/bin/env python3
"""bench_symbolic_export.py: one export for every sequence length.

    PYTHONPATH=tools/python FUSEC_LIBRARY=build/libfusec.so \
      python3 tools/bench/bench_symbolic_export.py [--only llama,mixtral]
          [--lengths 8,12,16,8] [--json OUT]

Issue 21, point 3: before, export(symbolic=) failed on Hugging Face's own
loss (the label shift's T+1, the flattened B*T-B), so every new sequence
length exported again. For each family (from tools/hf_families.py, plus
Mixtral; tiny configs, random weights, the training step: loss and every
gradient), this measures

  fixed export   export() at one length, with no symbolic dims: what each
                 new length used to cost
  symbolic export  export(symbolic={ids, mask: B, T}) once (it traces two
                 or three times: at the example sizes, at others, and, to
                 confirm a sum such as T+1, at a third)
  per length     the one program run on the cpu target at each length of
                 --lengths, into a fresh cache: seconds of the first call at
                 that length, the kernels it added to the cache and the
                 plans (a plan and its key list are stored per binding of
                 the sizes, by design)
  match          the worst relative error against eager PyTorch over the
                 lengths (||fusec - torch|| / ||torch||, the worst output)

Export times are wall time on a shared machine: compare them with each
other, in one run.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))


def build(family):
    import torch
    import hf_families as hf
    if family != "mixtral":
        step, (params, ids, mask) = hf.build(family, torch.float32)
        return step, params
    import transformers as tr
    cfg = tr.MixtralConfig(vocab_size=hf.V, hidden_size=hf.H,
                           intermediate_size=hf.I, num_hidden_layers=hf.L,
                           num_attention_heads=hf.NH,
                           num_key_value_heads=hf.KVH, num_local_experts=4,
                           num_experts_per_tok=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = tr.MixtralForCausalLM(cfg)
    pn = [n for n, _ in m.named_parameters()]
    params = dict(m.named_parameters())
    params.update(m.named_buffers())

    def step(params, ids, mask):
        out = torch.func.functional_call(
            m, params, (ids,), {"attention_mask": mask, "labels": ids,
                                "use_cache": False})
        g = torch.autograd.grad(out.loss, [params[n] for n in pn],
                                allow_unused=True)
        return (out.loss,) + tuple(x for x in g if x is not None)
    return step, params


def data(t, batch=2):
    import torch
    import hf_families as hf
    g = torch.Generator().manual_seed(t)
    ids = torch.randint(3, hf.V, (batch, t), generator=g)
    mask = torch.ones(batch, t, dtype=torch.long)
    mask[0, :2] = 0
    return ids, mask


def fusec_cache():
    lib = os.environ.get("FUSEC_LIBRARY", "")
    for cand in (os.path.join(os.path.dirname(lib), "tools", "fusec-cache"),
                 os.path.join(ROOT, "build", "tools", "fusec-cache")):
        if os.access(cand, os.X_OK):
            return cand
    raise SystemExit("fusec-cache not found (set FUSEC_LIBRARY)")


def entries(d):
    """{kind: count} of a cache's entries: kernels, and the plans and key
    lists stored per binding of the sizes."""
    import subprocess
    out = subprocess.run([fusec_cache(), "--cache-dir", d, "ls"],
                         capture_output=True, text=True).stdout
    n = {"kernels": 0, "plans": 0}
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) > 4:
            n["plans" if f[4] in ("plan", "keys") else "kernels"] += 1
    return n


def bench(family, lengths):
    import fusec
    import fusec.torch as ft
    import hf_families as hf
    step, params = build(family)
    row = {"family": family}
    t0 = time.time()
    ft.export(step, params, *data(lengths[0]))
    row["fixed_export_s"] = round(time.time() - t0, 2)
    t0 = time.time()
    text = ft.export(step, params, *data(lengths[0]),
                     symbolic={"ids": {0: "B", 1: "T"},
                               "mask": {0: "B", 1: "T"}})
    row["symbolic_export_s"] = round(time.time() - t0, 2)
    row["sums"] = sorted(set(w for w in
                             __import__("re").findall(r"[A-Z*]+[+-]\w+",
                                                      text)))
    cache = tempfile.mkdtemp(prefix="fusec-bench-sym-")
    os.environ["FUSEC_CACHE_DIR"] = cache
    prog = fusec.Program(text, device="cpu")
    row["lengths"], worst = [], 0.0
    for t in lengths:
        ids, mask = data(t)
        before = entries(cache)
        t0 = time.time()
        out = prog(*[x.detach() for x in params.values()], ids, mask)
        dt = time.time() - t0
        en, _ = hf.worst(out, step(params, ids, mask))
        worst = max(worst, en)
        after = entries(cache)
        row["lengths"].append({
            "T": t, "first_call_s": round(dt, 3),
            "new_kernels": after["kernels"] - before["kernels"],
            "new_plans": after["plans"] - before["plans"]})
    row["worst_rel_err"] = worst
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="llama,mixtral")
    ap.add_argument("--lengths", default="8,12,16,8")
    ap.add_argument("--json", help="write the rows here as JSON")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    rows = []
    for fam in a.only.split(","):
        r = bench(fam, lengths)
        rows.append(r)
        print("%-8s fixed export %5.1f s, symbolic export %5.1f s (sums %s);"
              " per length: %s; worst rel err %.1e" % (
                  fam, r["fixed_export_s"], r["symbolic_export_s"],
                  ", ".join(r["sums"]) or "none",
                  ", ".join("T=%d %.2f s +%d kernels +%d plans" % (
                      x["T"], x["first_call_s"], x["new_kernels"],
                      x["new_plans"]) for x in r["lengths"]),
                  r["worst_rel_err"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"host": platform.node(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
