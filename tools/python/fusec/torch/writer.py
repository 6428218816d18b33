"""fusec.torch.writer: the walk over an FX graph that writes trace text.

_Writer visits the nodes of a make_fx graph in order and writes each as one
or a few fusec statements, through a small vocabulary of building blocks
(emit, cast, reshape, broadcast, permute, slice, cat, ew, reduce, full, and
the inf/nan constants a literal cannot spell). Which statements a node
becomes is decided by its handler in fusec.torch.ops; the writer only finds
the handler (dispatch), records nodes with no mapping or a refused one, and
rebinds a value an in-place op left in the graph.

Not here: tracing (fusec.torch.exporter), the op mappings themselves
(fusec.torch.ops), the trace's head and return line (exporter._write).
"""

import math
import operator

import torch

from .values import (ExportError, V, _BYTES, _CMP, _DTYPES, _FLOATS, _Refused,
                     _Unmapped, _bcast, _concrete, _fmt_list, _fmt_num,
                     _ident, _is_size, _numel, _source_line, _val)
from .ops import _HANDLERS, _PRIMS

# The ops of Dynamo's size arithmetic: a tensor's extent, and sums and
# products of extents. Their values are sizes, never data (.item(), whose
# value is a size too, is not among them).
_SIZE_OPS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default,
             operator.add, operator.sub, operator.mul, operator.floordiv,
             operator.neg, torch.sym_max, torch.sym_min)


def is_size_node(node):
    """Is node one of Dynamo's size computations (an extent of a tensor,
    or arithmetic on extents), whose value the node's own meta records?"""
    return node.op == "call_function" and node.target in _SIZE_OPS and \
        _is_size(_val(node))


