"""fusec.torch: export PyTorch code to the fusec trace format.

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
  - scaled_dot_product_attention: as the CPU flash kernel (_FlashCPU).
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
with a symbol are written with its name (reshape may use one -1 for a
product of symbols), and anything that cannot be written that way is an
ExportError.

fake=True traces with fake tensors: no memory is allocated for the example
arguments or any intermediate, so a full-size model exports on a laptop.
Example arguments may then be meta or fake tensors (build the model under
`torch.device("meta")`). Tensor constants created inside fn must then be
passed as arguments (they have no values).
"""

import inspect
import math
import operator
import re

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

__all__ = ["export", "ExportError", "op_counts", "nccl_unique_id"]


def nccl_unique_id(group=None):
    """The NCCL unique id (128 bytes) every rank of `group` (a
    torch.distributed process group, default the world) agrees on: rank 0
    of the group makes it (fz_nccl_unique_id, libnccl.so.2 opened by the
    library) and broadcasts it over the group, so ranks that torchrun
    started on several machines can form fusec's NCCL communicator with no
    file and no NCCL_COMM_ID. Every rank of the group must call it.
    (The communicator itself needs a GPU; that part is untested.)"""
    import ctypes

    import torch.distributed as dist

    from . import FusecError, _lib
    lib = _lib.load()
    obj = [None]
    if dist.get_rank(group) == 0:
        buf = ctypes.create_string_buffer(128)
        err = ctypes.c_void_p()
        st = lib.fz_nccl_unique_id(buf, ctypes.byref(err))
        if st != 0:
            msg = _lib.take_string(lib, err.value)
            raise FusecError(msg or "fz_nccl_unique_id failed",
                             lib.fz_status_name(st).decode())
        obj[0] = buf.raw
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(obj, src=src, group=group)
    return obj[0]

aten = torch.ops.aten


class ExportError(RuntimeError):
    """fn cannot be written as a fusec trace; the message says why and
    where."""


_DTYPES = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32",
    torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
}
_TORCH_OF = {v: k for k, v in _DTYPES.items()}
_FLOATS = ("f64", "f32", "f16", "bf16")
_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4,
          "i8": 1, "u8": 1, "bool": 1}
_LOWP = ("f16", "bf16")
_CONST_LIMIT = 4096
# Never used as value names, so that no statement reads like `mul = mul(..)`
# and no name is a keyword or a dtype of the grammar.
_RESERVED = set("""
trace return world true false f64 f32 f16 bf16 i64 i32 i8 u8 bool
neg abs exp exp2 log log2 log1p expm1 sqrt rsqrt reciprocal sin cos tanh
sigmoid erf floor ceil round sign isfinite logical_not cast add sub mul div
pow maximum minimum fmod eq ne lt le gt ge logical_and logical_or where full
iota uniform broadcast_in_dim reshape permute slice squeeze unsqueeze cat sum
amax amin var_mean take take_along index_add matmul linear all_gather
reduce_scatter all_reduce wait relu silu gelu softmax log_softmax mean
layer_norm rms_norm transpose cross_entropy cumsum topk argmax argmin
""".split())  # elements of a tensor constant written inline


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
                            "/fusec/torch.py" not in fr.filename:
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
    ]))
    # Kept whole: fusec maps these better than their decompositions.
    for op in (aten._softmax, aten._log_softmax,
               aten.native_layer_norm_backward,
               aten.embedding_dense_backward):
        for ov in op.overloads():
            table.pop(getattr(op, ov), None)
    return table


# ---- Small helpers ----------------------------------------------------------

def _fmt_num(x):
    """A number literal in the trace grammar (no inf/nan: callers check)."""
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    s = repr(x)
    return s.replace("e+", "e")


def _fmt_list(xs):
    return "[" + ", ".join(str(x) for x in xs) + "]"


def _ident(s, fallback="v"):
    s = re.sub(r"[^A-Za-z0-9_]", "_", str(s)).strip("_")
    s = re.sub(r"_+", "_", s)
    if not s:
        s = fallback
    if s[0].isdigit():
        s = fallback + "_" + s
    return s


def _numel(shape):
    n = 1
    for e in shape:
        n *= e
    return n


def _contig_strides(shape):
    st, acc = [], 1
    for e in reversed(shape):
        st.append(acc)
        acc *= max(e, 1)
    return tuple(reversed(st))


def _bcast(*shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        e = 1
        for s in shapes:
            i = k - (rank - len(s))
            if i < 0:
                continue
            if s[i] != 1:
                if e != 1 and e != s[i]:
                    raise ExportError("shapes %s do not broadcast" %
                                      (shapes,))
                e = s[i]
        out.append(e)
    return tuple(out)


def _source_line(node):
    st = node.meta.get("stack_trace") if node is not None else None
    if not st:
        return "(no source line recorded)"
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', st)
    if not frames:
        return st.strip().splitlines()[-1]
    pick = frames[-1]
    for f in reversed(frames):
        if "/torch/" not in f[0] or "/fusec/" in f[0]:
            pick = f
            break
    return "%s:%s in %s: %s" % (pick[0], pick[1], pick[2], pick[3].strip())


def _val(node):
    v = node.meta.get("val") if hasattr(node, "meta") else None
    return v


class V:
    """A value written to the trace: its name, fusec dtype, and shape."""
    __slots__ = ("name", "dtype", "shape")

    def __init__(self, name, dtype, shape):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)

    @property
    def rank(self):
        return len(self.shape)

    def __repr__(self):
        return "V(%s: %s%s)" % (self.name, self.dtype, list(self.shape))


class _Unlocated(Exception):
    """An ExportError message some of whose ops still need a source line."""


class _Unmapped(Exception):
    pass


class _Refused(Exception):
    pass


# ---- The writer -------------------------------------------------------------

