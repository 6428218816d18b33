"""fusec.torch.program: one graph of ATen ops run as fusec programs.

compile_graph(gm, kind, options) is what the backend hands AOTAutograd as
its forward, backward and inference compiler. It takes the claims
(fusec.torch.claims), cuts the graph into parts of claimed nodes with
torch.fx's CapabilityBasedPartitioner (which keeps the cut acyclic), and
replaces each part by a Part: a module that writes the part as trace text
(the exporter's _write), prepares it as a fusec.Program on the target and
runs it. The nodes between parts stay in the graph and run in PyTorch.

A part whose graph has Dynamo's symbolic sizes is written at the sizes of
its first call and at other sizes (a third binding confirms an extent that
is a sum), and the texts merged (fusec.torch.symbolic): one program with
symbolic extents serves every size. Where the merge cannot express a size (an affine T+1, until the
trace format can), the part gets one program per binding of its sizes.

A part whose trace draws random numbers (dropout's rand_like, ...) has one
more input, its seed: a rank-0 i64 each call draws from PyTorch's
generator (_draw_seed), so every call draws anew and none compiles.

The texts are kept on disk beside the kernels (<cache dir>/torch-export/),
keyed by the part's FX code, its placeholders' dtypes, shapes, strides and
symbolic sizes, the sizes it is written at, the target, torch's version
and the source of this package: a warm start (a new process, the same
model) reads the text instead of writing it again, which took 0.4-1.8 s
of a tiny Llama's first step here. A part with get_attr nodes (constants
whose values the code does not show) is never kept; a text read back is
parsed and verified as a written one is.

A part fusec cannot prepare or run (a verifier error, a run-time error)
runs in PyTorch from then on, with the reason in the report: the model
never fails where eager runs. Nothing here talks to Dynamo or AOTAutograd
(fusec.torch.backend does).
"""

import hashlib
import logging
import os

import torch

from .claims import claim, sizes_for_parts
from .exporter import _write
from .symbolic import _merge_symbolic
from .writer import Draws
from .values import _ident, _is_size

log = logging.getLogger("fusec.torch")

_MISSING = object()


class Counters(dict):
    """stats(): graphs, parts, programs, fallbacks, runs (kernel compiles
    are the library's count: backend.stats)."""

    KEYS = ("graphs", "parts", "programs", "fallback_nodes",
            "fallback_parts", "fallback_graphs", "runs", "export_hits")

    def __init__(self):
        super().__init__((k, 0) for k in self.KEYS)


COUNTERS = Counters()
REPORTS = []  # one dict per compiled graph, for explain()


def kernel_builds():
    """Kernels this process has compiled (fz_kernel_builds)."""
    from .. import _lib
    return _lib.load().fz_kernel_builds()


def _dims(v):
    """(dim or None, size) of a placeholder's value: a tensor's dims, or
    the size itself."""
    if isinstance(v, torch.Tensor):
        return list(enumerate(v.shape))
    return [(None, v)] if _is_size(v) else []


def _symbolic(e):
    return isinstance(e, torch.SymInt) and e.node.maybe_as_int() is None


def _symbols(vals):
    """[(arg index, dim or None, sympy symbol, (a, b))]: where each free
    symbol s of the placeholders' sizes can be read off the arguments of a
    call, from a size a*s + b (a plain s first)."""
    out, seen = [], set()
    for plain in (True, False):
        for i, v in enumerate(vals):
            for d, e in _dims(v):
                if not _symbolic(e):
                    continue
                expr = e.node.expr
                free = [s for s in expr.free_symbols if s not in seen]
                if plain and not expr.is_Symbol or len(free) != 1 or \
                        len(expr.free_symbols) != 1:
                    continue
                s = free[0]
                a, b = expr.diff(s), expr.subs(s, 0)
                if not (a.is_number and b.is_number) or a == 0:
                    continue  # not a*s + b
                seen.add(s)
                out.append((i, d, s, (int(a), int(b))))
    return out


def _hints(vals):
    """{symbol: the size Dynamo traced with} for the placeholders' sizes."""
    sizes = {}
    for v in vals:
        for _, e in _dims(v):
            if _symbolic(e):
                senv = e.node.shape_env  # (var_to_val before 2.15)
                env = getattr(senv, "backed_var_to_val", None) or \
                    senv.var_to_val
                for s in e.node.expr.free_symbols:
                    if s in env:
                        sizes[s] = int(env[s])
    return sizes


def _views_as_reshapes(gm):
    """Makes gm's views reshapes (True if there were any; the caller
    recompiles gm), so that it runs in PyTorch on the layouts
    the kernels give, not only the ones their meta functions said when the
    graph was traced: on the CPU, SDPA's backward (the flash kernel, heads
    of 16 and more) returns its gradients in another layout than its meta
    function says, and AOTAutograd's view of their transpose to (B, T,
    H * D) then fails ("view size is not compatible"). The graph is
    functional (nothing written in place), so a reshape that copies
    computes the same values."""
    view = torch.ops.aten.view.default
    changed = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is view:
            n.target = torch.ops.aten.reshape.default
            changed = True
    return changed


