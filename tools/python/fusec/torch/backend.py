"""fusec.torch.backend: the torch.compile backend.

    model = torch.compile(model, backend="fusec")           # after pip install
    model = torch.compile(model, backend=fusec.torch.backend,
                          options={"device": "emu", "threads": 4})

The shape of Inductor's compile_fx: a function of (GraphModule, example
inputs) from Dynamo that hands forward and backward compilers to
AOTAutograd (aot_module_simplified) with the core ATen decompositions (the
exporter's table) and PyTorch's min-cut rematerialization partitioner, so
the saved values are those PyTorch's own compilers save. Forward and
backward are separate fusec programs (fusec.torch.program); parameters and
buffers are graph inputs, never baked; loss.backward(), gradient
accumulation, optimizers, hooks and torch.no_grad() inference are
AOTAutograd's and behave as in eager.

options:
  device     "auto" (default: CPU tensors on the cpu target, CUDA tensors
             on the cuda target, on PyTorch's current stream with outputs
             from PyTorch's allocator), "cpu", or "emu" (CPU tensors
             through the GPU's kernels, emulated on the CPU)
  cache_dir  the kernel cache's folder (default: FUSEC_CACHE_DIR, ...)
  threads    cpu: threads a kernel may use (default: all)

scaled_dot_product_attention becomes the attention primitive, forward and
backward, where the call maps to it on the target (fusec.torch.attention).
explain() says per graph what ran in fusec and what fell back, and why
(and which attention calls stayed math);
stats() counts graphs, parts, programs, kernel compiles and fallbacks. The
same summary is logged at INFO on the "fusec.torch" logger.

Not here: which nodes fusec takes (fusec.torch.claims) and how a part is
written and run (fusec.torch.program).
"""

import functools
import logging

from .exporter import _decompositions
from .program import COUNTERS, REPORTS, compile_graph, kernel_builds

log = logging.getLogger("fusec.torch")
_OPTIONS = ("device", "cache_dir", "threads")
_DEVICES = ("auto", "cpu", "emu", "cuda")


def _check_options(options):
    options = dict(options or {})
    bad = sorted(set(options) - set(_OPTIONS))
    if bad:
        raise ValueError("fusec backend: unknown option(s) %s (known: %s)" %
                         (", ".join(bad), ", ".join(_OPTIONS)))
    dev = options.get("device", "auto")
    if dev not in _DEVICES:
        raise ValueError("fusec backend: device must be one of %s, not %r" %
                         (", ".join(_DEVICES), dev))
    return options


def backend(gm, example_inputs, options=None, **_):
    """The Dynamo backend (registered as "fusec"): gm with its forward,
    backward and inference graphs compiled by fusec through AOTAutograd."""
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import \
        min_cut_rematerialization_partition

    options = _check_options(options)
    _attention_as_math(gm, options)

    def compiler(kind):
        # Dynamo must not trace fusec's own Python: a compiled step that
        # calls loss.backward() reaches the backward compiler (AOTAutograd
        # compiles the backward at its first call) and the programs with
        # Dynamo's frame hook still set, and fusec's modules are not among
        # the files it skips as it skips torch's own
        return torch.compiler.disable(
            functools.partial(_compile, kind=kind, options=options),
            recursive=True)

    return aot_module_simplified(
        gm, example_inputs,
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=_backend_decompositions(),
        partition_fn=min_cut_rematerialization_partition)


def _backend_decompositions():
    """The exporter's table, and dropout as rand_like, compare and scale,
    as PyTorch's own compilers see it: rand_like is fusec's Philox uniform
    on a seed each call draws from PyTorch's generator (program.Part), and
    the mask is a forward output the backward reads, never drawn again."""
    from torch._decomp import get_decompositions
    from .values import aten
    table = dict(_decompositions())
    table.update(get_decompositions([aten.native_dropout]))
    # Never PyTorch's fused attention kernels as their math: their
    # backwards have no decomposition and run as PyTorch's kernels, which
    # read the forward's outputs (the log-sum-exp) in their own kernel's
    # form, not the decomposition's. A call that reached AOTAutograd as
    # such a kernel (SDPA inside a checkpointed region, before
    # _attention_as_math looked into those) got gradients 30 times off.
    for op in (aten._scaled_dot_product_flash_attention_for_cpu,
               aten._scaled_dot_product_flash_attention,
               aten._scaled_dot_product_efficient_attention,
               aten._scaled_dot_product_cudnn_attention):
        for ov in op.overloads():
            table.pop(getattr(op, ov), None)
    return table