class _Writer:
    def __init__(self, gm, param_names):
        self.gm = gm
        self.lines = []
        self.env = {}
        self.used = set()
        self.param_names = param_names
        self.node = None
        self.unmapped = []
        self.refused = []
        self.specials = {}
        self.mutated = {}
        self.failed = set()
        self.transposed = {}  # name of a 2-D transpose -> its operand
        self.lit_dtype = {}   # statement index -> dtype of its literals
        self.stmts = []       # (names defined, bytes of each, operand names)
        self.cpu_threads = 0  # see export(cpu_threads=)

    # names and statements
    def fresh(self, hint):
        base = _ident(hint)
        if base in _RESERVED:
            base += "_v"
        name, k = base, 1
        while name in self.used:
            name = "%s_%d" % (base, k)
            k += 1
        self.used.add(name)
        return name

    def emit(self, op, args, attrs, dtype, shape, hint=None, nres=1):
        parts = []
        for a in args:
            if isinstance(a, V):
                if a.name == "<empty>":
                    raise _Refused("a zero-size tensor as an operand of %s"
                                   % op)
                parts.append(a.name)
            else:
                parts.append(a)
        for k, v in attrs:
            parts.append("%s=%s" % (k, v))
        hint = hint or (self.node.name if self.node is not None else op)
        names = [self.fresh(hint) for _ in range(nres)]
        if any(isinstance(a, str) for a in args):
            vs = [a for a in args if isinstance(a, V)]
            if op == "where":
                vs = vs[1:] or vs
            if vs:  # the literals' dtype, for _merge_symbolic
                self.lit_dtype[len(self.lines)] = vs[0].dtype
        self.lines.append("  %s = %s(%s)" % (", ".join(names), op,
                                               ", ".join(parts)))
        nbytes = _numel(shape) * _BYTES[dtype]
        self.stmts.append((names, nbytes, [a.name for a in args
                                           if isinstance(a, V)], op))
        if nres == 1:
            return V(names[0], dtype, shape)
        return [V(n, dtype, shape) for n in names]

    # metadata of the current node
    def out_meta(self, node=None):
        node = node or self.node
        v = _val(node)
        if isinstance(v, (list, tuple)):
            return [(_DTYPES.get(x.dtype), tuple(int(e) for e in x.shape))
                    if isinstance(x, torch.Tensor) else None for x in v]
        if not isinstance(v, torch.Tensor):
            raise ExportError("node %s has no tensor metadata" % node.name)
        if v.dtype not in _DTYPES:
            raise _Refused("dtype %s has no fusec dtype" % v.dtype)
        return _DTYPES[v.dtype], tuple(int(e) for e in v.shape)

    # ---- literals and special constants
    def literal(self, x, dtype):
        """A scalar operand: a literal, or a rank-0 value for inf/nan."""
        if isinstance(x, bool):
            x = int(x)
        if isinstance(x, float) and not math.isfinite(x):
            return self.special(x, dtype)
        if dtype not in _FLOATS and isinstance(x, float):
            if x != int(x):
                raise _Refused("fractional literal %r for %s" % (x, dtype))
            x = int(x)
        return _fmt_num(x)

    def special(self, x, dtype):
        if dtype not in _FLOATS:
            raise _Refused("%r has no %s value" % (x, dtype))
        key = ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"),
               dtype)
        if key in self.specials:
            return self.specials[key]
        zero = self.emit("full", [], [("shape", "[]"), ("value", "0"),
                                      ("dtype", dtype)], dtype, (),
                         hint="zero_" + dtype)
        inf = self.emit("reciprocal", [zero], [], dtype, (),
                        hint="inf_" + dtype)
        self.specials[("inf", dtype)] = inf
        if key[0] == "inf":
            return inf
        if key[0] == "-inf":
            v = self.emit("neg", [inf], [], dtype, (), hint="neginf_" + dtype)
        else:
            v = self.emit("sub", [inf, inf], [], dtype, (),
                          hint="nan_" + dtype)
        self.specials[key] = v
        return v

    def full(self, shape, value, dtype, hint=None):
        if isinstance(value, float) and not math.isfinite(value):
            s = self.special(value, dtype)
            if not shape:
                return s
            return self.broadcast(s, shape)
        if dtype == "bool":
            value = 1 if value else 0
        elif dtype not in _FLOATS:
            value = int(value)
        return self.emit("full", [], [("shape", self.shape_attr(shape)),
                                      ("value", _fmt_num(value)),
                                      ("dtype", dtype)],
                         dtype, shape, hint=hint)

    # ---- basic building blocks
    def cast(self, v, dtype):
        if not isinstance(v, V) or v.dtype == dtype:
            return v
        return self.emit("cast", [v], [("dtype", dtype)], dtype, v.shape,
                         hint=v.name + "_" + dtype)

    def shape_attr(self, shape, allow_infer=False):
        return _fmt_list(shape)

    def reshape(self, v, shape):
        shape = tuple(shape)
        if v.shape == shape:
            return v
        return self.emit("reshape", [v],
                         [("shape", self.shape_attr(shape, True))],
                         v.dtype, shape)

    def broadcast(self, v, shape):
        shape = tuple(shape)
        if v.shape == shape:
            return v
        off = len(shape) - v.rank
        if off < 0:
            raise _Refused("cannot broadcast %s to %s" % (v.shape, shape))
        for i, e in enumerate(v.shape):
            if e != 1 and e != shape[off + i]:
                raise _Refused("cannot broadcast %s to %s" % (v.shape, shape))
        return self.emit("broadcast_in_dim", [v],
                         [("shape", self.shape_attr(shape)),
                          ("dims", _fmt_list(range(off, len(shape))))],
                         v.dtype, shape)

    def permute(self, v, dims):
        dims = [d % v.rank for d in dims] if v.rank else []
        if dims == list(range(v.rank)):
            return v
        r = self.emit("permute", [v], [("dims", _fmt_list(dims))],
                      v.dtype, tuple(v.shape[d] for d in dims))
        if dims == [1, 0]:
            self.transposed[r.name] = v
        return r

    def slice(self, v, dim, start, end, step=1):
        n = v.shape[dim]
        if start == 0 and end == n and step == 1:
            return v
        if start >= end:
            raise _Refused("a slice of length zero")
        starts = [0] * v.rank
        ends = list(v.shape)
        steps = [1] * v.rank
        starts[dim], ends[dim], steps[dim] = start, end, step
        shape = list(v.shape)
        shape[dim] = (end - start + step - 1) // step
        attrs = [("start", _fmt_list(starts)), ("end", _fmt_list(ends))]
        if step != 1:
            attrs.append(("step", _fmt_list(steps)))
        return self.emit("slice", [v], attrs, v.dtype, tuple(shape))

    def squeeze(self, v, dims):
        dims = sorted(d % v.rank for d in dims if v.shape[d % v.rank] == 1)
        if not dims:
            return v
        shape = tuple(e for i, e in enumerate(v.shape) if i not in dims)
        return self.emit("squeeze", [v], [("dims", _fmt_list(dims))],
                         v.dtype, shape)

    def unsqueeze(self, v, dim):
        dim = dim % (v.rank + 1)
        shape = v.shape[:dim] + (1,) + v.shape[dim:]
        return self.emit("unsqueeze", [v], [("dim", str(dim))], v.dtype,
                         shape)

    def cat(self, vs, dim):
        vs = [v for v in vs if _numel(v.shape) > 0 or v.rank != 1 or
              len(vs) == 1]
        vs = [v for v in vs if _numel(v.shape) > 0] or vs[:1]
        if len(vs) == 1:
            return vs[0]
        dim = dim % vs[0].rank
        shape = list(vs[0].shape)
        shape[dim] = sum(v.shape[dim] for v in vs)
        return self.emit("cat", vs, [("dim", str(dim))], vs[0].dtype,
                         tuple(shape))

    def iota(self, n, dtype, hint=None):
        return self.emit("iota", [], [("length", str(n)),
                                      ("dtype", dtype)], dtype, (n,),
                         hint=hint)

    def ew(self, op, operands, dtype=None, out_dtype=None):
        """An elementwise op: tensor operands are cast to `dtype`, scalars
        become literals of it."""
        tens = [o for o in operands if isinstance(o, V)]
        if not tens:
            raise _Refused("an elementwise op on scalars only")
        if dtype is None:
            dtype = tens[0].dtype
        shape = _bcast(*[t.shape for t in tens])
        args = []
        for o in operands:
            if isinstance(o, V):
                args.append(self.cast(o, dtype))
            else:
                args.append(self.literal(o, dtype))
        if out_dtype is None:
            out_dtype = "bool" if op in _CMP else dtype
        return self.emit(op, args, [], out_dtype, shape)

    def reduce(self, op, v, dims, keepdim, dtype=None):
        dims = sorted(set(d % v.rank for d in dims)) if v.rank else []
        if not dims:
            return v
        shape = []
        for i, e in enumerate(v.shape):
            if i in dims:
                if keepdim:
                    shape.append(1)
            else:
                shape.append(e)
        return self.emit(op, [v], [("dims", _fmt_list(dims)),
                                   ("keepdim", "true" if keepdim else
                                    "false")],
                         v.dtype, tuple(shape))

    # ---- the walk
    def run(self):
        out_node = None
        for node in self.gm.graph.nodes:
            self.node = node
            try:
                if node.op == "placeholder":
                    continue  # bound by the caller
                if node.op == "output":
                    out_node = node
                    continue
                if node.op == "get_attr":
                    self.env[node] = self.constant(node)
                    continue
                if node.op != "call_function":
                    raise _Unmapped(node.op)
                if any(a in self.failed for a in node.all_input_nodes):
                    self.failed.add(node)  # reported at its cause
                    continue
                args = self.load(node.args)
                kwargs = self.load(node.kwargs)
                self.env[node] = self.dispatch(node, args, kwargs)
            except _Unmapped as e:
                self.failed.add(node)
                self.unmapped.append((str(e.args[0]), _source_line(node)))
            except _Refused as e:
                self.failed.add(node)
                self.refused.append((str(node.target), str(e.args[0]),
                                     _source_line(node)))
        return out_node

    def load(self, a):
        if isinstance(a, torch.fx.Node):
            if a not in self.env:
                raise _Refused("operand %s was not written (an earlier "
                               "error)" % a.name)
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.load(x) for x in a)
        if isinstance(a, dict):
            return {k: self.load(x) for k, x in a.items()}
        return a

    def constant(self, node):
        t = getattr(self.gm, node.target)
        if not isinstance(t, torch.Tensor):
            raise _Unmapped("get_attr of a %s" % type(t).__name__)
        from torch._subclasses.fake_tensor import is_fake
        dt = _DTYPES.get(t.dtype)
        if dt is None:
            raise _Refused("a constant of dtype %s" % t.dtype)
        shape = tuple(t.shape)
        if is_fake(t) or t.device.type == "meta":
            raise _Refused("a tensor constant created inside fn with fake "
                           "tensors has no values; pass it as an argument")
        if t.numel() == 0:
            return V("<empty>", dt, shape)
        flat = t.detach().reshape(-1).to("cpu")
        if t.numel() > _CONST_LIMIT:
            raise _Refused("a tensor constant of %d elements; pass it as an "
                           "argument" % t.numel())
        first = flat[0].item()
        if bool((flat == flat[0]).all()) or t.numel() == 1:
            return self.full(shape, first, dt, hint=node.name)
        vals = [x.item() for x in flat]
        pieces = [self.full((1,), x, dt, hint=node.name) for x in vals]
        return self.reshape(self.cat(pieces, 0), shape)

    def dispatch(self, node, args, kwargs):
        tgt = node.target
        if tgt is operator.getitem:
            seq, i = args
            if isinstance(seq, (list, tuple)):
                r = seq[i]
                if r is None:
                    raise _Refused("an output that fusec does not compute "
                                   "is used")
                return r
            raise _Unmapped("getitem on %s" % type(seq).__name__)
        if not isinstance(tgt, torch._ops.OpOverload):
            raise _Unmapped(getattr(tgt, "__name__", str(tgt)))
        packet = tgt.overloadpacket.__name__
        inplace = False
        if tgt.namespace == "prims":
            h = _PRIMS.get(packet)
            if h is None:
                raise _Unmapped("prims.%s" % packet)
            return h(self, node, args, kwargs)
        h = _HANDLERS.get(packet)
        if h is None and packet.endswith("_") and not packet.startswith("_"):
            h = _HANDLERS.get(packet[:-1])
            inplace = True
        if h is None:
            raise _Unmapped("aten.%s" % tgt.name().split("::", 1)[-1])
        r = h(self, node, args, kwargs)
        if inplace:
            self.rebind_mutated(node, r)
        return r

    def rebind_mutated(self, node, r):
        # x.op_(...) left in the graph (functionalization removes them; this
        # is the safety net): the new value replaces x for every later use.
        # Refused where x aliases other live tensors (a view or a base of
        # views), since their values would change too.
        base = node.args[0]
        if not isinstance(base, torch.fx.Node):
            raise _Refused("in-place op on a non-tensor")
        view_ops = ("view", "_unsafe_view", "expand", "permute", "slice",
                    "select", "squeeze", "unsqueeze", "alias", "as_strided",
                    "t", "transpose", "diagonal", "unfold", "split",
                    "split_with_sizes", "unbind", "narrow")
        def is_view(n):
            t = getattr(n, "target", None)
            return isinstance(t, torch._ops.OpOverload) and \
                t.overloadpacket.__name__ in view_ops
        if is_view(base) or any(is_view(u) for u in base.users
                                if u is not node):
            raise _Refused("in-place update of a tensor that shares memory "
                           "with a view; fusec values cannot alias")
        self.env[base] = r


# ---- Op handlers ------------------------------------------------------------

_CMP = ("eq", "ne", "lt", "le", "gt", "ge")
_HANDLERS = {}


def _h(*names):
    def deco(f):
        for n in names:
            _HANDLERS[n] = f
        return f
    return deco


def _probe(x):
    if isinstance(x, V):
        return torch.empty(() if x.rank == 0 else (1,),
                           dtype=_TORCH_OF[x.dtype])
    return x


def _promote(*xs):
    """The dtype PyTorch computes a, b, ... in (torch.result_type, with
    rank-0 tensors and Python scalars ranking below dimensioned tensors)."""
    acc = None
    for x in xs:
        p = _probe(x)
        if acc is None:
            acc = p
            continue
        rt = torch.result_type(acc, p)
        zero_dim = all(not isinstance(q, torch.Tensor) or q.dim() == 0
                       for q in (acc, p))
        acc = torch.empty(() if zero_dim else (1,), dtype=rt)
    if not isinstance(acc, torch.Tensor):
        raise _Refused("no tensor operand")
    return _DTYPES[acc.dtype]


_UNARY = {
    "neg": "neg", "abs": "abs", "exp": "exp", "exp2": "exp2", "log": "log",
    "log2": "log2", "log1p": "log1p", "expm1": "expm1", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "reciprocal": "reciprocal", "sin": "sin", "cos": "cos",
    "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf", "floor": "floor",
    "ceil": "ceil", "round": "round", "sign": "sign", "sgn": "sign",
}