class Part(torch.nn.Module):
    """One part of claimed nodes: a fusec program, or its graph in PyTorch
    where fusec could not take it."""

    def __init__(self, sub, name, target, options):
        super().__init__()
        self.sub = sub
        self.name = name
        self.target = target
        self.options = options
        phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
        self.vals = [n.meta.get("val") for n in phs]
        self.names = [_ident(n.name, "arg") for n in phs]
        self.tensor_args = [i for i, v in enumerate(self.vals)
                            if isinstance(v, torch.Tensor)]
        self.binds = _symbols(self.vals)
        out = [n for n in sub.graph.nodes if n.op == "output"][0]
        self.tuple_out = isinstance(out.args[0], (tuple, list))
        self.nodes = sum(1 for n in sub.graph.nodes
                         if n.op == "call_function")
        self.symbolic = None   # the one program, when sizes are symbolic
        self.programs = {}     # binding of sizes -> Program, or None
        self.status = "not run"
        self.given_up = False  # fusec failed on it once: PyTorch from then
        self.seeded = False    # its trace draws random numbers: a seed is
        # its last input, drawn each call (_draw_seed)
        self.text = None

    def forward(self, *args):
        prog = self.symbolic
        if prog is None:
            key = tuple(int(args[i].shape[d]) if d is not None
                        else int(args[i]) for i, d, _, _ in self.binds)
            prog = self.programs.get(key, _MISSING)
            if prog is _MISSING:
                prog = self.programs[key] = self.prepare(key)
        if prog is None:
            return self.sub(*args)
        COUNTERS["runs"] += 1
        ins = [args[i] for i in self.tensor_args]
        if self.seeded:
            ins.append(_draw_seed(ins, self.target))
        try:
            out = prog(*ins)
        except Exception as e:  # noqa: BLE001: never fail where eager runs
            self.fall_back("run failed: %s" % e)
            return self.sub(*args)
        if self.tuple_out and not isinstance(out, tuple):
            return (out,)
        return out

    def fall_back(self, why):
        log.warning("fusec: part %s runs in PyTorch: %s", self.name, why)
        COUNTERS["fallback_parts"] += 1
        self.status = "PyTorch (%s)" % why
        self.symbolic = None
        self.programs = {k: None for k in self.programs}
        if not self.given_up and _views_as_reshapes(self.sub):
            self.sub.recompile()
        self.given_up = True

    def write(self, sizes, lit_dtypes=None):
        draws = Draws()
        text = _write(self.sub, self.name, self.names, self.vals,
                      lit_dtypes=lit_dtypes, sizes=sizes, draws=draws)
        self.seeded = draws.seed is not None
        return text

    def prepare(self, key):
        """The Program for the sizes read off a call's arguments (key, in
        self.binds' order), or None where fusec cannot take the part."""
        import fusec
        if self.given_up:
            return None
        sizes = {s: (k - b) // a for (_, _, s, (a, b)), k in
                 zip(self.binds, key)}
        try:
            text, symbolic = self.write_text(sizes)
            prog = fusec.Program(text, device=self.target,
                                 cache_dir=self.options.get("cache_dir"),
                                 threads=self.options.get("threads"))
        except Exception as e:  # noqa: BLE001
            self.fall_back("%s: %s" % (type(e).__name__,
                                       str(e).splitlines()[0] if str(e)
                                       else ""))
            return None
        COUNTERS["programs"] += 1
        self.text = text
        self.status = "fusec (%s%s)" % (self.target,
                                         ", symbolic" if symbolic else "")
        if symbolic:
            self.symbolic = prog
        return prog

    def write_text(self, sizes):
        """(text, symbolic?): with symbolic extents where the graph has
        symbolic sizes and the merge can write them, else at sizes; from
        the export cache when a process before wrote it."""
        path = _export_path(self, sizes)
        if path:
            try:
                with open(path) as f:
                    flags, text = f.read().split("\n", 1)
                flags = flags.split()
                COUNTERS["export_hits"] += 1
                # the seed input is the writer's to add: the flag says so
                self.seeded = "seeded" in flags
                return text, "symbolic" in flags
            except (OSError, ValueError):
                pass
        text, symbolic = self._write_text(sizes)
        if path:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = "%s.%d.tmp" % (path, os.getpid())
                with open(tmp, "w") as f:
                    f.write("%s%s\n%s" % ("symbolic" if symbolic else "fixed",
                                           " seeded" if self.seeded else "",
                                           text))
                os.replace(tmp, path)
            except OSError:
                pass
        return text, symbolic

    def _write_text(self, sizes):
        lit = {}
        text = self.write(sizes, lit)
        if not sizes:
            return text, False
        names = {s: "S%s" % str(s).lstrip("s").upper() for s in sizes}
        order = sorted(sizes.items(), key=lambda x: str(x[0]))
        # other sizes, distinct per symbol (as the exporter's), and a third
        # binding on which an extent that is a sum (T+1) is confirmed
        other = {s: v + 7 + 4 * k for k, (s, v) in enumerate(order)}
        third_sizes = {s: v + 19 + 6 * k for k, (s, v) in enumerate(order)}

        def named(sz):
            return {names[s]: v for s, v in sz.items()}

        def third():
            try:
                return self.write(third_sizes), named(third_sizes)
            except Exception:  # noqa: BLE001: then no sum is confirmed
                return None, None
        try:
            text_b = self.write(other)
            merged = _merge_symbolic(text, text_b, named(sizes), named(other),
                                     lit, third)
            import fusec
            fusec.check(merged)
            return merged, True
        except Exception as e:  # noqa: BLE001: ExportError, a verifier error
            log.info("fusec: part %s: one program per size (%s)",
                     self.name, str(e).splitlines()[0] if str(e) else e)
            return text, False