_CONST_LIMIT = 4096
_CAT_MAX = 256  # operands of one op (FZ_MAX_ARGS in ir/ir.h)
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
attention attention_dq attention_dkv
""".split())  # elements of a tensor constant written inline


# ---- Random numbers ---------------------------------------------------------

class Draws:
    """The random numbers of one trace (export(random=True), the backend):
    every draw is a `uniform` of the trace's seed parameter, a rank-0 i64
    named when first needed and appended to the parameters (so the caller
    passes a fresh seed each call and nothing compiles again), each draw
    STRIDE counters past the one before, so the draws of one trace never
    overlap (a draw of up to 2^42 elements)."""

    STRIDE = 1 << 40

    def __init__(self):
        self.seed = None   # the seed parameter's name, once a draw needs it
        self.count = 0     # draws written


# ---- The writer -------------------------------------------------------------

class _Writer:
    def __init__(self, gm, param_names):
        self.gm = gm
        self.lines = []
        self.env = {}
        self.used = set()
        self.params = set(param_names)  # the parameters' names
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
        self.fulls = {}       # name of a full -> (value, dtype)
        self.sizes = {}       # symbol -> int, for Dynamo's symbolic sizes
        self.random = None    # Draws, where random ops may be written
        self.reshaped = {}    # name of a reshape -> its operand (a V)

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
            return [(_DTYPES.get(x.dtype), self.shape_of(x))
                    if isinstance(x, torch.Tensor) else None for x in v]
        if not isinstance(v, torch.Tensor):
            raise ExportError("node %s has no tensor metadata" % node.name)
        if v.dtype not in _DTYPES:
            raise _Refused("dtype %s has no fusec dtype" % v.dtype)
        return _DTYPES[v.dtype], self.shape_of(v)

    def shape_of(self, t):
        """t's shape as ints; a symbolic extent (a graph from Dynamo)
        takes its value in self.sizes."""
        return tuple(_concrete(e, self.sizes) for e in t.shape)

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
        v = self.emit("full", [], [("shape", self.shape_attr(shape)),
                                   ("value", _fmt_num(value)),
                                   ("dtype", dtype)],
                      dtype, shape, hint=hint)
        self.fulls[v.name] = (value, dtype)
        return v

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
        r = self.emit("reshape", [v],
                      [("shape", self.shape_attr(shape, True))],
                      v.dtype, shape)
        self.reshaped[r.name] = v
        return r

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
        if v.name in self.fulls:
            # a slice of a constant is a smaller constant: no start to
            # write (the rest of a slice_scatter into zeros, x[:, :-1]'s
            # gradient, starts at T-1, which a symbolic trace cannot say)
            shape = list(v.shape)
            shape[dim] = (end - start + step - 1) // step
            return self.full(tuple(shape), *self.fulls[v.name])
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
        # a cat takes at most _CAT_MAX operands (the verifier's limit): a
        # longer list is catted in groups, then the groups
        while len(vs) > _CAT_MAX:
            vs = [self.cat(vs[i:i + _CAT_MAX], dim)
                  for i in range(0, len(vs), _CAT_MAX)]
        shape = list(vs[0].shape)
        shape[dim] = sum(v.shape[dim] for v in vs)
        return self.emit("cat", vs, [("dim", str(dim))], vs[0].dtype,
                         tuple(shape))

    def uniform(self, shape, dtype, what):
        """Numbers uniform on [0, 1) of shape and (float) dtype, drawn from
        the trace's seed parameter; refused where the writer takes no
        random ops (export without random=True)."""
        d = self.random
        if d is None:
            raise _Refused("random op %s: the numbers depend on a generator "
                           "a trace cannot hold; export(..., random=True) "
                           "makes the seed a parameter of the trace "
                           "(fusec's Philox uniform), or trace with dropout "
                           "p=0 or in eval mode" % what)
        if d.seed is None:
            d.seed = self.fresh("seed")
        off = d.count * Draws.STRIDE
        d.count += 1
        return self.emit("uniform", [V(d.seed, "i64", ())],
                         [("shape", self.shape_attr(shape)),
                          ("offset", str(off)), ("dtype", dtype)],
                         dtype, tuple(shape))

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
        home = self._home_shape(tens, shape)
        if home is not None:
            # in the shape of the one computed operand, the parameters
            # reshaped to it (free views), then back: see _home_shape
            ops = [self.reshaped[o.name] if o.name in self.reshaped else
                   self.reshape(o, home) if isinstance(o, V) else o
                   for o in operands]
            return self.reshape(self.ew(op, ops, dtype, out_dtype), shape)
        args = []
        for o in operands:
            if isinstance(o, V):
                args.append(self.cast(o, dtype))
            else:
                args.append(self.literal(o, dtype))
        if out_dtype is None:
            out_dtype = "bool" if op in _CMP else dtype
        return self.emit(op, args, [], out_dtype, shape)

    def _home_shape(self, tens, shape):
        """The shape an elementwise op over tens is better computed in, or
        None. When one operand is a reshape of a value X computed in this
        trace and every other is a parameter of the op's own shape (no
        broadcast), the op is computed in X's shape: the parameters are
        reshaped to it (views of an input) and the result back. A kernel
        that made X can then go on to the op: the partitioner fuses
        elementwise work into a normalization only in the shape of its
        rows, and AOTAutograd's backward of a loss over logits viewed as
        [B*T, V] adds the logits' tangent, [B, T, V], to the gradient
        the cross-entropy's rows make in [B*T, V] (a separate add over
        the whole [B, T, V] otherwise)."""
        if len(tens) < 2 or any(t.shape != shape for t in tens):
            return None
        mine = [t for t in tens if t.name not in self.params]
        if len(mine) != 1 or mine[0].name not in self.reshaped:
            return None
        x = self.reshaped[mine[0].name]
        if x.name in self.params or _numel(x.shape) != _numel(shape):
            return None
        return x.shape

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
                if is_size_node(node):
                    # a size inside a part (claims.sizes_for_parts): its
                    # value at this binding, as a placeholder's
                    self.env[node] = _concrete(_val(node), self.sizes)
                    continue
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
        if _is_size(_val(node)):  # arithmetic on sizes (Dynamo's graphs)
            return _concrete(_val(node), self.sizes)
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