@_h(*_UNARY)
def _unary(w, node, args, kwargs):
    name = node.target.overloadpacket.__name__.rstrip("_")
    dt, _ = w.out_meta()
    x = args[0]
    if name in ("floor", "ceil", "round") and dt not in _FLOATS:
        return x  # identity on integers
    if name == "round" and (len(args) > 1 or kwargs.get("decimals")):
        raise _Refused("round with decimals")
    return w.ew(_UNARY[name], [x], dt)


@_h("isfinite")
def _isfinite(w, node, args, kwargs):
    x = args[0]
    if x.dtype not in _FLOATS:
        return w.full(x.shape, 1, "bool")
    return w.ew("isfinite", [x], x.dtype)


@_h("isnan")
def _isnan(w, node, args, kwargs):
    x = args[0]
    if x.dtype not in _FLOATS:
        return w.full(x.shape, 0, "bool")
    return w.ew("ne", [x, x], x.dtype)


@_h("isinf")
def _isinf(w, node, args, kwargs):
    x = args[0]
    if x.dtype not in _FLOATS:
        return w.full(x.shape, 0, "bool")
    return w.ew("eq", [w.ew("abs", [x]), float("inf")], x.dtype)


def _binary_op(op):
    def f(w, node, args, kwargs):
        dt, shape = w.out_meta()
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if alpha != 1:
            b = w.ew("mul", [b, alpha], dt) if isinstance(b, V) else b * alpha
        if op in _CMP:
            return w.ew(op, [a, b], _promote(a, b))
        if op in ("mul", "div") and dt in _LOWP and \
                kwargs.get("rounding_mode") is None and \
                any(_inexact_in(x, dt) for x in (a, b)):
            # A Python number that f16/bf16 cannot hold: PyTorch's kernels
            # multiply and divide by it in f32 (their opmath), rounding
            # once. (add and sub round the number to the dtype first, as
            # the trace's literal does.)
            return w.cast(w.ew(op, [a, b], "f32"), dt)
        if op in ("div",):
            mode = kwargs.get("rounding_mode")
            cdt = _promote(a, b)
            if mode is None:
                return w.ew("div", [a, b], dt)
            # floor / trunc division: in f64 for integers, else in dtype
            wdt = cdt if cdt in _FLOATS else "f64"
            q = w.ew("div", [a, b], wdt)
            if mode == "floor":
                q = w.ew("floor", [q], wdt)
            else:
                q = w.ew("mul", [w.ew("sign", [q], wdt),
                                 w.ew("floor", [w.ew("abs", [q], wdt)],
                                      wdt)], wdt)
            return w.cast(q, dt)
        if op == "pow" and isinstance(a, V) and not isinstance(b, V) and \
                b == 3 and dt in _FLOATS:
            # PyTorch's CPU kernel for x ** 3: x * x * x, rounding after
            # each product
            a = w.cast(a, dt)
            return w.ew("mul", [w.ew("mul", [a, a]), a])
        if op == "pow":
            if dt not in _FLOATS:
                e = b
                if isinstance(e, int) and 0 <= e <= 8 and isinstance(a, V):
                    r = w.full(a.shape, 1, dt) if e == 0 else a
                    for _ in range(e - 1):
                        r = w.ew("mul", [r, a], dt)
                    return r
                raise _Refused("integer pow")
        if isinstance(a, V) and a.dtype == dt and not isinstance(b, V) and \
                not isinstance(b, bool) and \
                ((op in ("add", "sub") and b == 0) or
                 (op in ("mul", "div") and b == 1)) and a.shape == shape:
            return a  # x + 0, x * 1: nothing to write
        if op in ("maximum", "minimum") and dt == "bool":
            return w.ew("logical_or" if op == "maximum" else "logical_and",
                        [a, b], "bool")
        if op in ("add", "sub", "mul") and dt == "bool":
            if op == "mul":
                return w.ew("logical_and", [a, b], "bool")
            if op == "add":
                return w.ew("logical_or", [a, b], "bool")
            raise _Refused("subtraction of bool")
        return w.ew(op, [a, b], dt)
    return f


def _inexact_in(x, dt):
    """x is a Python number that dtype dt cannot hold exactly."""
    if isinstance(x, (V, bool)) or not isinstance(x, (int, float)):
        return False
    if not math.isfinite(x):
        return False
    return float(torch.tensor(x, dtype=_TORCH_OF[dt]).item()) != float(x)


for _n, _op in [("add", "add"), ("sub", "sub"), ("mul", "mul"),
                ("div", "div"), ("true_divide", "div"), ("pow", "pow"),
                ("maximum", "maximum"), ("minimum", "minimum"),
                ("max_other", "maximum"), ("fmod", "fmod"), ("eq", "eq"),
                ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"),
                ("ge", "ge"), ("multiply", "mul"), ("subtract", "sub")]:
    _HANDLERS[_n] = _binary_op(_op)


@_h("rsub")
def _rsub(w, node, args, kwargs):
    dt, _ = w.out_meta()
    a, b = args[0], args[1]
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    if alpha != 1:
        a = w.ew("mul", [a, alpha], dt)
    return w.ew("sub", [b, a], dt)


@_h("remainder")
def _remainder(w, node, args, kwargs):
    dt, _ = w.out_meta()
    a, b = args
    if dt not in _FLOATS:
        raise _Refused("integer remainder")
    q = w.ew("floor", [w.ew("div", [a, b], dt)], dt)
    return w.ew("sub", [a, w.ew("mul", [q, b], dt)], dt)


@_h("bitwise_and", "logical_and", "__and__")
def _and(w, node, args, kwargs):
    return _logical(w, "logical_and", args)


@_h("bitwise_or", "logical_or", "__or__")
def _or(w, node, args, kwargs):
    return _logical(w, "logical_or", args)


@_h("bitwise_xor", "logical_xor", "__xor__")
def _xor(w, node, args, kwargs):
    return _logical(w, "ne", args)


def _as_bool(w, x):
    if not isinstance(x, V):
        return bool(x)
    if x.dtype == "bool":
        return x
    return w.ew("ne", [x, 0], x.dtype)


@_h("bitwise_not", "logical_not")
def _not(w, node, args, kwargs):
    x = args[0]
    if node.target.overloadpacket.__name__.startswith("bitwise") and \
            x.dtype != "bool":
        raise _Refused("bitwise not of %s (only bool maps)" % x.dtype)
    return w.ew("logical_not", [_as_bool(w, x)], "bool")


def _logical(w, op, args):
    a, b = args[0], args[1]
    name = w.node.target.overloadpacket.__name__
    if not name.startswith("logical"):
        for x in (a, b):
            if isinstance(x, V) and x.dtype != "bool":
                raise _Refused("%s on %s (only bool maps to a logical op)" %
                               (name, x.dtype))
    a, b = _as_bool(w, a), _as_bool(w, b)
    if not isinstance(b, V):
        b, a = a, b
    if not isinstance(a, V):  # a python bool
        if op == "logical_and":
            return b if a else w.full(b.shape, 0, "bool")
        if op == "logical_or":
            return w.full(b.shape, 1, "bool") if a else b
        return w.ew("logical_not", [b], "bool") if a else b
    return w.ew(op, [a, b], "bool")


@_h("where")
def _where(w, node, args, kwargs):
    dt, shape = w.out_meta()
    if len(args) == 1:
        raise _Refused("where(cond) with one argument (data-dependent shape)")
    c, a, b = args
    c = _as_bool(w, c)
    if not isinstance(a, V) and not isinstance(b, V):
        a = w.full((), a, dt)
    a = w.cast(a, dt) if isinstance(a, V) else a
    b = w.cast(b, dt) if isinstance(b, V) else b
    args2 = [c, a if isinstance(a, V) else w.literal(a, dt),
             b if isinstance(b, V) else w.literal(b, dt)]
    return w.emit("where", args2, [], dt, shape)


