#!/usr/bin/env python3
"""step_bench.py: a Llama training step through torch.compile(backend=
"fusec") on the CPU, against eager PyTorch and Inductor (issue 25 point 3,
issue 21's step times).

    tools/bench/step_bench.py steady                 the whole grid
    tools/bench/step_bench.py steady --hidden 256,1024 --layers 2 --seq 128
        --threads 1,0 --iters 8 [--profile]
    tools/bench/step_bench.py first [--sizes tiny,1024]
        [--backends fusec,inductor]

steady: a Llama (transformers' LlamaForCausalLM, SDPA attention, f32, or
bf16 throughout with --dtype bf16: parameters, activations, AdamW) of
hidden 64, 256 and 1024 (intermediate 2.75x, rounded to 16; heads of 16
at hidden 64, of 64 above), 2 and 4 layers, vocabulary --vocab (2048: the
layers, not the LM head, should be what is measured), B=4, T=128 and 512,
trained with AdamW (foreach, eager for all three: the same optimizer time
in each). For each size and thread count one fresh process builds the
model three times from one seed (eager, fusec, Inductor), runs --warmup
steps of each (the first compiles; its seconds are kept as first_s), then
--iters rounds in which each way takes one step, the order rotating round
by round, so a burst of load from another process hits all three alike.
Reported per way: the median step (forward, backward, AdamW) and the
median of forward + backward alone (the part the backends change), and
the ratios eager/fusec and inductor/fusec of both (above 1: fusec is
faster); beside them the median CPU seconds of the process per step and
their ratio ("inductor/fusec cpu"): at one thread on a machine shared
with other work, a step's wall time includes the time the OS ran
something else, its CPU time does not (at more threads it counts every
thread's, a spinning one's too, so read it there as work, not time). --threads 0 is PyTorch's default thread count (all cores);
fusec gets the same count through options={"threads": n}.

--profile adds, for fusec, where its step goes: the seconds inside fusec
programs (the library's run, from FUSEC_PROFILE's per-step clock: kernels,
matrix products and copies, the products' GFLOP/s), the seconds in the
Python call of each program beyond that (argument binding, output
allocation: host overhead), and the rest of the step (PyTorch between
programs: AOTAutograd's wrappers, the nodes fusec left to PyTorch, the
optimizer). FUSEC_PROFILE=1 is set before the programs are made (two
clock reads per library step); the split is taken over extra steps after
the timed ones, so its Python wrapper costs the timed medians nothing.

first: issue 21's first step (Dynamo, AOTAutograd, export, compile, run
of forward and backward, one AdamW step) in a fresh process, with a cold
cache (an empty folder for fusec's kernels and for Inductor's) and then a
warm one (the same folder again, another fresh process), on a tiny Llama
(hidden 64, 2 layers, vocabulary 128, B=2, T=64) and on a Llama of hidden
1024, 4 layers (vocabulary 32000, B=2, T=64), against Inductor.

To compare builds of the library, run once per build with FUSEC_LIBRARY
naming it and --label saying which (both kept in the record): each run's
ratios to eager and Inductor are measured within that run.

Each run appends one record to the JSON (default tools/bench/results/
step_bench-<host>-<UTC time>.json): the machine (CPUs, load average
before and after), torch's version, the arguments and the rows. Times are
wall seconds; on a shared machine they move with the other load, so
compare ways by their ratios within one run.
"""

import argparse
import json
import os
import platform
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

WAYS = ("eager", "fusec", "inductor")


def config(hidden, layers, vocab):
    import transformers as tr
    head = 16 if hidden < 256 else 64
    inter = (int(hidden * 2.75) + 15) // 16 * 16
    cfg = tr.LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                         intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=hidden // head,
                         num_key_value_heads=hidden // head,
                         max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    return cfg


def build(cfg, way, threads, seed=0, dtype="f32"):
    import torch
    import transformers as tr
    import fusec.torch as ft
    torch.manual_seed(seed)
    model = tr.LlamaForCausalLM(cfg).train()
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    if way == "fusec":
        opts = {"threads": threads}
        if os.environ.get("BENCH_CACHE"):
            opts["cache_dir"] = os.environ["BENCH_CACHE"]
        run = torch.compile(model, backend=ft.backend, options=opts)
    elif way == "inductor":
        run = torch.compile(model, backend="inductor")
    else:
        run = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, run, opt