def _draw_seed(ins, target):
    """A seed for a part's random numbers, drawn from PyTorch's default
    generator of the tensors' device (so torch.manual_seed makes runs
    repeat, and each call draws anew): a rank-0 i64 over the whole
    range."""
    dev = ins[0].device if ins else \
        torch.device("cuda" if target == "cuda" else "cpu")
    return torch.randint(-2 ** 63, 2 ** 63 - 1, (), dtype=torch.int64,
                         device=dev)

_SOURCE = []


def _source_digest():
    """A digest of this package's source (the exporter's mapping of ops
    decides the text): a changed exporter never reads an old text."""
    if not _SOURCE:
        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(here)):
            if name.endswith(".py"):
                with open(os.path.join(here, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
        _SOURCE.append(h.hexdigest())
    return _SOURCE[0]


def _cache_root(options):
    d = options.get("cache_dir") or os.environ.get("FUSEC_CACHE_DIR")
    if not d:
        x = os.environ.get("XDG_CACHE_HOME", "")
        d = os.path.join(x, "fusec") if x.startswith("/") else \
            os.path.join(os.path.expanduser("~"), ".cache", "fusec")
    return d


def _export_path(part, sizes):
    """Where part's text at sizes is kept, or None where it cannot be
    (get_attr constants, no cache folder)."""
    if os.environ.get("FUSEC_EXPORT_CACHE", "1") == "0" or any(
            n.op == "get_attr" for n in part.sub.graph.nodes):
        return None
    h = hashlib.sha256()
    for v in part.vals:
        if isinstance(v, torch.Tensor):
            h.update(repr((str(v.dtype), [str(e) for e in v.shape],
                           [str(e) for e in v.stride()])).encode())
        else:
            h.update(repr(str(v)).encode())
    h.update(repr((part.sub.code, part.names, part.name, part.target,
                   sorted((str(k), v) for k, v in sizes.items()),
                   torch.__version__, _source_digest())).encode())
    try:
        return os.path.join(_cache_root(part.options), "torch-export",
                            h.hexdigest()[:40] + ".trace")
    except Exception:  # noqa: BLE001: no home: no cache
        return None


def _target(gm, options):
    """(fusec target, the tensors' device type) for a graph."""
    dev = None
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor):
            dev = v.device.type
            break
    dev = dev or "cpu"
    want = options.get("device", "auto")
    if want in ("auto", "cuda"):
        return ("cuda", "cuda") if dev == "cuda" else ("cpu", "cpu")
    return want, "cpu"  # cpu or emu: CUDA tensors are left to PyTorch


def compile_graph(gm, example_inputs, kind, options):
    """gm with its claimed parts run by fusec; the rest runs in PyTorch."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    target, devtype = _target(gm, options)
    vals = [n.meta.get("val") for n in gm.graph.nodes
            if n.op == "placeholder"]
    claims = claim(gm, devtype, _hints(vals))
    claimed = set(c.node for c in claims if c.claimed)
    claimed |= sizes_for_parts(gm, claimed)

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node.name in claimed

    part = CapabilityBasedPartitioner(gm, Support(),
                                      allows_single_node_partition=True)
    gid = len(REPORTS)
    fused = part.fuse_partitions(part.propose_partitions(),
                                 prefix="%s%d_part" % (kind, gid))
    parts = []
    for n in fused.graph.nodes:
        if n.op == "call_module" and n.target.startswith("%s%d_part" %
                                                         (kind, gid)):
            p = Part(getattr(fused, n.target), _ident(n.target), target,
                     options)
            setattr(fused, n.target, p)
            parts.append(p)
    fell = [c for c in claims if not c.claimed]
    if fell:  # nodes of the graph itself run in PyTorch
        _views_as_reshapes(fused)
    fused.recompile()
    COUNTERS["graphs"] += 1
    COUNTERS["parts"] += len(parts)
    COUNTERS["fallback_nodes"] += len(fell)
    REPORTS.append({"graph": gid, "kind": kind, "target": target,
                    "claims": claims, "parts": parts})
    log.info("fusec: %s graph %d: %d of %d nodes in %d fusec part(s) on %s; "
             "%d in PyTorch%s", kind, gid, len(claimed), len(claims),
             len(parts), target, len(fell),
             "".join("\n  %r" % c for c in fell))
    return fused
