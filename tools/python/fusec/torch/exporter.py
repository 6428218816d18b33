"""fusec.torch.exporter: export PyTorch code to the fusec trace format.

    text = fusec.torch.export(fn, *example_args, symbolic=None, fake=False)

How it works. `fn` is traced with PyTorch's make_fx under the core ATen
decomposition table, which lowers almost every op, forward and backward, to a
small set of "core ATen" ops. Autograd runs during tracing, so an `fn` that
calls torch.autograd.grad comes out as one graph holding forward and backward;
torch.utils.checkpoint recomputes its forward inside the backward, and the
recomputation is traced where it runs. Tracing runs under PyTorch's
functionalization (FunctionalTensorMode, below autograd, as aot_autograd
does), so the graph is SSA: an in-place op becomes its functional form, and
one on a view also rebuilds the view's base (`s /= 4` on a matmul's view is
a div; `y[..., 1:] = x[..., :-1]` a slice_scatter, written as cat; a masked
fill a where). The graph is then walked once, in order, and every node is
written as one or a few fusec statements.

    def f(x, w):                      trace f(x: f32[4, 8], w: f32[16, 8]) {
        return torch.relu(x @ w.t())    permute = permute(w, dims=[1, 0])
                                        mm = matmul(x, permute)
                                        relu = maximum(mm, 0)
                                        return relu
                                      }

The rules the writer keeps (DESIGN.md, "The trace format"):
  - fusec needs operand dtypes to match exactly; PyTorch promotes. Every
    elementwise op casts its tensor operands to the dtype PyTorch computed
    (read from the node's metadata), so the promotion is explicit.
  - PyTorch views (view, expand, permute, slice, select, squeeze, alias,
    as_strided) carry strides; fusec values are plain arrays. A view becomes
    the meta op with the same values (reshape, broadcast_in_dim, permute,
    slice, ...). as_strided is analysed: a non-overlapping window of a dense
    input is rebuilt from reshape/slice/permute/broadcast; an overlapping one
    (or one that reads outside its input) is refused with the reason.
  - Literals cannot spell inf or nan; those become reciprocal(full(0)).
  - cumsum, topk, argmax/argmin and max.dim's indices are fusec's cumsum,
    topk, argmax and argmin (bool operands through u8); a negative index of
    x[idx] counts from the end, as in torch.
  - A branch on a tensor's value (.item(), if t.all():) cannot be recorded:
    ExportError with the model line.
  - An op with no mapping is not guessed at: export collects every unmapped
    op with the model line it came from and raises ExportError listing them.

Numerics. A trace computes what eager PyTorch computes on the CPU, rounding
where its kernels round, so f16/bf16 results agree with PyTorch's to the
last bit but for rare ties (measured per op and on whole models in
tests/python). Where PyTorch runs a fused kernel in f32 ("opmath") and
rounds once, the trace casts to f32 around the decomposed body and back:
  - native_layer_norm and its backward: f32 throughout, y rounded once;
    mean and rstd rounded to their dtype, and the backward reads those.
    dgamma and dbeta: the kernel sums the rows in per-thread f16/bf16
    buffers; by default the trace sums in f32 instead (machine-independent
    and more accurate), and export(cpu_threads=N) reproduces the kernel's
    order for N threads, for bit-for-bit comparisons with eager PyTorch.
  - log_softmax: f32, but the row sum and its log rounded to the dtype.
  - scaled_dot_product_attention: the attention primitive where it maps
    (fusec.torch.attention says which forms do), forward and backward,
    which computes in f32 with an online softmax and rounds o, dq, dk, dv
    once: bf16 results differ from PyTorch's CPU flash kernel by a few
    roundings (tests/python/test_sdpa.py argues the tolerance); other
    forms, and export(attention="math"), as the CPU flash kernel
    (_FlashCPU).
  - x * c and x / c for a Python number c that the dtype cannot hold: in
    f32 (add and sub round c to the dtype first, as the trace literal does).
  - x ** 3 is x * x * x, rounding each product.
  - embedding_dense_backward: rows added in index order into an f16/bf16
    gradient, rounding after each (up to 64 indices; then in f32).
Known differences: nll_loss on f16/bf16 input (the kernel sums the losses in
a bf16 cascade; the trace in f32), embedding with scale_grad_by_freq in
f16/bf16, and attention beyond a few dozen keys (the kernel's blocked online
softmax and vectorized exp round differently: ~1e-3 relative at 300 keys).

Tensors among example_args (at any depth of lists, tuples and dicts) become
the trace's parameters, in flattening order, named after where they sit (a
dict key such as "model.layers.0.mlp.up_proj.weight" gives
model_layers_0_mlp_up_proj_weight). Non-tensor arguments are baked in.

symbolic names extents to write as symbols: {param: {dim: "NAME"}} where
param is a parameter's index or name (or the example tensor itself), e.g.
symbolic={"input_ids": {0: "B", 1: "T"}}. The function is traced a second
time (with fake tensors) at other sizes for those dims; extents that move
with a symbol are written with its name, a product (B*T) or a sum of
products (T+1, B*T-B: fitted to the two traces, confirmed on a third),
and anything that cannot be written that way (a slice starting at T-1 of
a computed tensor) is an ExportError.

Module state that fn reads without being given it is never frozen: see
export(closure=). transformers' mixture-of-experts layers are traced in
their batched_mm form (see _BatchedExperts).

fake=True traces with fake tensors: no memory is allocated for the example
arguments or any intermediate, so a full-size model exports on a laptop.
Example arguments may then be meta or fake tensors (build the model under
`torch.device("meta")`). Tensor constants created inside fn must then be
passed as arguments (they have no values).

This module holds the tracing (make_fx under the decompositions, in
functionalization), export() itself, the trace's head and return line
(_write) and the statistics of export(stats=). The graph walk is
fusec.torch.writer, the op mappings fusec.torch.ops, symbolic extents
fusec.torch.symbolic.
"""