@_h("masked_fill")
def _masked_fill(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, m, v = args
    if isinstance(v, V):
        v = w.cast(v, dt)
    else:
        v = w.literal(v, dt)
    return w.emit("where", [_as_bool(w, m), v, w.cast(x, dt)], [], dt, shape)


@_h("clamp", "clip", "clamp_min", "clamp_max")
def _clamp(w, node, args, kwargs):
    dt, _ = w.out_meta()
    name = node.target.overloadpacket.__name__.rstrip("_")
    x = w.cast(args[0], dt)
    lo = hi = None
    if name in ("clamp", "clip"):
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
    elif name == "clamp_min":
        lo = args[1]
    else:
        hi = args[1]
    if lo is not None:
        x = w.ew("maximum", [x, lo], dt)
    if hi is not None:
        x = w.ew("minimum", [x, hi], dt)
    return x


@_h("relu")
def _relu(w, node, args, kwargs):
    return w.ew("maximum", [args[0], 0])


def _in_f32(w, x, body):
    """Runs body(x) in f32 for f16/bf16 x (PyTorch's opmath), rounding once."""
    if x.dtype in _LOWP:
        return w.cast(body(w.cast(x, "f32")), x.dtype)
    return body(x)


@_h("silu")
def _silu(w, node, args, kwargs):
    return _in_f32(w, args[0], lambda x: w.ew("mul", [x, w.ew("sigmoid",
                                                                [x])]))


@_h("gelu")
def _gelu(w, node, args, kwargs):
    approx = kwargs.get("approximate", "none")
    if approx == "none":
        def body(x):
            e = w.ew("erf", [w.ew("mul", [x, 0.7071067811865476])])
            return w.ew("mul", [w.ew("mul", [x, 0.5]),
                                w.ew("add", [e, 1])])
    else:
        def body(x):
            x3 = w.ew("mul", [w.ew("mul", [x, x]), x])
            inner = w.ew("mul", [w.ew("add", [x, w.ew("mul",
                                                        [x3, 0.044715])]),
                                 0.7978845608028654])
            return w.ew("mul", [w.ew("mul", [x, 0.5]),
                                w.ew("add", [w.ew("tanh", [inner]), 1])])
    return _in_f32(w, args[0], body)


@_h("_to_copy", "to", "type_as", "_convert_element_type")
def _to_copy(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.cast(args[0], dt)


@_h("clone", "alias", "lift_fresh_copy", "lift_fresh", "detach", "contiguous",
    "alias_copy", "detach_copy", "_assert_tensor_metadata")
def _identity(w, node, args, kwargs):
    if node.target.overloadpacket.__name__ == "_assert_tensor_metadata":
        return None
    return args[0]


@_h("copy")
def _copy(w, node, args, kwargs):
    dt, shape = w.out_meta()
    src = args[1]
    return w.broadcast(w.cast(src, dt), shape)


@_h("fill")
def _fill(w, node, args, kwargs):
    dt, shape = w.out_meta()
    v = args[1]
    if isinstance(v, V):
        return w.broadcast(w.cast(v, dt), shape)
    return w.full(shape, v, dt)


@_h("zero")
def _zero(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.full(shape, 0, dt)


# ---- creation


@_h("full", "full_like", "new_full")
def _full(w, node, args, kwargs):
    dt, shape = w.out_meta()
    name = node.target.overloadpacket.__name__
    value = kwargs.get("fill_value", args[1] if len(args) > 1 else None)
    if name == "new_full":
        value = args[2] if len(args) > 2 else kwargs.get("fill_value")
    if isinstance(value, V):
        raise _Refused("a fill value that is a tensor")
    return w.full(shape, value, dt)


@_h("scalar_tensor")
def _scalar_tensor(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.full(shape, args[0], dt)


@_h("zeros", "zeros_like", "new_zeros", "empty", "empty_like", "new_empty",
    "empty_strided", "new_empty_strided", "empty_permuted")
def _zeros(w, node, args, kwargs):
    # empty: the values are unspecified; zeros are one choice of them.
    dt, shape = w.out_meta()
    return w.full(shape, 0, dt)


@_h("ones", "ones_like", "new_ones")
def _ones(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.full(shape, 1, dt)


@_h("arange")
def _arange(w, node, args, kwargs):
    dt, shape = w.out_meta()
    ov = node.target._overloadname
    nums = [a for a in args if not isinstance(a, V)]
    if ov == "default":
        start, step = 0, 1
    elif ov == "start":
        start, step = nums[0], 1
    else:
        start = nums[0]
        step = nums[2] if len(nums) > 2 else kwargs.get("step", 1)
    n = shape[0]
    r = w.iota(n, dt)
    if step != 1:
        r = w.ew("mul", [r, step], dt)
    if start != 0:
        r = w.ew("add", [r, start], dt)
    return r


@_h("rand", "rand_like", "randn", "randn_like", "bernoulli", "uniform",
    "normal", "native_dropout", "randint", "randint_like", "randperm",
    "multinomial", "exponential", "geometric", "cauchy", "log_normal")
def _random(w, node, args, kwargs):
    name = node.target.overloadpacket.__name__
    if name == "native_dropout":
        p, train = args[1], args[2]
        if not train or p == 0:
            x = args[0]
            return [x, w.full(x.shape, 1, "bool")]
    raise _Refused("random op %s: PyTorch's generator cannot be reproduced; "
                   "trace with dropout p=0 or in eval mode" % name)


# ---- meta ops


@_h("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias",
    "unflatten", "flatten")
def _view(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x = args[0]
    if node.target.overloadpacket.__name__ == "view" and len(args) > 1 and \
            isinstance(args[1], torch.dtype):
        raise _Refused("view as another dtype (a bit reinterpretation)")
    return w.reshape(x, shape)


@_h("expand", "expand_copy", "broadcast_to", "expand_as")
def _expand(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.broadcast(args[0], shape)


@_h("permute", "permute_copy")
def _permute(w, node, args, kwargs):
    return w.permute(args[0], list(args[1]))


@_h("t", "t_copy", "numpy_T")
def _t(w, node, args, kwargs):
    x = args[0]
    return w.permute(x, list(range(x.rank))[::-1])


@_h("transpose", "transpose_copy", "swapaxes", "swapdims")
def _transpose(w, node, args, kwargs):
    x, d0, d1 = args[0], args[1] % max(args[0].rank, 1), \
        args[2] % max(args[0].rank, 1)
    dims = list(range(x.rank))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return w.permute(x, dims)


def _norm_slice(n, start, end, step):
    start = 0 if start is None else start
    end = n if end is None else end
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end, step or 1


@_h("slice", "slice_copy", "narrow")
def _slice(w, node, args, kwargs):
    x = args[0]
    name = node.target.overloadpacket.__name__
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % x.rank
    if name == "narrow":
        s = args[2] % x.shape[dim] if args[2] < 0 else args[2]
        start, end, step = s, s + args[3], 1
    else:
        start = args[2] if len(args) > 2 else kwargs.get("start")
        end = args[3] if len(args) > 3 else kwargs.get("end")
        step = args[4] if len(args) > 4 else kwargs.get("step", 1)
        start, end, step = _norm_slice(x.shape[dim], start, end, step)
    if start >= end:
        dt, shape = w.out_meta()
        return V("<empty>", dt, shape)
    return w.slice(x, dim, start, end, step)


@_h("select", "select_copy")
def _select(w, node, args, kwargs):
    x, dim, i = args[0], args[1] % args[0].rank, args[2]
    if i < 0:
        i += x.shape[dim]
    return w.squeeze(w.slice(x, dim, i, i + 1), [dim])


@_h("squeeze", "squeeze_copy")
def _squeeze(w, node, args, kwargs):
    x = args[0]
    if len(args) == 1:
        dims = list(range(x.rank))
    elif isinstance(args[1], (list, tuple)):
        dims = list(args[1])
    else:
        dims = [args[1]]
    if x.rank == 0:
        return x
    return w.squeeze(x, dims)


@_h("unsqueeze", "unsqueeze_copy")
def _unsqueeze(w, node, args, kwargs):
    return w.unsqueeze(args[0], args[1])


@_h("cat", "concat", "concatenate")
def _cat(w, node, args, kwargs):
    dt, shape = w.out_meta()
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    vs = [w.cast(v, dt) if v.name != "<empty>" else v for v in args[0]]
    vs = [v for v in vs if v.name != "<empty>" and _numel(v.shape) > 0]
    if not vs:
        return V("<empty>", dt, shape)
    return w.cat(vs, dim % len(shape))


@_h("stack")
def _stack(w, node, args, kwargs):
    dt, shape = w.out_meta()
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % len(shape)
    return w.cat([w.unsqueeze(w.cast(v, dt), dim) for v in args[0]], dim)


@_h("split", "split_with_sizes", "unsafe_split", "split_with_sizes_copy",
    "chunk", "tensor_split")
def _split(w, node, args, kwargs):
    x = args[0]
    metas = w.out_meta()
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % x.rank
    outs, pos = [], 0
    for m in metas:
        n = m[1][dim]
        outs.append(w.slice(x, dim, pos, pos + n) if n else
                    V("<empty>", m[0], m[1]))
        pos += n
    return outs


@_h("unbind", "unbind_copy")
def _unbind(w, node, args, kwargs):
    x = args[0]
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % x.rank
    return [w.squeeze(w.slice(x, dim, i, i + 1), [dim])
            for i in range(x.shape[dim])]


@_h("flip")
def _flip(w, node, args, kwargs):
    x = args[0]
    for d in sorted(set(d % x.rank for d in args[1])):
        n = x.shape[d]
        if n == 1:
            continue
        rev = w.ew("sub", [n - 1, w.iota(n, "i64")], "i64")
        x = w.emit("take", [x, rev], [("dim", str(d))], x.dtype, x.shape)
    return x


@_h("constant_pad_nd")
def _pad(w, node, args, kwargs):
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    for k in range(len(pad) // 2):
        dim = x.rank - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        if lo < 0:
            x = w.slice(x, dim, -lo, x.shape[dim])
            lo = 0
        if hi < 0:
            x = w.slice(x, dim, 0, x.shape[dim] + hi)
            hi = 0
        parts = []
        if lo:
            s = list(x.shape)
            s[dim] = lo
            parts.append(w.full(tuple(s), value, x.dtype))
        parts.append(x)
        if hi:
            s = list(x.shape)
            s[dim] = hi
            parts.append(w.full(tuple(s), value, x.dtype))
        x = w.cat(parts, dim)
    return x


@_h("as_strided", "as_strided_copy")
def _as_strided(w, node, args, kwargs):
    x = args[0]
    size = list(args[1])
    stride = list(args[2])
    xin = _val(node.args[0])
    offset = args[3] if len(args) > 3 and args[3] is not None else \
        kwargs.get("storage_offset")
    if offset is None:
        offset = int(xin.storage_offset())
    return _strided_view(w, x, xin, size, stride, offset)


def _strided_view(w, x, xin, size, stride, offset):
    """as_strided(x, size, stride, offset) as meta ops, where possible."""
    xs = tuple(int(s) for s in xin.stride())
    xoff = int(xin.storage_offset())
    # 1. x's elements in memory order: x must be dense (a permutation of a
    #    contiguous tensor), so storage index i <-> flat index i - xoff.
    order = sorted(range(x.rank), key=lambda d: (-xs[d], d))
    expect = 1
    for d in reversed(order):
        if x.shape[d] != 1 and xs[d] != expect:
            raise _Refused("as_strided of a non-dense input (strides %s for "
                           "shape %s)" % (list(xs), list(x.shape)))
        expect *= x.shape[d]
    flat = w.reshape(w.permute(x, order), (_numel(x.shape),))
    rel = offset - xoff
    # 2. The window: drop extent-1 dims, broadcast stride-0 dims, then the
    #    rest must not overlap.
    keep = [d for d in range(len(size)) if size[d] != 1 and stride[d] != 0]
    n = _numel(x.shape)
    if _numel(size) == 0:
        raise _Refused("as_strided with an empty result")
    last = rel + sum((size[d] - 1) * stride[d] for d in keep)
    if rel < 0 or last >= n or any(stride[d] < 0 for d in keep):
        raise _Refused("as_strided reads memory outside its input "
                       "(elements %d..%d of %d)" % (rel, last, n))
    kd = sorted(keep, key=lambda d: -stride[d])
    for a, b in zip(kd, kd[1:]):
        if stride[a] < stride[b] * size[b]:
            raise _Refused("as_strided with overlapping windows (size %s, "
                           "stride %s): an element would appear twice, which "
                           "fusec values cannot express as a view" %
                           (size, stride))
    # 3. Build it: pad flat to rel + stride*size of the outermost dim, then
    #    peel dims outermost first: reshape to [..., n_k, s_k] and cut.
    cur = w.slice(flat, 0, rel, n) if rel else flat
    shape_now = []
    avail = n - rel
    outer_len = stride[kd[0]] * size[kd[0]] if kd else 1
    if outer_len > avail:
        pad = w.full((outer_len - avail,), 0, x.dtype)
        cur = w.cat([cur, pad], 0)
    elif outer_len < avail:
        cur = w.slice(cur, 0, 0, outer_len)
    for i, d in enumerate(kd):
        span = stride[d]
        # cur has shape shape_now + [size[d] * span]
        cur = w.reshape(cur, tuple(shape_now) + (size[d], span))
        shape_now.append(size[d])
        nxt = stride[kd[i + 1]] * size[kd[i + 1]] if i + 1 < len(kd) else 1
        if nxt != span:
            cur = w.slice(cur, len(shape_now), 0, nxt)
    cur = w.reshape(cur, tuple(shape_now))  # drop the trailing 1
    # cur's dims are kd order; permute to the original order of keep
    perm = [kd.index(d) for d in keep]
    cur = w.permute(cur, perm)
    # 3b. put back the extent-1 and broadcast dims
    full_shape = tuple(size[d] if d in keep else 1 for d in range(len(size)))
    cur = w.reshape(cur, full_shape)
    return w.broadcast(cur, tuple(size))


# ---- reductions


def _dims_arg(x, dims):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.rank))
    if isinstance(dims, int):
        return [dims]
    return list(dims)


@_h("sum")
def _sum(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x = args[0]
    dims = _dims_arg(x, args[1] if len(args) > 1 else kwargs.get("dim"))
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    x = w.cast(x, dt)
    if x.rank == 0:
        return x
    return w.reduce("sum", x, dims, keep)


@_h("mean")
def _mean(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x = args[0]
    dims = _dims_arg(x, args[1] if len(args) > 1 else kwargs.get("dim"))
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if x.rank == 0:
        return w.cast(x, dt)
    cnt = _numel([x.shape[d % x.rank] for d in dims])

    def body(y):
        s = w.reduce("sum", y, dims, keep)
        return w.ew("div", [s, float(cnt)])
    x = w.cast(x, dt)
    return _in_f32(w, x, body)


@_h("amax", "amin")
def _amax(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x = args[0]
    if x.dtype == "bool":
        x = w.cast(x, "u8")
        r = _amax(w, node, (x,) + tuple(args[1:]), kwargs)
        return w.cast(r, "bool")
    dims = _dims_arg(x, args[1] if len(args) > 1 else kwargs.get("dim"))
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if x.rank == 0:
        return x
    return w.reduce(node.target.overloadpacket.__name__, x, dims, keep)


@_h("max", "min")
def _max(w, node, args, kwargs):
    name = node.target.overloadpacket.__name__
    x = args[0]
    if len(args) == 1:
        if x.rank == 0:
            return x
        return w.reduce("a" + name, x, list(range(x.rank)), False)
    if isinstance(args[1], V):
        return _binary_op("maximum" if name == "max" else "minimum")(
            w, node, args, kwargs)
    # max.dim: (values, indices); the indices, where used, are argmax's
    dim = args[1]
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    used = set()
    for u in node.users:
        if u.target is operator.getitem:
            used.add(u.args[1])
        else:
            used.add(-1)
    if x.rank == 0:
        return [x, w.full((), 0, "i64")]
    idx = None
    if used - {0}:
        idx = _arg_select(w, "arg" + name, x, dim, keep)
    xv = w.cast(x, "u8") if x.dtype == "bool" else x
    vals = w.reduce("a" + name, xv, [dim], keep)
    return [w.cast(vals, x.dtype), idx]


def _arg_select(w, op, x, dim, keep):
    """argmax/argmin along dim (None: over the flattened tensor)."""
    if x.dtype == "bool":
        x = w.cast(x, "u8")
    if dim is None:
        shape = x.shape
        r = _arg_select(w, op, w.reshape(x, (_numel(x.shape),)), 0, False)
        return w.reshape(r, (1,) * len(shape)) if keep else r
    if x.rank == 0:
        return w.full((), 0, "i64")
    dim %= x.rank
    if x.shape[dim] == 0:
        raise _Refused("%s over an empty dim" % op)
    shape = tuple(1 if i == dim else e for i, e in enumerate(x.shape)) \
        if keep else tuple(e for i, e in enumerate(x.shape) if i != dim)
    attrs = [("dim", str(dim))]
    if keep:
        attrs.append(("keepdim", "true"))
    return w.emit(op, [x], attrs, "i64", shape)


@_h("argmax", "argmin")
def _argmax(w, node, args, kwargs):
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    return _arg_select(w, node.target.overloadpacket.__name__, args[0], dim,
                       keep)


@_h("topk")
def _topk(w, node, args, kwargs):
    x = args[0]
    k = args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
    # sorted=False lets torch return the k in any order: sorted is one
    if not largest:
        raise _Refused("topk(largest=False): fusec's topk takes the largest "
                       "(negate a float operand to take the smallest)")
    if x.rank == 0:
        return [x, w.full((), 0, "i64")]
    dim %= x.rank
    if k <= 0:
        raise _Refused("topk with k=%d" % k)
    dt = x.dtype
    xv = w.cast(x, "u8") if dt == "bool" else x
    shape = tuple(k if i == dim else e for i, e in enumerate(x.shape))
    v, i = w.emit("topk", [xv], [("k", str(k)), ("dim", str(dim))], xv.dtype,
                  shape, nres=2)
    i = V(i.name, "i64", shape)
    return [w.cast(v, dt), i]


@_h("cumsum")
def _cumsum(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    x = w.cast(x, dt)
    if x.rank == 0 or _numel(x.shape) == 0:
        return x
    if dt == "bool":
        raise _Refused("cumsum of bool into bool")
    return w.emit("cumsum", [x], [("dim", str(dim % x.rank))], dt, x.shape)


@_h("any", "all")
def _any(w, node, args, kwargs):
    name = node.target.overloadpacket.__name__
    x = args[0]
    dims = _dims_arg(x, args[1] if len(args) > 1 else kwargs.get("dim"))
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    b = w.cast(_as_bool(w, x), "u8")
    r = w.reduce("amax" if name == "any" else "amin", b, dims, keep) \
        if b.rank else b
    return w.cast(r, "bool")


@_h("var_mean", "var")
def _var_mean(w, node, args, kwargs):
    name = node.target.overloadpacket.__name__
    x = args[0]
    dims = _dims_arg(x, args[1] if len(args) > 1 else kwargs.get("dim"))
    corr = kwargs.get("correction")
    if corr is None:
        unb = kwargs.get("unbiased", True)
        corr = 1 if unb else 0
    keep = kwargs.get("keepdim", False)
    dims = sorted(set(d % x.rank for d in dims))
    shape = tuple(1 if i in dims else e for i, e in enumerate(x.shape)
                  if keep or i not in dims)
    v, m = w.emit("var_mean", [x], [("dims", _fmt_list(dims)),
                                    ("correction", _fmt_num(corr)),
                                    ("keepdim", "true" if keep else
                                     "false")],
                  x.dtype, shape, nres=2)
    return v if name == "var" else [v, m]


# ---- softmax


@_h("_softmax", "softmax")
def _softmax(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, dim = args[0], args[1]
    r = w.emit("softmax", [x], [("dim", str(dim % x.rank))], x.dtype,
               x.shape)
    return w.cast(r, dt)


@_h("_log_softmax", "log_softmax")
def _log_softmax(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, dim = args[0], args[1]
    dim = dim % x.rank
    if x.dtype in _LOWP and dt == x.dtype:
        # PyTorch's CPU kernel for f16/bf16 keeps the row sum and its log in
        # the input dtype: x - max - round(log(round(sum(exp(x - max))))),
        # in f32, rounded once at the output.
        xf = w.cast(x, "f32")
        m = w.reduce("amax", xf, [dim], True)
        d = w.ew("sub", [xf, m])
        s = w.reduce("sum", w.ew("exp", [d]), [dim], True)
        s = w.cast(w.cast(s, x.dtype), "f32")
        lg = w.cast(w.cast(w.ew("log", [s]), x.dtype), "f32")
        return w.cast(w.ew("sub", [d, lg]), dt)
    r = w.emit("log_softmax", [x], [("dim", str(dim))], x.dtype,
               x.shape)
    return w.cast(r, dt)


# ---- indexing


@_h("embedding")
def _embedding(w, node, args, kwargs):
    wt, idx = args[0], args[1]
    return w.emit("take", [wt, idx], [("dim", "0")], wt.dtype,
                  idx.shape + wt.shape[1:])


@_h("embedding_dense_backward")
def _embedding_dense_backward(w, node, args, kwargs):
    # grad_weight[idx[i]] += grad[i]. PyTorch's CPU kernel adds the rows in
    # index order into a grad_weight of the gradient's dtype, rounding after
    # every add; for f16/bf16 (and w.cpu_threads, and at most
    # _ROW_SUM_STEPS indices) the trace does the same, one index_add per
    # index. Otherwise one index_add in f32 (f64 for f64), rounded once.
    dt, shape = w.out_meta()
    g, idx, nw, pad, freq = args[:5]
    C = _numel(g.shape[idx.rank:])
    n = _numel(idx.shape)
    g2 = w.reshape(g, (n, C))
    i1 = w.reshape(idx, (n,))
    keep = None
    if pad is not None and pad >= 0:
        keep = w.reshape(w.ew("ne", [i1, pad]), (n, 1))
    cdt = "f32" if g.dtype in _LOWP else g.dtype
    src = w.cast(g2, cdt)
    if freq:
        ones = w.full((n,), 1, cdt)
        cnt = w.emit("index_add", [w.full((nw,), 0, cdt), i1, ones],
                     [("dim", "0")], cdt, (nw,))
        per = w.emit("take", [cnt, i1], [("dim", "0")], cdt, (n,))
        # the kernel adds grad[i] * (1 / count), the factor in f32
        src = w.ew("mul", [src, w.ew("reciprocal",
                                     [w.reshape(per, (n, 1))])])
    if keep is not None:
        src = w.emit("where", [keep, src, "0"], [], cdt, (n, C))
    if g.dtype in _LOWP and w.cpu_threads > 0 and n <= _ROW_SUM_STEPS:
        # with scale_grad_by_freq the scaled row stays f32 until the add
        adt = cdt if freq else g.dtype
        src = w.cast(src, adt)
        acc = w.full((nw, C), 0, adt)
        for i in range(n):
            acc = w.emit("index_add", [acc, w.slice(i1, 0, i, i + 1),
                                       w.slice(src, 0, i, i + 1)],
                         [("dim", "0")], adt, (nw, C))
            acc = w.cast(w.cast(acc, g.dtype), adt)
        r = acc
    else:
        r = w.emit("index_add", [w.full((nw, C), 0, cdt), i1, src],
                   [("dim", "0")], cdt, (nw, C))
    return w.reshape(w.cast(r, dt), shape)


@_h("index_select")
def _index_select(w, node, args, kwargs):
    x, dim, idx = args[0], args[1] % args[0].rank, args[2]
    if idx.rank == 0:
        idx = w.reshape(idx, (1,))
    return w.emit("take", [x, idx], [("dim", str(dim))], x.dtype,
                  x.shape[:dim] + idx.shape + x.shape[dim + 1:])


@_h("gather")
def _gather(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, dim, idx = args[0], args[1] % max(args[0].rank, 1), args[2]
    del dt
    return w.emit("take_along", [x, idx], [("dim", str(dim))], x.dtype,
                  idx.shape)


def _index_linear(w, x, idxs):
    """x[idxs] (advanced indexing) as (x', idx, d): x' reshaped so that one
    take(x', idx, dim=d) gives the result. Index tensors must be adjacent."""
    pos = [i for i, t in enumerate(idxs) if t is not None]
    if not pos:
        raise _Refused("index with no index tensor")
    if pos != list(range(pos[0], pos[-1] + 1)):
        raise _Refused("advanced indexing with non-adjacent index tensors")
    for i in pos:
        if idxs[i].dtype == "bool" or idxs[i].dtype == "u8":
            raise _Refused("boolean mask indexing (data-dependent shape)")
    d0 = pos[0]

    def wrap(t, n):  # x[-1]: a negative index counts from the end
        return w.emit("where", [w.ew("lt", [t, 0]), w.ew("add", [t, n]), t],
                      [], t.dtype, t.shape)
    if len(pos) == 1:
        return x, wrap(idxs[d0], x.shape[d0]), d0
    # several adjacent index tensors: linearize
    ishape = _bcast(*[idxs[i].shape for i in pos])
    lin = None
    for i in pos:
        t = wrap(w.broadcast(idxs[i], ishape), x.shape[i])
        lin = t if lin is None else w.ew("add", [w.ew("mul",
                                                      [lin, x.shape[i]]), t])
    merged = x.shape[:d0] + (_numel(x.shape[d0:pos[-1] + 1]),) + \
        x.shape[pos[-1] + 1:]
    return w.reshape(x, merged), lin, d0


@_h("index", "_unsafe_index")
def _index(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, idxs = args[0], list(args[1])
    idxs += [None] * (x.rank - len(idxs))
    xr, idx, d = _index_linear(w, x, idxs)
    r = w.emit("take", [xr, idx], [("dim", str(d))], x.dtype,
               xr.shape[:d] + idx.shape + xr.shape[d + 1:])
    if r.shape != shape:
        # PyTorch moves the indexed dims first when index tensors are
        # separated by slices; adjacent ones stay in place, as take does.
        raise _Refused("index result %s where PyTorch has %s" %
                       (list(r.shape), list(shape)))
    return r


@_h("index_put", "_unsafe_index_put")
def _index_put(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, idxs, vals = args[0], list(args[1]), args[2]
    acc = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if not acc:
        raise _Refused("index_put without accumulate (a scatter that "
                       "overwrites; repeated indices are order-dependent)")
    idxs += [None] * (x.rank - len(idxs))
    xr, idx, d = _index_linear(w, x, idxs)
    target = xr.shape[:d] + idx.shape + xr.shape[d + 1:]
    vals = w.broadcast(w.cast(vals, x.dtype) if isinstance(vals, V) else
                       w.full((), vals, x.dtype), target)
    flat_idx = w.reshape(idx, (_numel(idx.shape),))
    src = w.reshape(vals, xr.shape[:d] + (_numel(idx.shape),) +
                    xr.shape[d + 1:])
    r = w.emit("index_add", [xr, flat_idx, src], [("dim", str(d))],
               x.dtype, xr.shape)
    return w.reshape(r, shape)


@_h("index_add")
def _index_add(w, node, args, kwargs):
    x, dim, idx, src = args[0], args[1] % args[0].rank, args[2], args[3]
    alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
    if alpha != 1:
        src = w.ew("mul", [src, alpha], x.dtype)
    return w.emit("index_add", [x, idx, w.cast(src, x.dtype)],
                  [("dim", str(dim))], x.dtype, x.shape)


@_h("scatter")
def _scatter(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, dim, idx, src = args[0], args[1] % args[0].rank, args[2], args[3]
    if kwargs.get("reduce") or len(args) > 4:
        raise _Refused("scatter with reduce")
    # result[..i..] = src where i == idx along dim: with idx of extent 1
    # along dim and x's extents elsewhere, a compare with iota does it.
    if idx.shape[dim] != 1 or any(e != shape[k] for k, e in
                                  enumerate(idx.shape) if k != dim):
        raise _Refused("scatter whose index is not one entry per row")
    if isinstance(src, V) and src.shape != idx.shape and \
            _numel(src.shape) != 1:
        raise _Refused("scatter of a tensor src larger than its index")
    io = w.iota(shape[dim], idx.dtype)
    io = w.reshape(io, tuple(shape[dim] if k == dim else 1
                             for k in range(len(shape))))
    hit = w.ew("eq", [io, idx])
    s = w.cast(src, dt) if isinstance(src, V) else w.literal(src, dt)
    return w.emit("where", [hit, s, w.cast(x, dt)], [], dt, shape)


@_h("slice_scatter")
def _slice_scatter(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, src = w.cast(args[0], dt), w.cast(args[1], dt)
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % x.rank
    start = args[3] if len(args) > 3 else kwargs.get("start")
    end = args[4] if len(args) > 4 else kwargs.get("end")
    step = args[5] if len(args) > 5 else kwargs.get("step", 1)
    n = x.shape[dim]
    start, end, step = _norm_slice(n, start, end, step)
    if start >= end:
        return x
    m = src.shape[dim]
    if step != 1:
        # spread src to every step-th place: [.., m, 1] ++ zeros -> [.., m*step]
        src = w.unsqueeze(src, dim + 1)
        zs = list(src.shape)
        zs[dim + 1] = step - 1
        src = w.cat([src, w.full(tuple(zs), 0, dt)], dim + 1)
        s2 = list(x.shape)
        s2[dim] = m * step
        src = w.reshape(src, tuple(s2))
        src = w.slice(src, dim, 0, end - start)
        mask = w.ew("eq", [w.ew("fmod", [w.iota(end - start, "i64"), step]),
                           0])
        mask = w.reshape(mask, tuple(end - start if k == dim else 1
                                     for k in range(x.rank)))
        mid = w.slice(x, dim, start, end)
        src = w.emit("where", [mask, src, mid], [], dt, src.shape)
    parts = []
    if start > 0:
        parts.append(w.slice(x, dim, 0, start))
    parts.append(src)
    if end < n:
        parts.append(w.slice(x, dim, end, n))
    return w.cat(parts, dim)


@_h("select_scatter")
def _select_scatter(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, src, dim, i = w.cast(args[0], dt), w.cast(args[1], dt), \
        args[2] % args[0].rank, args[3]
    n = x.shape[dim]
    i = i + n if i < 0 else i
    src = w.unsqueeze(src, dim)
    parts = []
    if i > 0:
        parts.append(w.slice(x, dim, 0, i))
    parts.append(src)
    if i + 1 < n:
        parts.append(w.slice(x, dim, i + 1, n))
    return w.cat(parts, dim)


# ---- library


@_h("mm", "bmm", "matmul")
def _mm(w, node, args, kwargs):
    dt, shape = w.out_meta()
    a, b = w.cast(args[0], dt), w.cast(args[1], dt)
    return w.emit("matmul", [a, b], [], dt, shape)


@_h("addmm")
def _addmm(w, node, args, kwargs):
    dt, shape = w.out_meta()
    bias, a, b = args[0], w.cast(args[1], dt), w.cast(args[2], dt)
    beta = kwargs.get("beta", 1)
    alpha = kwargs.get("alpha", 1)
    if alpha == 1 and beta == 1 and isinstance(bias, V) and \
            bias.rank == 1 and bias.dtype == dt:
        # bias + a @ b is linear(a, b^T, bias): one library call that rounds
        # once, as PyTorch's addmm does. b^T is b's source when b is itself
        # a transpose (nn.Linear), else a permute (Conv1D in GPT-2).
        wt = w.transposed.get(b.name) or w.permute(b, [1, 0])
        return w.emit("linear", [a, wt, bias], [], dt, shape)
    mm = w.emit("matmul", [a, b], [], dt, shape)
    if alpha != 1:
        mm = w.ew("mul", [mm, alpha], dt)
    if beta == 0:
        return mm
    if beta != 1:
        bias = w.ew("mul", [bias, beta], dt)
    return w.ew("add", [mm, bias], dt)


@_h("linear")
def _linear(w, node, args, kwargs):
    dt, shape = w.out_meta()
    ops = [w.cast(a, dt) for a in args if isinstance(a, V)]
    return w.emit("linear", ops, [], dt, shape)


@_h("dot", "mv")
def _dot(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.emit("matmul", [w.cast(args[0], dt), w.cast(args[1], dt)], [],
                  dt, shape)


# ---- normalization


@_h("native_layer_norm")
def _native_layer_norm(w, node, args, kwargs):
    # PyTorch's kernels (CPU and CUDA) compute in f32 for f16/bf16 input and
    # round y once; mean and rstd are rounded to their own dtype (the input's
    # on the CPU, f32 on CUDA), and the backward reads those rounded values.
    metas = w.out_meta()
    x, nshape, wt, b, eps = args
    dims = list(range(x.rank - len(nshape), x.rank))
    cdt = "f32" if x.dtype in _LOWP else x.dtype
    xf = w.cast(x, cdt)
    var, mean = w.emit("var_mean", [xf], [("dims", _fmt_list(dims)),
                                          ("correction", "0"),
                                          ("keepdim", "true")],
                       cdt, metas[1][1], nres=2)
    rstd = w.ew("rsqrt", [w.ew("add", [var, eps])])
    y = w.ew("mul", [w.ew("sub", [xf, mean]), rstd])
    if isinstance(wt, V):
        y = w.ew("mul", [y, w.cast(wt, cdt)])
    if isinstance(b, V):
        y = w.ew("add", [y, w.cast(b, cdt)])
    return [w.cast(y, metas[0][0]), w.cast(mean, metas[1][0]),
            w.cast(rstd, metas[2][0])]


# The most rows one thread adds in order that _row_sum_lowp writes out;
# beyond it (long sequences, few threads) the trace sums in f32 instead.
_ROW_SUM_STEPS = 64


def _row_sum_lowp(w, t, rdt):
    """sum over dim 0 of t ([M, N], f32), written to match PyTorch's CPU
    kernels that accumulate per-thread partial sums in a buffer of the
    reduced dtype rdt (f16/bf16): at::parallel_for splits the M rows into
    ceil(M / n) chunks, one per thread; each thread adds its rows in order,
    rounding its buffer to rdt after every row; the n buffers are then
    summed in f32 and rounded once. (layer_norm's backward does this for
    dgamma and dbeta.) With w.cpu_threads 0, or more than _ROW_SUM_STEPS
    rows per thread, a plain f32 sum: closer to the exact result, and a
    few ops instead of several per row."""
    M, N = t.shape
    nth = max(1, min(w.cpu_threads, M))
    cs = -(-M // nth)
    if w.cpu_threads <= 0 or cs > _ROW_SUM_STEPS:
        return w.reduce("sum", t, [0], False)
    nth = -(-M // cs)  # threads that get rows
    if nth * cs != M:  # zero rows leave a buffer unchanged
        t = w.cat([t, w.full((nth * cs - M, N), 0, t.dtype)], 0)
    t3 = w.reshape(t, (nth, cs, N))
    acc = None
    for j in range(cs):
        row = w.reshape(w.slice(t3, 1, j, j + 1), (nth, N))
        acc = row if acc is None else w.ew("add", [acc, row])
        acc = w.cast(w.cast(acc, rdt), t.dtype)
    return w.reduce("sum", acc, [0], False) if nth > 1 else \
        w.reshape(acc, (N,))


@_h("native_layer_norm_backward")
def _native_layer_norm_backward(w, node, args, kwargs):
    # As PyTorch's kernel: everything in f32 for f16/bf16 (mean and rstd as
    # saved by the forward), dx rounded once; dgamma and dbeta summed over
    # the rows as _row_sum_lowp says on the CPU.
    metas = w.out_meta()
    g, x, nshape, mean, rstd, wt, b, mask = args
    axis = x.rank - len(nshape)
    inner = list(range(axis, x.rank))
    N = _numel(x.shape[axis:])
    M = _numel(x.shape[:axis])
    lowp = x.dtype in _LOWP
    cdt = "f32" if lowp else x.dtype
    gf, xf = w.cast(g, cdt), w.cast(x, cdt)
    mf, rf = w.cast(mean, cdt), w.cast(rstd, cdt)
    wf = w.cast(wt, cdt) if isinstance(wt, V) else None
    xhat = w.ew("mul", [w.ew("sub", [xf, mf]), rf])
    outs = [None, None, None]
    if mask[0]:
        gx = w.ew("mul", [gf, wf]) if wf is not None else gf
        s1 = w.reduce("sum", gx, inner, True)
        s2 = w.reduce("sum", w.ew("mul", [gx, xhat]), inner, True)
        inner_v = w.ew("sub", [w.ew("sub", [w.ew("mul", [gx, float(N)]), s1]),
                               w.ew("mul", [xhat, s2])])
        dx = w.ew("mul", [w.ew("div", [rf, float(N)]), inner_v])
        outs[0] = w.cast(dx, metas[0][0])

    def colsum(t, dt):
        if axis == 0:
            return w.cast(t, dt)
        if lowp and dt in _LOWP:
            t2 = w.reshape(t, (M, N))
            return w.cast(w.reshape(_row_sum_lowp(w, t2, dt),
                                    x.shape[axis:]), dt)
        return w.cast(w.reduce("sum", t, list(range(axis)), False), dt)
    if mask[1] and wf is not None:
        if lowp:  # the kernel: dy * (rstd * x + (-rstd * mean))
            nb = w.ew("mul", [w.ew("neg", [rf]), mf])
            term = w.ew("mul", [gf, w.ew("add", [w.ew("mul", [rf, xf]),
                                                 nb])])
        else:
            term = w.ew("mul", [gf, xhat])
        outs[1] = colsum(term, metas[1][0])
    if mask[2] and isinstance(b, V):
        outs[2] = colsum(gf, metas[2][0])
    return outs


# ---- prims (from the decompositions that go through torch._refs)

_PRIMS = {}


def _p(*names):
    def deco(f):
        for n in names:
            _PRIMS[n] = f
        return f
    return deco


@_p("broadcast_in_dim")
def _prim_bid(w, node, args, kwargs):
    x, shape, dims = args[0], tuple(args[1]), list(args[2])
    if x.shape == shape:
        return x
    return w.emit("broadcast_in_dim", [x], [("shape", w.shape_attr(shape)),
                                            ("dims", _fmt_list(dims))],
                  x.dtype, shape)


@_p("convert_element_type")
def _prim_convert(w, node, args, kwargs):
    return w.cast(args[0], _DTYPES[args[1]])


@_p("div")
def _prim_div(w, node, args, kwargs):
    dt, _ = w.out_meta()
    if dt in _FLOATS:
        return w.ew("div", list(args[:2]), dt)
    q = w.ew("div", list(args[:2]), "f64")
    q = w.ew("mul", [w.ew("sign", [q]), w.ew("floor", [w.ew("abs", [q])])])
    return w.cast(q, dt)


for _n in ("add", "sub", "mul", "maximum", "minimum", "pow", "eq", "ne",
           "lt", "le", "gt", "ge", "fmod"):
    _PRIMS[_n] = _binary_op(_n)
for _n in _UNARY:
    _PRIMS[_n] = _unary


@_p("where")
def _prim_where(w, node, args, kwargs):
    return _where(w, node, args, kwargs)


@_p("reshape", "collapse_view", "split_dim", "view_of")
def _prim_reshape(w, node, args, kwargs):
    dt, shape = w.out_meta()
    return w.reshape(args[0], shape)


@_p("squeeze")
def _prim_squeeze(w, node, args, kwargs):
    return w.squeeze(args[0], list(args[1]))


@_p("permute", "transpose")
def _prim_permute(w, node, args, kwargs):
    return w.permute(args[0], list(args[1]))


@_p("sum", "amax", "amin")
def _prim_reduce(w, node, args, kwargs):
    x, dims = args[0], list(args[1])
    op = node.target.overloadpacket.__name__
    return w.reduce(op, x, dims, False)


@_p("var")
def _prim_var(w, node, args, kwargs):
    x, dims = args[0], list(args[1])
    corr = kwargs.get("correction", args[2] if len(args) > 2 else 0)
    dims = sorted(set(d % x.rank for d in dims))
    shape = tuple(e for i, e in enumerate(x.shape) if i not in dims)
    v, _ = w.emit("var_mean", [x], [("dims", _fmt_list(dims)),
                                    ("correction", _fmt_num(corr)),
                                    ("keepdim", "false")],
                  x.dtype, shape, nres=2)
    return v


# ---- Symbolic extents -------------------------------------------------------
#
# fn is traced twice: at the example sizes (text A) and, with fake tensors,
# at other sizes for the symbolic dims (text B). Both walks write the same
# statements; only numbers that depend on the symbolic sizes differ. Each
# such number is written as the symbol whose size it is in both traces, or,
# in a reshape's shape, as its one -1 (a product such as B*T). Any other
# size-dependent number (a literal operand, a slice start) cannot be written
# in the trace format and is an ExportError naming the statement.

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|-?\d+(?:\.\d*)?(?:e-?\d+)?|\S")


def _is_num(tok):
    return tok[0].isdigit() or (tok[0] == "-" and len(tok) > 1)


def _monomial(a, b, sizes_a, sizes_b):
    """(c, [symbols]) with a = c*prod(sizes_a) and b = c*prod(sizes_b), the
    fewest symbols first; None if there is none."""
    import itertools
    syms = sorted(sizes_a)
    for r in range(1, len(syms) + 1):
        for S in itertools.combinations(syms, r):
            pa = _numel([sizes_a[s] for s in S])
            pb = _numel([sizes_b[s] for s in S])
            c = a / pa
            if abs(c * pb - b) <= 1e-9 * max(abs(b), 1) and c != 0:
                return c, list(S)
    return None


def _merge_symbolic(text_a, text_b, sizes_a, sizes_b, lit_dtypes):
    la, lb = text_a.splitlines(), text_b.splitlines()
    used = set(_TOKEN.findall(text_a))
    scalars = {}  # (c, symbols, dtype) -> name
    if len(la) != len(lb):
        raise ExportError(
            "symbolic: the trace's statements change with the sizes of %s "
            "(a size-dependent branch, or an example size that equals "
            "another extent); try other example sizes" %
            ", ".join(sorted(sizes_a)))
    out = []
    for lno, (a, b) in enumerate(zip(la, lb)):
        if a == b:
            out.append(a)
            continue
        ta, tb = _TOKEN.findall(a), _TOKEN.findall(b)
        if len(ta) != len(tb) or any(
                x != y and not (_is_num(x) and _is_num(y))
                for x, y in zip(ta, tb)):
            raise ExportError("symbolic: statement %d differs in structure "
                              "between the two traces:\n  %s\n  %s" %
                              (lno, a.strip(), b.strip()))
        op = ta[ta.index("=") + 1] if "=" in ta and lno > 0 else "trace"
        key, depth, res = None, 0, []
        infer_used = False
        for k, (x, y) in enumerate(zip(ta, tb)):
            if x in ("(", "["):
                depth += 1
            elif x in (")", "]"):
                depth -= 1
            elif x == "," and depth <= 1:
                key = None
            if k + 1 < len(ta) and ta[k + 1] == "=" and depth == 1:
                key = x
            if x == ":" and lno == 0:
                key = "param"
            if x == y:
                res.append(x)
                continue
            hit = [nm for nm in sizes_a if str(sizes_a[nm]) == x and
                   str(sizes_b[nm]) == y]
            if key in ("shape", "end", "length", "param", "value") and hit:
                res.append(hit[0])
            elif key == "shape" and op == "reshape" and not infer_used:
                res.append("-1")
                infer_used = True
            elif key is None and depth == 1 and lno in lit_dtypes and \
                    _monomial(float(x), float(y), sizes_a, sizes_b):
                # a literal operand that is a size (a mean's count, an
                # index's wrap-around): a rank-0 value made from the symbols
                c, S = _monomial(float(x), float(y), sizes_a, sizes_b)
                if c == int(c):
                    c = int(c)
                pre = []
                res.append(_scalar_of(c, S, lit_dtypes[lno], used, scalars,
                                      pre))
                out.extend(pre)
            else:
                raise ExportError(
                    "symbolic: %s depends on the symbolic sizes (%s here, %s "
                    "at other sizes) and cannot be written in the trace "
                    "format:\n  %s" % ("the number in " + (key or "an "
                                        "operand") if key else "a literal",
                                        x, y, a.strip()))
        out.append(_join_tokens(a, res))
    return "\n".join(out) + "\n"


def _scalar_of(c, S, dt, used, scalars, pre):
    """A rank-0 value c * prod(S) of dtype dt, defined by statements appended
    to pre (once per distinct scalar)."""
    key = (c, tuple(S), dt)
    if key in scalars:
        return scalars[key]

    def fresh(base):
        nm, k = base, 1
        while nm in used:
            nm = "%s_%d" % (base, k)
            k += 1
        used.add(nm)
        return nm
    cur = None
    for sname in S:
        nm = fresh("size_%s_%s" % (sname, dt))
        pre.append("  %s = full(shape=[], value=%s, dtype=%s)" %
                   (nm, sname, dt))
        if cur is not None:
            nm2 = fresh("size_%s_%s" % ("_".join(S), dt))
            pre.append("  %s = mul(%s, %s)" % (nm2, cur, nm))
            nm = nm2
        cur = nm
    if c != 1:
        nm = fresh("size_%s_%s" % ("_".join(S), dt))
        pre.append("  %s = mul(%s, %s)" % (nm, cur, _fmt_num(c)))
        cur = nm
    scalars[key] = cur
    return cur


def _join_tokens(line, toks):
    """Rewrites line with its tokens replaced, keeping its spacing."""
    res, pos = [], 0
    for m, t in zip(_TOKEN.finditer(line), toks):
        res.append(line[pos:m.start()])
        res.append(t)
        pos = m.end()
    res.append(line[pos:])
    return "".join(res)


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


class _MathAttention:
    """Replaces F.scaled_dot_product_attention, while tracing, by its math
    (matmul, mask, softmax, matmul): PyTorch's own lowering goes to a fused
    CPU kernel whose backward has no decomposition. For f16/bf16 it rounds
    where that kernel rounds (_FlashCPU). A patch of the module
    attribute rather than a TorchFunctionMode, because checkpoint's
    recomputation runs in the autograd engine, where Python modes are not
    active."""

    def __enter__(self):
        import torch.nn.functional as F
        self.saved = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = _sdpa_math
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F
        F.scaled_dot_product_attention = self.saved
        return False


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
               scale=None, enable_gqa=False):
    if dropout_p:
        raise ExportError("scaled_dot_product_attention with dropout_p=%g: "
                          "random ops cannot be exported; use 0" % dropout_p)
    dt = q.dtype
    L, S = q.size(-2), k.size(-2)
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    if enable_gqa and k.dim() >= 3 and k.size(-3) != q.size(-3):
        rep = q.size(-3) // k.size(-3)
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=torch.float32,
                                device=q.device).masked_fill(
                                    ~attn_mask, float("-inf"))
    if dt in (torch.float16, torch.bfloat16):
        return _FlashCPU.apply(q, k, v, attn_mask, is_causal, scale)
    att = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        att = att + attn_mask.to(att.dtype)
    att = torch.softmax(att, dim=-1)
    return att @ v


def _flash_scores(q, k, mask, causal, scale):
    """q @ k^T * scale, masked, in f32."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        L, S = q.size(-2), k.size(-2)
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s + mask.float()
    return s


class _FlashCPU(torch.autograd.Function):
    """scaled_dot_product_attention for f16/bf16 as PyTorch's CPU flash
    attention kernel computes it, as one block of keys (short sequences
    match it bit for bit; longer ones differ in a few roundings where the
    kernel's online softmax rescales). Forward: scores, max, exp and row
    sum in f32; the probabilities are rounded to the input dtype for the
    product with v; divided by the f32 row sum; rounded once. Backward:
    probabilities recomputed in f32 from the log-sum-exp; dv from the
    rounded probabilities; the score gradient rounded to the input dtype
    for the products giving dq and dk; every product accumulates in f32
    and rounds once."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale):
        dt = q.dtype
        s = _flash_scores(q, k, mask, causal, scale)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        o = ((p.to(dt).float() @ v.float()) / l).to(dt)
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, go):
        q, k, v, o, lse, mask = ctx.saved_tensors
        dt = q.dtype
        s = _flash_scores(q, k, mask, ctx.causal, ctx.scale)
        p = torch.exp(s - lse)
        gf = go.float()
        dv = (p.to(dt).float().transpose(-2, -1) @ gf).to(dt)
        dp = gf @ v.float().transpose(-2, -1)
        dsum = (gf * o.float()).sum(-1, keepdim=True)
        ds = (p * (dp - dsum)).to(dt).float()
        dq = ((ds @ k.float()) * ctx.scale).to(dt)
        dk = ((ds.transpose(-2, -1) @ q.float()) * ctx.scale).to(dt)
        return dq, dk, dv, None, None, None


def _trace(fn, example_args, fake):
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
    with torch.enable_grad(), _MathAttention():
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
                "/fusec/torch.py" not in fr.filename:
            pick = fr
    if pick is None:
        return "(no source line recorded)"
    return "%s:%d in %s: %s" % (pick.filename, pick.lineno, pick.name,
                                (pick.line or "").strip())


def _resolve_symbolic(symbolic, names, tensors):
    """{param index: {dim: name}} from the user's spec."""
    out = {}
    if not symbolic:
        return out
    items = symbolic.items() if isinstance(symbolic, dict) else \
        enumerate(symbolic)
    for key, dims in items:
        if dims is None:
            continue
        if isinstance(key, torch.Tensor):
            idx = [i for i, t in enumerate(tensors) if t is key]
        elif isinstance(key, int):
            idx = [key]
        else:
            idx = [i for i, n in enumerate(names) if n == key]
        if len(idx) != 1 or not 0 <= idx[0] < len(tensors):
            raise ExportError("symbolic: no parameter %r (parameters: %s)" %
                              (key, ", ".join(names)))
        if isinstance(dims, (list, tuple)):
            dims = {k: v for k, v in enumerate(dims) if v}
        d = {}
        for k, v in dims.items():
            r = tensors[idx[0]].dim()
            if not -r <= k < r:
                raise ExportError("symbolic: parameter %s has no dim %d" %
                                  (names[idx[0]], k))
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
                raise ExportError("symbolic: %r is not an identifier" % v)
            d[k % r] = v
        out[idx[0]] = d
    return out


def export(fn, *example_args, symbolic=None, fake=False, name=None,
           stats=None, cpu_threads=None):
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
               _peak_bytes)
    cpu_threads  f16/bf16 only: the thread count whose summation order
               to reproduce where a PyTorch CPU kernel accumulates
               per-thread partial sums in f16/bf16 (layer_norm's backward,
               for its weight and bias gradients), e.g.
               torch.get_num_threads() to compute bit for bit what eager
               PyTorch computes on this machine. The default, 0, sums in
               f32: a trace that does not depend on the exporting machine,
               more accurate and shorter. Symbolic exports always do so.

    Raises ExportError naming every op that has no mapping, with the model
    line it came from, and every mapping that was refused, with the reason.
    """
    gm, flat, tpos = _trace(fn, example_args, fake)
    tensors = [flat[i] for i in tpos]
    names = _param_names(fn, example_args, tpos)
    sym = _resolve_symbolic(symbolic, names, tensors)
    tname = _ident(name or getattr(fn, "__name__", "trace"), "trace")
    if tname == "lambda":
        tname = "trace"
    lit_dtypes = {}
    if cpu_threads is None:
        cpu_threads = 0
    if sym:  # the summation order depends on the row count: not symbolic
        cpu_threads = 0
    try:
        text = _write(gm, tname, names, tensors, lit_dtypes, stats,
                      cpu_threads)
    except _Unlocated as e:
        raise ExportError(_locate(fn, example_args, e.args[0])) from None
    if not sym:
        return text
    sizes_a, sizes_b, args_b, tensors_b = _other_sizes(example_args, flat,
                                                       tpos, tensors, sym)
    try:
        gm_b, _, _ = _trace(fn, args_b, True)
    except Exception as e:  # noqa: BLE001
        raise ExportError("symbolic: tracing at other sizes (%s) failed: %s"
                          % (sizes_b, e))
    text_b = _write(gm_b, tname, names, tensors_b, cpu_threads=cpu_threads)
    return _merge_symbolic(text, text_b, sizes_a, sizes_b, lit_dtypes)


def _other_sizes(example_args, flat, tpos, tensors, sym):
    """Fake example arguments whose symbolic dims have other sizes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    sizes_a = {}
    for i, dims in sym.items():
        for d, nm in dims.items():
            e = int(tensors[i].shape[d])
            if nm in sizes_a and sizes_a[nm] != e:
                raise ExportError("symbolic: %s is %d in one place and %d in "
                                  "another" % (nm, sizes_a[nm], e))
            sizes_a[nm] = e
    # odd bumps, different per symbol, so that no two symbols (and no
    # symbol and a product of others) coincide at the other sizes
    sizes_b = {nm: sizes_a[nm] + 7 + 4 * k
               for k, nm in enumerate(sorted(sizes_a))}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    leaves, tensors_b = list(flat), []
    for j, i in enumerate(tpos):
        t = tensors[j]
        shape = list(t.shape)
        for d, nm in sym.get(j, {}).items():
            shape[d] = sizes_b[nm]
        with mode:
            ft = torch.empty(shape, dtype=t.dtype)
        if t.requires_grad:
            ft.requires_grad_(True)
        leaves[i] = ft
        tensors_b.append(ft)
    args_b = pytree.tree_unflatten(leaves,
                                   pytree.tree_flatten(example_args)[1])
    return sizes_a, sizes_b, args_b, tensors_b


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
        cand, k = nm, 1
        while cand in used:
            cand = "%s_%d" % (nm, k)
            k += 1
        used.add(cand)
        names.append(cand)
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
           cpu_threads=0):
    w = _Writer(gm, names)
    w.cpu_threads = cpu_threads
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = []
    for j, (node, nm) in enumerate(zip(placeholders, names)):
        t = tensors[j]
        dt = _DTYPES.get(t.dtype)
        if dt is None:
            raise ExportError("parameter %s has dtype %s, which fusec lacks" %
                              (nm, t.dtype))
        w.used.add(nm)
        shape = tuple(int(e) for e in t.shape)
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
    head = "trace %s(%s) {" % (tname, ", ".join(params))
    text = "\n".join([head] + w.lines + ["  return " + ", ".join(rets), "}",
                                         ""])
    if lit_dtypes is not None:
        lit_dtypes.update({k + 1: v for k, v in w.lit_dtype.items()})
    if stats is not None:
        stats["ops"] = op_counts(text)
        stats["op_count"] = sum(stats["ops"].values())
        stats["params"] = len(params)
        stats["param_bytes"] = sum(_numel(t.shape) * _BYTES[_DTYPES[t.dtype]]
                                   for t in tensors)
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