def data(vocab, b, t, seed=1):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (b, t), generator=g)


def step(run, opt, ids, cpu=None):
    """(fwd+bwd seconds, whole step seconds, loss); cpu, a list, gets
    the process's CPU seconds of both"""
    c0, t0 = time.process_time(), time.perf_counter()
    loss = run(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    c1, t1 = time.process_time(), time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    c2, t2 = time.process_time(), time.perf_counter()
    if cpu is not None:
        cpu[:] = [c1 - c0, c2 - c0]
    return t1 - t0, t2 - t0, float(loss.detach())


class Profile:
    """fusec's step split: library time, Python call overhead per
    program, and the rest (PyTorch between programs)."""

    def __init__(self):
        from fusec.torch import program
        self.program = program
        self.parts = []
        self.wall = 0.0
        self.calls = 0
        orig = self.orig = program.Part.forward
        prof = self

        def forward(part, *args):
            t = time.perf_counter()
            try:
                return orig(part, *args)
            finally:
                prof.wall += time.perf_counter() - t
                prof.calls += 1
                if part not in prof.parts:
                    prof.parts.append(part)
        program.Part.forward = forward

    def programs(self):
        out = []
        for p in self.parts:
            for prog in ([p.symbolic] if p.symbolic else []) + \
                    [q for q in p.programs.values() if q]:
                if prog not in out:
                    out.append(prog)
        return out

    def reset(self):
        self.wall, self.calls = 0.0, 0
        for prog in self.programs():
            prog.profile(reset=True)

    def report(self, steps, step_s):
        lib = {"kernel": 0.0, "matmul": 0.0, "copy": 0.0, "other": 0.0}
        kinds = {}  # kernel seconds by region kind (attention, reduction...)
        flops, runs, top = 0, 0, []
        for prog in self.programs():
            pr = prog.profile()
            runs += pr["runs"]
            for r in pr["steps"]:
                lib[r["kind"] if r["kind"] in lib else "other"] += r["s"]
                if r["kind"] == "kernel":
                    k = r["what"].split(" ")[0]
                    kinds[k] = kinds.get(k, 0.0) + r["s"]
                flops += r.get("flop", 0)
                top.append((r["s"], prog.name, r))
        inside = sum(lib.values())
        top.sort(key=lambda x: -x[0])
        per = 1.0 / steps
        import fusec
        return {
            "step_s": step_s,
            "blas": fusec.cpu_blas(),
            "program_calls_per_step": self.calls * per,
            "library_s": inside * per,
            "library_kernel_s": lib["kernel"] * per,
            "library_matmul_s": lib["matmul"] * per,
            "library_copy_s": lib["copy"] * per,
            "library_kernel_by_kind_s": {k: v * per for k, v in
                                         sorted(kinds.items())},
            "matmul_gflops": flops / lib["matmul"] / 1e9 if lib["matmul"]
            else None,
            "matmul_share_of_step": lib["matmul"] * per / step_s,
            "python_call_overhead_s": (self.wall - inside) * per,
            "outside_programs_s": step_s - self.wall * per,
            "top_steps": [{"program": n, "region": r["region"],
                           "kind": r["kind"], "what": r["what"],
                           "s_per_step": s * per}
                          for s, n, r in top[:12]],
        }


def worker_steady(a):
    """One size at one thread count: the three ways, interleaved."""
    import torch
    if a["profile"]:
        os.environ["FUSEC_PROFILE"] = "1"
    threads = a["threads"] or torch.get_num_threads()
    torch.set_num_threads(threads)
    cfg = config(a["hidden"], a["layers"], a["vocab"])
    ids = data(a["vocab"], a["batch"], a["seq"])
    ways = {}
    first = {}
    for w in a["ways"]:
        model, run, opt = build(cfg, w, threads, dtype=a.get("dtype", "f32"))
        t = time.perf_counter()
        for _ in range(a["warmup"]):
            step(run, opt, ids)
        first[w] = time.perf_counter() - t
        ways[w] = (model, run, opt)
    times = {w: ([], [], [], []) for w in ways}
    order = list(ways)
    for i in range(a["iters"]):
        for w in order[i % len(order):] + order[:i % len(order)]:
            cpu = []
            fb, st, _ = step(ways[w][1], ways[w][2], ids, cpu)
            for k, x in enumerate((fb, st) + tuple(cpu)):
                times[w][k].append(x)
    row = {"dtype": a.get("dtype", "f32"),
           "hidden": a["hidden"], "layers": a["layers"], "batch": a["batch"],
           "seq": a["seq"], "vocab": a["vocab"], "threads": threads,
           "params": sum(p.numel() for p in ways[order[0]][0].parameters())}
    for w in ways:
        row[w] = {"step_s": statistics.median(times[w][1]),
                  "fwd_bwd_s": statistics.median(times[w][0]),
                  "step_cpu_s": statistics.median(times[w][3]),
                  "fwd_bwd_cpu_s": statistics.median(times[w][2]),
                  "warmup_s": first[w],
                  "steps_s": [round(x, 5) for x in times[w][1]]}
    if "fusec" in ways:
        f = row["fusec"]
        for w in ("eager", "inductor"):
            if w in ways:
                row["%s/fusec" % w] = row[w]["step_s"] / f["step_s"]
                row["%s/fusec fwd_bwd" % w] = \
                    row[w]["fwd_bwd_s"] / f["fwd_bwd_s"]
                row["%s/fusec cpu" % w] = \
                    row[w]["step_cpu_s"] / f["step_cpu_s"]
    if a["profile"] and "fusec" in ways:
        prof = Profile()
        _, run, opt = ways["fusec"]
        step(run, opt, ids)  # the parts seen by the wrapper
        prof.reset()
        n, tot = max(3, a["iters"] // 2), 0.0
        for _ in range(n):
            tot += step(run, opt, ids)[1]
        row["fusec_profile"] = prof.report(n, tot / n)
    return row


def worker_first(backend, size, cache):
    import torch
    import fusec.torch as ft
    if size == "tiny":
        cfg = config(64, 2, 128)
        cfg.intermediate_size = 128
        cfg.num_attention_heads, cfg.num_key_value_heads = 4, 2
    else:
        cfg = config(1024, 4, 32000)
    import transformers as tr
    torch.manual_seed(0)
    model = tr.LlamaForCausalLM(cfg).train()
    ids = data(cfg.vocab_size, 2, 64)
    if backend == "fusec":
        run = torch.compile(model, backend=ft.backend,
                            options={"cache_dir": cache})
    else:
        run = torch.compile(model, backend="inductor")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    _, sec, _ = step(run, opt, ids)
    _, again, _ = step(run, opt, ids)
    return {"seconds": sec, "second_step_s": again}


def child(args, env=None):
    out = subprocess.run([sys.executable, __file__] + args, env=env,
                         capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.stderr.write(out.stderr[-3000:])
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}


def run_steady(a, save):
    rows = []
    for hidden in a.hidden:
        for layers in a.layers:
            for seq in a.seq:
                for threads in a.threads:
                    job = {"hidden": hidden, "layers": layers, "seq": seq,
                           "batch": a.batch, "vocab": a.vocab,
                           "threads": threads, "ways": a.ways,
                           "dtype": a.dtype,
                           "warmup": a.warmup, "iters": a.iters,
                           "profile": a.profile}
                    load = os.getloadavg()[0]
                    row = child(["_steady", json.dumps(job)])
                    row.setdefault("hidden", hidden)
                    row["loadavg_1m_before"] = load
                    rows.append(row)
                    show_steady(row)
                    save(rows)
    return rows


def show_steady(r):
    if "error" in r:
        print("hidden %s: %s" % (r.get("hidden"), r["error"]), flush=True)
        return
    line = "%s h=%-4d L=%d T=%-3d thr=%d" % (r.get("dtype", "f32"), r["hidden"],
                                             r["layers"], r["seq"], r["threads"])
    for w in WAYS:
        if w in r:
            line += "  %s %.1f ms" % (w, 1e3 * r[w]["step_s"])
    for k in ("eager/fusec", "inductor/fusec"):
        if k in r:
            line += "  %s %.2fx" % (k, r[k])
    if "inductor/fusec cpu" in r:
        line += " (CPU time %.2fx)" % r["inductor/fusec cpu"]
    line += "  (load %.1f)" % r["loadavg_1m_before"]
    print(line, flush=True)
    p = r.get("fusec_profile")
    if p:
        print("   fusec: library %.1f ms (matmul %.1f ms at %s GFLOP/s on %s, "
              "kernels %.1f, copies %.1f), Python calls +%.1f ms over %d "
              "calls, outside programs %.1f ms" % (
                  1e3 * p["library_s"], 1e3 * p["library_matmul_s"],
                  "%.0f" % p["matmul_gflops"] if p["matmul_gflops"] else "-",
                  p.get("blas"), 1e3 * p["library_kernel_s"], 1e3 * p["library_copy_s"],
                  1e3 * p["python_call_overhead_s"],
                  p["program_calls_per_step"],
                  1e3 * p["outside_programs_s"]), flush=True)
        print("   fusec kernels by region kind: %s" % ", ".join(
            "%s %.1f ms" % (k, 1e3 * v) for k, v in sorted(
                p["library_kernel_by_kind_s"].items(), key=lambda x: -x[1])),
            flush=True)
        for t in p["top_steps"][:6]:
            print("     %6.2f ms  %s region %d %s %s" % (
                1e3 * t["s_per_step"], t["program"], t["region"], t["kind"],
                t["what"]), flush=True)


def run_first(a, save):
    rows = []
    for size in a.sizes:
        for backend in a.backends:
            cache = tempfile.mkdtemp(prefix="step-bench-%s-" % backend)
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            for temp in ("cold", "warm"):
                load = os.getloadavg()[0]
                r = child(["_first", backend, size, cache], env)
                r.update(size=size, backend=backend, cache=temp,
                         loadavg_1m_before=load)
                rows.append(r)
                print(json.dumps(r), flush=True)
                save(rows)
    return rows


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_steady":
        print(json.dumps(worker_steady(json.loads(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_first":
        print(json.dumps(worker_first(*sys.argv[2:5])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("steady", "first"))

    def ints(s):
        return [int(x) for x in s.split(",") if x]
    ap.add_argument("--hidden", type=ints, default=[64, 256, 1024])
    ap.add_argument("--layers", type=ints, default=[2, 4])
    ap.add_argument("--seq", type=ints, default=[128, 512])
    ap.add_argument("--threads", type=ints, default=[1, 0],
                    help="0: PyTorch's default count")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"),
                    help="the model's parameters and activations")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--ways", default="eager,fusec,inductor")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sizes", default="tiny,1024")
    ap.add_argument("--backends", default="fusec,inductor")
    ap.add_argument("--json", default="")
    ap.add_argument("--label", default="",
                    help="what this run measures (kept in the JSON), e.g. "
                    "the build FUSEC_LIBRARY names")
    a = ap.parse_args()
    a.ways = [w for w in a.ways.split(",") if w]
    a.sizes = [s for s in a.sizes.split(",") if s]
    a.backends = [b for b in a.backends.split(",") if b]
    load0 = os.getloadavg()
    import torch
    try:  # at the start: what the run measures
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short",
                                 "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    rec = {"what": a.what, "argv": sys.argv[1:], "torch": torch.__version__,
           "commit": commit, "label": a.label,
           "fusec_library": os.environ.get("FUSEC_LIBRARY", ""),
           "cpus": os.cpu_count(), "default_threads": torch.get_num_threads(),
           "machine": platform.processor() or platform.machine(),
           "loadavg_before": load0, "loadavg_after": None,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "rows": []}
    out = a.json or os.path.join(
        HERE, "results", "step_bench-%s-%s.json" % (
            platform.node().split(".")[0] or "host",
            time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    old = []
    if os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    def save(rows):
        """the record so far (written after every row: a long run cut
        short keeps what it measured)"""
        rec.update(rows=rows, loadavg_after=os.getloadavg())
        with open(out + ".tmp", "w") as f:
            json.dump(old + [rec], f, indent=1)
        os.replace(out + ".tmp", out)
    rows = run_steady(a, save) if a.what == "steady" else run_first(a, save)
    save(rows)
    print("load average before %s, after %s; written to %s" % (
        "/".join("%.1f" % x for x in load0),
        "/".join("%.1f" % x for x in rec["loadavg_after"]), out))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