import inspect
import re

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from .values import (ExportError, V, _BYTES, _DTYPES, _Unlocated, _concrete,
                     _fmt_list, _ident, _is_size, _numel, _unique, aten)
from .attention import _MathAttention
from .writer import Draws, _Writer
from .symbolic import _merge_symbolic, _other_sizes, _resolve_symbolic


def _locate(fn, example_args, msg):
    """Fills in "(no source line recorded)" in msg: runs fn once more, on
    fake tensors, noting the Python line that calls each op named in msg.
    (make_fx records lines only inside nn.Module.forward; ops run by the
    autograd engine have no Python line of their own.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    import traceback
    wanted = set(re.findall(r"^  (?:aten|prims)\.([A-Za-z0-9_]+)", msg, re.M))
    wanted |= set(re.findall(r"^  (?:aten|prims)\.([A-Za-z0-9_]+)\.", msg,
                             re.M))
    found = {}

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in wanted and name not in found:
                for fr in reversed(traceback.extract_stack()[:-1]):
                    if "/torch/" not in fr.filename and \
                            "/fusec/torch/" not in fr.filename:
                        found[name] = "%s:%d in %s: %s" % (
                            fr.filename, fr.lineno, fr.name,
                            (fr.line or "").strip())
                        break
            return func(*args, **(kwargs or {}))
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        flat, spec = pytree.tree_flatten(example_args)
        fl = []
        for x in flat:
            if isinstance(x, torch.Tensor):
                f = mode.from_tensor(x)
                fl.append(f)
            else:
                fl.append(x)
        args = pytree.tree_unflatten(fl, spec)
        with mode, Spy(), torch.enable_grad(), _MathAttention():
            fn(*args)
    except Exception:  # noqa: BLE001: best effort, for the message only
        pass
    out = []
    for line in msg.splitlines():
        m = re.match(r"^  (?:aten|prims)\.([A-Za-z0-9_]+)", line)
        if m and "(no source line recorded)" in line:
            src = found.get(m.group(1))
            line = line.replace("(no source line recorded)", src or
                                "(the backward pass: no Python line)")
        out.append(line)
    return "\n".join(out)


def _decompositions():
    from torch._decomp import core_aten_decompositions, get_decompositions
    table = dict(core_aten_decompositions())
    # Ops that core ATen keeps but fusec has no primitive for.
    table.update(get_decompositions([
        aten._log_softmax_backward_data, aten._softmax_backward_data,
        aten.embedding_dense_backward, aten.nll_loss_forward,
        aten.nll_loss_backward, aten.native_dropout_backward,
        aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward,
        aten.tanh_backward, aten.threshold_backward, aten.logsumexp,
        aten.addcmul, aten.addcdiv, aten.lerp,
        aten.masked_fill, aten.rsub, aten.baddbmm, aten.addmv, aten.tril,
        aten.triu, aten.glu, aten.mish, aten.softplus, aten.hardtanh,
        aten.elu, aten.leaky_relu, aten.linalg_vector_norm, aten.norm,
        aten.im2col, aten.roll, aten.repeat, aten.one_hot,
        aten.index_add, aten.slice_backward, aten.select_backward,
        # batch norm, training (with its running statistics as outputs)
        # and inference
        aten._native_batch_norm_legit_functional,
        aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit, aten.native_batch_norm,
    ]))
    # Kept whole: fusec maps these better than their decompositions.
    for op in (aten._softmax, aten._log_softmax,
               aten.native_layer_norm_backward,
               aten.embedding_dense_backward):
        for ov in op.overloads():
            table.pop(getattr(op, ov), None)
    return table


# ---- Export -----------------------------------------------------------------

def _path_name(path, fallback):
    parts = []
    for k in path:
        if hasattr(k, "key"):
            parts.append(str(k.key))
        elif hasattr(k, "idx"):
            parts.append(str(k.idx))
        elif hasattr(k, "name"):
            parts.append(str(k.name))
    return _ident("_".join(parts), fallback) if parts else fallback


def _arg_names(fn, n):
    try:
        sig = inspect.signature(fn)
        names = []
        for p in sig.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            elif p.kind == p.VAR_POSITIONAL:
                names += ["%s%d" % (p.name, i) for i in range(n)]
                break
        return names
    except (TypeError, ValueError):
        return []


def _trace(fn, example_args, fake, attention="primitive", random=False):
    flat, spec = pytree.tree_flatten(example_args)
    tpos = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    tensors = [flat[i] for i in tpos]

    def wrapper(*ts):
        from torch._subclasses.functional_tensor import (
            FunctionalTensor, FunctionalTensorMode)
        with FunctionalTensorMode():
            leaves = list(flat)
            for i, t in zip(tpos, ts):
                leaves[i] = FunctionalTensor.to_functional(t)
            args = pytree.tree_unflatten(leaves, spec)
            out = fn(*args)
            outs, _ = pytree.tree_flatten(out)
            for o in outs:
                if not isinstance(o, torch.Tensor):
                    raise ExportError("fn returned a %s; outputs must be "
                                      "tensors (a tensor or a tuple/list of "
                                      "them)" % type(o).__name__)
        res = []
        for o in outs:
            torch._sync(o)
            res.append(torch._from_functional_tensor(o.elem))
        return tuple(res)

    mode = "fake" if fake else "real"
    opts = {}
    try:
        if "record_stack_traces" in inspect.signature(make_fx).parameters:
            opts["record_stack_traces"] = True
    except (TypeError, ValueError):
        pass
    with torch.enable_grad(), _MathAttention(attention == "primitive",
                                             random):
        try:
            gm = make_fx(wrapper, decomposition_table=_decompositions(),
                         tracing_mode=mode, _allow_non_fake_inputs=fake,
                         **opts)(*tensors)
        except RuntimeError as e:
            if "_local_scalar_dense" not in str(e) and \
                    "data-dependent" not in str(e):
                raise
            raise ExportError(
                "cannot export %s: Python control flow depends on a "
                "tensor's value (.item(), bool(), if tensor:), which a trace "
                "cannot record; the branch is at %s" % (
                    getattr(fn, "__name__", "fn"), _user_frame(e))) from None
    gm.graph.eliminate_dead_code()
    return gm, flat, tpos


def _user_frame(e):
    """'file:line in func: source' of the innermost frame of e's traceback
    outside torch and fusec.torch: the model line that raised."""
    import traceback
    pick = None
    for fr in traceback.extract_tb(e.__traceback__):
        if "/torch/" not in fr.filename and \
                "/fusec/torch/" not in fr.filename:
            pick = fr
    if pick is None:
        return "(no source line recorded)"
    return "%s:%d in %s: %s" % (pick.filename, pick.lineno, pick.name,
                                (pick.line or "").strip())


# ---- Module state reached through a closure ---------------------------------
#
# make_fx turns a tensor that fn reads but was not given, such as the weight
# of a module in fn's closure, into a constant of the graph (get_attr).
# Written as literals, its values would be frozen into the trace: after an
# optimizer step the trace would compute with the old weights. So module
# state is never written as a literal: export raises an ExportError naming
# every such tensor, or, with closure="inputs", makes each a parameter of the
# trace after fn's own (the returned text's .closure_inputs are the tensors
# to pass there). State is a Parameter, a tensor that requires grad, or a
# parameter or buffer of a module fn reaches: its closure cells, its bound
# self, its defaults, the globals it names (and, one level down, functions
# and containers found there). Other constants (built inside fn) are
# literals.

def _reached(fn):
    """[(path, object)]: the modules and tensors fn reaches."""
    found = []
    seen = set()

    def visit(obj, path, depth):
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if isinstance(obj, (torch.nn.Module, torch.Tensor)):
            found.append((path, obj))
        elif isinstance(obj, dict):
            for k, v in list(obj.items())[:1000]:
                visit(v, "%s[%r]" % (path, k), depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj[:1000]):
                visit(v, "%s[%d]" % (path, i), depth + 1)
        elif inspect.isfunction(obj) or inspect.ismethod(obj):
            visit_fn(obj, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and \
                not inspect.ismodule(obj):
            # an object holding modules: a bound method's self
            for k, v in list(vars(obj).items())[:1000]:
                if not k.startswith("__"):
                    visit(v, "%s.%s" % (path, k) if path != "self" else k,
                          depth + 1)

    def visit_fn(f, depth):
        if isinstance(f, torch.nn.Module):
            visit(f, "self", depth)
            f = f.forward
        if inspect.ismethod(f):
            visit(f.__self__, "self", depth)
            f = f.__func__
        code = getattr(f, "__code__", None)
        if code is None:
            return
        for nm, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                visit(cell.cell_contents, nm, depth)
            except ValueError:  # an empty cell
                pass
        g = getattr(f, "__globals__", {})
        for nm in code.co_names:
            if nm in g and not inspect.ismodule(g[nm]):
                visit(g[nm], nm, depth)
        for i, d in enumerate(f.__defaults__ or ()):
            visit(d, "default%d" % i, depth)

    visit_fn(fn, 0)
    return found


def _closure_modules(fn):
    return [o for _, o in _reached(fn) if isinstance(o, torch.nn.Module)]


def _closure_state(fn):
    """{id(tensor): "where.it.is"} for the parameters and buffers of the
    modules fn reaches, and the tensors it holds directly."""
    found = {}
    for path, obj in _reached(fn):
        if isinstance(obj, torch.nn.Module):
            for n, t in obj.named_parameters():
                found.setdefault(id(t), "%s.%s" % (path, n))
            for n, t in obj.named_buffers():
                found.setdefault(id(t), "%s.%s" % (path, n))
        else:
            found.setdefault(id(obj), path)
    return found


def _state_nodes(gm, fn):
    """[(get_attr node, tensor, description)] of the graph's constants
    that are module state (see above)."""
    where = None
    out = []
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        t = getattr(gm, node.target, None)
        if not isinstance(t, torch.Tensor):
            continue
        if where is None:
            where = _closure_state(fn)
        if id(t) in where:
            kind = "a parameter" if isinstance(t, torch.nn.Parameter) else \
                "a buffer" if "." in where[id(t)] else "a tensor"
            out.append((node, t, "%s (%s %s%s)" % (
                where[id(t)], kind, _DTYPES.get(t.dtype, t.dtype),
                _fmt_list(list(t.shape)))))
        elif isinstance(t, torch.nn.Parameter) or t.requires_grad:
            out.append((node, t, "a tensor that requires grad (%s%s)" % (
                _DTYPES.get(t.dtype, t.dtype), _fmt_list(list(t.shape)))))
    return out


def _lift_state(gm, state):
    """Makes each state constant a placeholder after the last one."""
    g = gm.graph
    last = [n for n in g.nodes if n.op == "placeholder"][-1:]
    for node, t, _ in state:
        ctx = g.inserting_after(last[0]) if last else \
            g.inserting_before(next(iter(g.nodes)))
        with ctx:
            ph = g.placeholder("closure_%s" % node.target)
        ph.meta.update(node.meta)
        node.replace_all_uses_with(ph)
        g.erase_node(node)
        last = [ph]
    gm.recompile()


def _state_names(state, used):
    names = []
    for _, _, desc in state:
        base = _ident(desc.split(" (")[0], "state")
        names.append(_unique("state" if base.startswith("a_tensor") else
                             base, used))
    return names


# ---- Mixture-of-experts layers of transformers ------------------------------
#
# transformers runs an experts layer (Mixtral, Qwen2-MoE, ...) one of three
# ways: "grouped_mm" (its default: tokens sorted by expert, group sizes
# counted from the routing), "eager" (a loop over the experts that were hit,
# token lists from torch.where) or "batched_mm" (each token's k experts'
# weights gathered, one batched product, the k results summed). The first
# two shape the work by the routing's values, which a trace cannot record;
# the third is the same computation with static shapes, and its backward is
# index_add into the expert weights and the top-k scatter. So export traces
# experts layers as batched_mm, and puts the configs back afterwards.

def _moe_configs(fn, example_args):
    """The configs of transformers experts layers fn reaches."""
    roots, seen, cfgs = [], set(), {}
    for v in _closure_modules(fn):
        roots.append(v)
    for a in pytree.tree_flatten(example_args)[0]:
        if isinstance(a, torch.nn.Module):
            roots.append(a)
    for r in roots:
        for sub in r.modules():
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            cfg = getattr(sub, "config", None)
            if hasattr(sub, "_apply_gate") and cfg is not None and \
                    hasattr(cfg, "_experts_implementation"):
                cfgs[id(cfg)] = cfg
    return list(cfgs.values())


class _BatchedExperts:
    def __init__(self, fn, example_args):
        self.cfgs = _moe_configs(fn, example_args)
        self.saved = []

    def __enter__(self):
        for c in self.cfgs:
            self.saved.append((c, c._experts_implementation))
            if c._experts_implementation != "batched_mm":
                c._experts_implementation = "batched_mm"
        return self

    def __exit__(self, *exc):
        for c, impl in reversed(self.saved):
            if c._experts_implementation != impl:
                c._experts_implementation = impl
        return False


class ExportedTrace(str):
    """The trace text; with export(closure="inputs"), closure_inputs are
    the module state tensors (live: the current values) to pass after fn's
    own arguments, named closure_names in the trace. With
    export(random=True), seed names the trace's seed parameter, its last
    (None when fn draws nothing)."""
    closure_inputs = ()
    closure_names = ()
    seed = None


def export(fn, *example_args, symbolic=None, fake=False, name=None,
           stats=None, cpu_threads=None, closure="error",
           attention="primitive", random=False):
    """Traces fn(*example_args) and returns it as fusec trace text.

    fn         a function of tensors (or of lists/tuples/dicts of them)
               returning a tensor or a tuple/list of tensors; it may call
               torch.autograd.grad and use torch.utils.checkpoint
    symbolic   extents to write as symbols: {param: {dim: "NAME"}}, param
               being an index, a parameter name or the example tensor
    fake       trace with fake tensors (no memory for the data)
    name       the trace's name (default: fn's name)
    stats      a dict to fill with facts about the trace: "ops" ({op:
               count}), "op_count", "params", "param_bytes",
               "peak_bytes_trace_order" and "peak_bytes_views" (see
               _peak_bytes), "attention_math" ([(call, why)]: the
               scaled_dot_product_attention calls written as math)
    cpu_threads  f16/bf16 only: the thread count whose summation order
               to reproduce where a PyTorch CPU kernel accumulates
               per-thread partial sums in f16/bf16 (layer_norm's backward,
               for its weight and bias gradients), e.g.
               torch.get_num_threads() to compute bit for bit what eager
               PyTorch computes on this machine. The default, 0, sums in
               f32: a trace that does not depend on the exporting machine,
               more accurate and shorter. Symbolic exports always do so.

    closure    module state fn reads without being given it (a weight of
               a module in its closure): "error" (the default) raises an
               ExportError naming each tensor; "inputs" makes each a
               parameter of the trace after fn's own, and the returned
               text's .closure_inputs are the tensors to pass there (never
               frozen into the trace as literals)
    random     False (the default): random ops (dropout in training, rand,
               randn, bernoulli) are refused, since a trace cannot hold
               PyTorch's generator. True: they are written on fusec's
               Philox `uniform` of a seed parameter, a rank-0 i64 after
               every other (named in the text's .seed), which the caller
               draws anew for each run: the numbers are distributed as
               PyTorch's, not equal to them

    Raises ExportError naming every op that has no mapping, with the model
    line it came from, and every mapping that was refused, with the reason.
    """
    if closure not in ("error", "inputs"):
        raise ValueError("closure must be 'error' or 'inputs'")
    if attention not in ("primitive", "math"):
        raise ValueError("attention must be 'primitive' or 'math'")
    from .attention import _SINKS
    notes = []
    _SINKS.append(notes)
    try:
        with _BatchedExperts(fn, example_args):
            text = _export(fn, example_args, symbolic, fake, name, stats,
                           cpu_threads, closure, attention, random)
    finally:
        _SINKS.remove(notes)
    if stats is not None:
        stats["attention_math"] = notes
    return text


def _export(fn, example_args, symbolic, fake, name, stats, cpu_threads,
            closure, attention="primitive", random=False):
    gm, flat, tpos = _trace(fn, example_args, fake, attention, random)
    tensors = [flat[i] for i in tpos]
    names = _param_names(fn, example_args, tpos)
    state = _state_nodes(gm, fn)
    if state and closure == "error":
        raise ExportError(
            "%s reads module state it is not given: %s. A trace would "
            "freeze their current values. Pass them as arguments (e.g. "
            "torch.func.functional_call(model, params_and_buffers, args)), "
            "or export(..., closure=\"inputs\") to make them parameters of "
            "the trace, after fn's own (the text's .closure_inputs)" % (
                getattr(fn, "__name__", "fn"),
                ", ".join(d for _, _, d in state)))
    extra = []
    if state:
        _lift_state(gm, state)
        extra = [t for _, t, _ in state]
        names = names + _state_names(state, set(names))
        tensors = tensors + extra
    sym = _resolve_symbolic(symbolic, names, tensors)
    tname = _ident(name or getattr(fn, "__name__", "trace"), "trace")
    if tname == "lambda":
        tname = "trace"
    lit_dtypes = {}
    if cpu_threads is None:
        cpu_threads = 0
    if sym:  # the summation order depends on the row count: not symbolic
        cpu_threads = 0
    draws = Draws() if random else None
    try:
        text = _write(gm, tname, names, tensors, lit_dtypes, stats,
                      cpu_threads, draws=draws)
    except _Unlocated as e:
        raise ExportError(_locate(fn, example_args, e.args[0])) from None

    def result(text):
        r = ExportedTrace(text)
        r.closure_inputs = tuple(extra)
        r.closure_names = tuple(names[len(names) - len(extra):])
        r.seed = draws.seed if draws else None
        return r
    if not sym:
        return result(text)
    n_own = len(tensors) - len(extra)

    def trace_at(args_x, tensors_x):
        gm_x, _, _ = _trace(fn, args_x, True, attention, random)
        st = _state_nodes(gm_x, fn)
        if st:
            _lift_state(gm_x, st)
        return _write(gm_x, tname, names, list(tensors_x[:n_own]) +
                      [t for _, t, _ in st], cpu_threads=cpu_threads,
                      draws=Draws() if random else None)
    sizes_a, sizes_b, args_b, tensors_b = _other_sizes(
        example_args, flat, tpos, tensors[:n_own], sym)
    try:
        text_b = trace_at(args_b, tensors_b)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ExportError("symbolic: tracing at other sizes (%s) failed: %s"
                          % (sizes_b, e))

    def third():
        # an extent that is a sum (T+1, B*T-B) is fitted to the two
        # traces and confirmed on a third
        _, sizes_c, args_c, tensors_c = _other_sizes(
            example_args, flat, tpos, tensors[:n_own], sym, third=True)
        try:
            return trace_at(args_c, tensors_c), sizes_c
        except Exception:  # noqa: BLE001: then no sum is confirmed
            return None, None
    return result(_merge_symbolic(text, text_b, sizes_a, sizes_b,
                                  lit_dtypes, third))


def _param_names(fn, example_args, tpos):
    paths, _ = pytree.tree_flatten_with_path(example_args)
    argn = _arg_names(fn, len(example_args))
    names, used = [], set()
    for i in tpos:
        path = paths[i][0]
        top = path[0].idx if hasattr(path[0], "idx") else 0
        base = argn[top] if top < len(argn) else "arg%d" % top
        if len(path) > 1:
            nm = _path_name(path[1:], base)
        else:
            nm = _ident(base, "arg")
        names.append(_unique(nm, used))
    return names


_VIEWS = ("reshape", "permute", "broadcast_in_dim", "squeeze", "unsqueeze",
          "slice")


def _peak_bytes(stmts, outputs, views=False):
    """Peak of live bytes when the statements run in written order: a buffer
    lives from its statement to its last use; outputs live to the end;
    inputs are not counted. Every result is its own buffer, or, with
    views=True, meta ops (reshape, permute, broadcast, squeeze, unsqueeze,
    slice) are zero-copy views that keep their source's buffer alive."""
    root = {}
    for names, _, uses, op in stmts:
        if views and op in _VIEWS and uses:
            for n in names:
                root[n] = root.get(uses[0], uses[0])
    last = {}
    for i, (names, _, uses, _) in enumerate(stmts):
        for u in uses:
            last[root.get(u, u)] = i
    outs = set(root.get(o, o) for o in outputs)
    live = peak = 0
    frees = {}
    for i, (names, nbytes, uses, op) in enumerate(stmts):
        for n in names:
            if n in root:
                continue  # a view: no buffer of its own
            live += nbytes
            end = len(stmts) if n in outs else last.get(n, i)
            frees.setdefault(end, []).append(nbytes)
        peak = max(peak, live)
        live -= sum(frees.pop(i, []))
    return peak


def _write(gm, tname, names, tensors, lit_dtypes=None, stats=None,
           cpu_threads=0, sizes=None, draws=None):
    """gm as trace text; its placeholders are the parameters, named names,
    of tensors' dtypes and shapes. A placeholder that is a size (Dynamo's
    graphs) is no parameter: its value is looked up in sizes ({symbol:
    int}), as are symbolic extents. With draws (a writer.Draws), random
    ops are written on a seed parameter, the last, named in draws.seed
    when one was needed; without, they are refused."""
    w = _Writer(gm, names)
    w.cpu_threads = cpu_threads
    w.sizes = sizes or {}
    w.random = draws
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = []
    for j, (node, nm) in enumerate(zip(placeholders, names)):
        t = tensors[j]
        if _is_size(t):
            w.env[node] = _concrete(t, w.sizes)
            continue
        dt = _DTYPES.get(t.dtype)
        if dt is None:
            raise ExportError("parameter %s has dtype %s, which fusec lacks" %
                              (nm, t.dtype))
        w.used.add(nm)
        shape = w.shape_of(t)
        params.append("%s: %s%s" % (nm, dt, _fmt_list(shape)))
        w.env[node] = V(nm, dt, shape)
    out_node = w.run()
    problems = []
    if w.unmapped:
        seen = {}
        for op, line in w.unmapped:
            seen.setdefault(op, [])
            if line not in seen[op]:
                seen[op].append(line)
        problems.append("%d op(s) have no fusec mapping:\n" % len(seen) +
                        "\n".join("  %s  at %s" % (op, "; ".join(ls[:3]))
                                  for op, ls in seen.items()))
    if w.refused:
        problems.append("%d op(s) were refused:\n" % len(w.refused) +
                        "\n".join("  %s: %s  at %s" % r for r in w.refused))
    if problems:
        msg = "cannot export %s:\n" % tname + "\n".join(problems)
        if "(no source line recorded)" in msg:
            raise _Unlocated(msg)
        raise ExportError(msg)
    rets = []
    for o in pytree.tree_flatten(out_node.args[0])[0]:
        if o is None:
            raise ExportError("an output is None (a gradient of an unused "
                              "input?); return tensors only")
        v = w.env.get(o) if isinstance(o, torch.fx.Node) else None
        if v is None or v.name == "<empty>":
            raise ExportError("output %s cannot be written (%s)" %
                              (o, "empty tensor" if v else "not a tensor"))
        rets.append(v.name)
    if draws is not None and draws.seed is not None:
        params.append("%s: i64[]" % draws.seed)
    head = "trace %s(%s) {" % (tname, ", ".join(params))
    text = "\n".join([head] + w.lines + ["  return " + ", ".join(rets), "}",
                                         ""])
    if lit_dtypes is not None:
        lit_dtypes.update({k + 1: v for k, v in w.lit_dtype.items()})
    if stats is not None:
        stats["ops"] = op_counts(text)
        stats["op_count"] = sum(stats["ops"].values())
        stats["params"] = len(params)
        stats["param_bytes"] = sum(_numel(w.shape_of(t)) *
                                   _BYTES[_DTYPES[t.dtype]]
                                   for t in tensors if not _is_size(t))
        stats["peak_bytes_trace_order"] = _peak_bytes(w.stmts, set(rets))
        stats["peak_bytes_views"] = _peak_bytes(w.stmts, set(rets), True)
    return text


def op_counts(text):
    """{op: count} over the statements of trace text."""
    counts = {}
    for m in re.finditer(r"^\s*[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_]"
                         r"[A-Za-z0-9_]*)*\s*=\s*([A-Za-z_][A-Za-z0-9_]*)\(",
                         text, re.M):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts
