#!/usr/bin/env python3
"""export_model.py: write fusec traces of real models (needs PyTorch, and
transformers for llama/gpt2).

    tools/export_model.py --model llama --kind all --size tiny --out DIR
    tools/export_model.py --model llama --size 7b --kind bwd,ckpt --fake \\
        --dtype bf16 --batch 1 --seq 2048 --out /tmp/llama7b
    tools/export_model.py --corpus           # the small traces of tests/traces

Models (fusec/examples.py): nanogpt (one nanoGPT block in plain torch),
llama (LlamaForCausalLM), gpt2 (GPT2LMHeadModel). Kinds: fwd (logits),
bwd (loss and all parameter gradients through torch.autograd.grad), ckpt
(bwd with activation checkpointing on every layer). Sizes: tiny (2 layers,
hidden 64, vocab 128) or 7b (Llama-2-7B shapes: 32 layers, hidden 4096);
--layers sets the depth. --fake builds the model on the meta device and
traces with fake tensors, so a full-size model exports without its memory.

For each trace it prints the op count, the export time, and the peak bytes of
the trace's written order (every result its own buffer, see
fusec.torch._peak_bytes), one JSON object per line with --json.

--plan also runs `fusec plan FILE --json` on each trace written and prints
its count of each op and the planner's figures: peak_bytes (the planned
schedule) and peak_bytes_trace_order, regions, kernels, library calls. The
Llama-2-7B memory figures come from one command:

    tools/export_model.py --model llama --size 7b --kind bwd,ckpt --fake \
        --dtype bf16 --batch 1 --seq 2048 --out /tmp/llama7b --plan

The fusec binary is --fusec PATH, else $FUSEC, else the repository's
build/tools/fusec, else `fusec` on the PATH.
The token-id parameter `data` (nanoGPT's: its input activations) holds
indices into the vocabulary: feed it values in [0, vocab). --symbolic
writes its batch and sequence extents as B and T.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "python"))

CORPUS = [  # (model, kind, dtype) written by --corpus into tests/traces
    (m, k, "f32") for m in ("nanogpt", "llama", "gpt2")
    for k in ("fwd", "bwd", "ckpt")
] + [("llama", "fwd", "bf16"), ("llama", "bwd", "bf16")]


def export_one(model, kind, size, layers, batch, seq, dtype, fake, symbolic):
    import torch
    import fusec.torch as ft
    from fusec import examples
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16,
           "f16": torch.float16}[dtype]
    t0 = time.time()
    step, args = examples.build(model, kind, size=size, layers=layers,
                                batch=batch, seq=seq, dtype=tdt, meta=fake)
    sym = None
    if symbolic:
        # the step's input (examples.build): token ids, or nanoGPT's x
        sym = {"data": {0: "B", 1: "T"}}
    stats = {}
    t1 = time.time()
    text = ft.export(step, *args, fake=fake, symbolic=sym, stats=stats,
                     name="%s_%s_%s_%s" % (model, size, kind, dtype))
    t2 = time.time()
    stats.update(model=model, kind=kind, size=size, dtype=dtype,
                 layers=layers, batch=batch, seq=seq, fake=fake,
                 build_seconds=round(t1 - t0, 2),
                 export_seconds=round(t2 - t1, 2))
    return text, stats


def find_fusec(given):
    import shutil
    for cand in (given, os.environ.get("FUSEC"),
                 os.path.join(HERE, "..", "build", "tools", "fusec")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.normpath(cand)
    return shutil.which("fusec")


def plan(fusec, path):
    """The figures of `fusec plan PATH --json` (whole file)."""
    import subprocess
    r = subprocess.run([fusec, "plan", path, "--json"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError("fusec plan %s failed (exit %d): %s" %
                           (path, r.returncode, r.stderr.strip()[-2000:]))
    j = json.loads(r.stdout)
    return {k: j[k] for k in ("peak_bytes", "peak_bytes_trace_order",
                              "regions", "kernels", "library_calls")
            if k in j}


def header(st):
    return ("# %s %s (%s, %s, batch %d, seq %d%s), exported from PyTorch by\n"
            "# tools/export_model.py --model %s --kind %s --size %s "
            "--dtype %s%s\n# %d ops\n" %
            (st["model"], st["kind"], st["size"], st["dtype"], st["batch"],
             st["seq"], ", %d layers" % st["layers"] if st["layers"] else "",
             st["model"], st["kind"], st["size"], st["dtype"],
             " --layers %d" % st["layers"] if st["layers"] else "",
             st["op_count"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama",
                    help="nanogpt, llama, gpt2, or a comma list")
    ap.add_argument("--kind", default="all", help="fwd, bwd, ckpt, all, or "
                    "a comma list")
    ap.add_argument("--size", default="tiny", choices=("tiny", "7b"))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--dtype", default="f32", help="f32, bf16, f16, or a "
                    "comma list")
    ap.add_argument("--fake", action="store_true",
                    help="meta model, fake tensors: no memory for the data")
    ap.add_argument("--symbolic", action="store_true",
                    help="write batch and sequence as symbols B and T")
    ap.add_argument("--out", default=".", help="output folder")
    ap.add_argument("--corpus", action="store_true",
                    help="write the small traces into tests/traces")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plan", action="store_true",
                    help="run `fusec plan --json` on each trace; print its "
                    "op counts and planned peak bytes")
    ap.add_argument("--fusec", default=None,
                    help="the fusec binary for --plan")
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("export_model.py needs PyTorch: pip install torch "
                         "transformers\n")
        return 2
    import warnings
    warnings.filterwarnings("ignore")
    from fusec.torch import ExportError

    if a.corpus:
        out = os.path.join(HERE, "..", "tests", "traces")
        jobs = [(m, k, d, "tiny") for m, k, d in CORPUS]
        a.batch, a.seq, a.layers, a.fake = 2, 8, None, False
    else:
        out = a.out
        kinds = ("fwd", "bwd", "ckpt") if a.kind == "all" else \
            a.kind.split(",")
        jobs = [(m, k, d, a.size) for m in a.model.split(",")
                for k in kinds for d in a.dtype.split(",")]
    os.makedirs(out, exist_ok=True)
    status = 0
    fusec = None
    if a.plan:
        fusec = find_fusec(a.fusec)
        if not fusec:
            sys.stderr.write("--plan: no fusec binary (build it, or give "
                             "--fusec PATH)\n")
            return 2
    for model, kind, dtype, size in jobs:
        try:
            text, st = export_one(model, kind, size, a.layers, a.batch,
                                  a.seq, dtype, a.fake, a.symbolic)
        except ExportError as e:
            sys.stderr.write("%s %s %s: %s\n" % (model, kind, dtype, e))
            status = 1
            continue
        if a.corpus:
            fname = "torch_%s_%s%s.trace" % (
                model, kind, "" if dtype == "f32" else "_" + dtype)
        else:
            fname = "%s_%s_%s_%s.trace" % (model, size, kind, dtype)
        path = os.path.join(out, fname)
        with open(path, "w") as f:
            f.write(header(st) + text)
        st["file"] = os.path.normpath(path)
        if fusec:
            try:
                st["plan"] = plan(fusec, path)
            except (RuntimeError, ValueError) as e:
                sys.stderr.write("%s\n" % e)
                status = 1
        if a.json:
            st = dict(st)
            print(json.dumps(st, sort_keys=True))
            continue
        print("%-44s %6d ops  export %6.1fs  peak (trace order) %s, "
              "with views %s" %
              (st["file"], st["op_count"], st["export_seconds"],
               _human(st["peak_bytes_trace_order"]),
               _human(st["peak_bytes_views"])))
        if "plan" in st:
            p = st["plan"]
            print("    ops: %s" % ", ".join(
                "%s %d" % kv for kv in sorted(st["ops"].items(),
                                              key=lambda kv: (-kv[1],
                                                              kv[0]))))
            print("    fusec plan: peak_bytes %d (%s), "
                  "peak_bytes_trace_order %d (%s); %s regions, %s kernels, "
                  "%s library calls" %
                  (p["peak_bytes"], _human(p["peak_bytes"]),
                   p["peak_bytes_trace_order"],
                   _human(p["peak_bytes_trace_order"]),
                   p.get("regions", "?"), p.get("kernels", "?"),
                   p.get("library_calls", "?")))
    return status


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%.2f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0
    return str(n)


if __name__ == "__main__":
    sys.exit(main())