def _attention_as_math(gm, options=None):
    """Dynamo's calls of scaled_dot_product_attention become
    fusec.torch.attention.sdpa, as the exporter's do: the attention
    primitive (forward and backward) where the call maps to it on the
    target, else its math, with the reason in explain(). (PyTorch's own
    lowering goes to a fused CPU kernel whose backward has no
    decomposition.)"""
    import torch
    want = (options or {}).get("device", "auto")
    sdpa_fns = (torch._C._nn.scaled_dot_product_attention,
                torch.nn.functional.scaled_dot_product_attention)
    # gm and the bodies of its higher-order ops (a checkpointed region's
    # tag_activation_checkpoint: HF's gradient_checkpointing_enable())
    target = _sdpa_target(want)
    for mod in gm.modules():
        if not isinstance(mod, torch.fx.GraphModule):
            continue
        hit = False
        for n in mod.graph.nodes:
            if n.op == "call_function" and n.target in sdpa_fns:
                n.target = target
                hit = True
        if hit:
            mod.recompile()


def _sdpa_target(want):
    """_sdpa_on for device option want, as a named function: FX writes a
    graph's code from its call targets' names (a functools.partial has
    none, and a body's recompile failed on it)."""
    def sdpa(q, *args, **kwargs):
        return _sdpa_on(want, q, *args, **kwargs)
    sdpa.__name__ = sdpa.__qualname__ = "fusec_sdpa_" + want
    return sdpa


def _sdpa_on(want, q, *args, **kwargs):
    from .attention import sdpa
    target = want if want in ("cpu", "emu") else (
        "cuda" if q.device.type == "cuda" else "cpu")
    return sdpa(q, *args, target=target, **kwargs)


def _compile(gm, example_inputs, kind, options):
    import torch
    from torch._functorch.aot_autograd import make_boxed_func
    try:
        fn = compile_graph(gm, example_inputs, kind, options)
    except Exception:  # noqa: BLE001: the whole graph in PyTorch, never
        # a failure where eager runs
        log.exception("fusec: %s graph runs in PyTorch: the backend failed "
                      "on it", kind)
        COUNTERS["fallback_graphs"] += 1
        fn = gm
    # run outside Dynamo too (see backend's compiler)
    return make_boxed_func(torch.compiler.disable(fn, recursive=True))


_BUILDS_AT_RESET = [0]


def stats(reset=False):
    """Counts since the start (or the last stats(reset=True)): graphs
    (compiled by AOTAutograd for the backend), parts (of them fusec took),
    programs (fusec programs prepared), kernel_compiles (kernels this
    process compiled, found in neither cache), fallback_nodes (nodes left
    to PyTorch), fallback_parts (parts fusec could not prepare or run),
    runs (program runs), export_hits (parts whose trace text was read
    from the export cache rather than written)."""
    out = dict(COUNTERS)
    builds = kernel_builds()
    out["kernel_compiles"] = builds - _BUILDS_AT_RESET[0]
    if reset:
        for k in COUNTERS:
            COUNTERS[k] = 0
        del REPORTS[:]
        from .attention import NOTES
        del NOTES[:]
        _BUILDS_AT_RESET[0] = builds
    return out


class Explanation:
    """What the backend did with each graph: str() prints it; .graphs has
    one dict per graph (kind, target, claims, parts)."""

    def __init__(self, graphs, attention=()):
        self.graphs = graphs
        self.attention = list(attention)  # [(call, why)]: calls of
        # scaled_dot_product_attention written as math, not the primitive

    @property
    def fallbacks(self):
        """[(graph, Claim)] for every node PyTorch ran."""
        return [(g["graph"], c) for g in self.graphs for c in g["claims"]
                if not c.claimed]

    def __str__(self):
        out = []
        for g in self.graphs:
            claims = g["claims"]
            n = sum(c.claimed for c in claims)
            out.append("graph %d (%s) on %s: %d of %d nodes in fusec, %d "
                       "part(s)" % (g["graph"], g["kind"], g["target"], n,
                                    len(claims), len(g["parts"])))
            for p in g["parts"]:
                out.append("  part %s: %d nodes, %s" % (p.name, p.nodes,
                                                         p.status))
            fell = [c for c in claims if not c.claimed]
            if fell:
                out.append("  in PyTorch:")
                out += ["    %r" % c for c in fell]
        if self.attention:
            out.append("scaled_dot_product_attention as its math, not the "
                       "attention primitive:")
            out += ["  %s: %s" % a for a in self.attention]
        return "\n".join(out) if out else "(no graph compiled)"

    __repr__ = __str__


def explain(fn=None, *args, options=None, **kwargs):
    """explain(): the graphs compiled so far. explain(fn, *args, **kwargs):
    compiles fn with the backend, calls it once on args and returns the
    graphs that call compiled (the forward; call .backward() on its result
    and explain() again for the backward)."""
    from .attention import NOTES
    if fn is None:
        return Explanation(list(REPORTS), NOTES)
    import torch
    start, nstart = len(REPORTS), len(NOTES)
    compiled = torch.compile(fn, backend=backend, options=options)
    compiled(*args, **kwargs)
    return Explanation(REPORTS[start:], NOTES[nstart:])
