"""fusec.torch.ops: the ATen -> fusec op mapping table and its handlers.

_HANDLERS maps an ATen op's name (its overload packet: "add", "mm",
"native_layer_norm", ...) to a handler f(writer, node, args, kwargs) that
writes the op with the writer's building blocks and returns its V (or a
list of them); _PRIMS does the same for the prims that some decompositions
leave. An op missing from both is reported by the writer as unmapped; a
handler that cannot write a particular use (a dtype, an overlapping view)
raises _Refused with the reason. The numerics notes in
fusec.torch.exporter's docstring say where handlers round as PyTorch's
kernels do.

Not here: the walk over the graph (fusec.torch.writer) and which ops are
decomposed before they reach a handler (exporter._decompositions).
"""

import math
import operator

import torch

from .values import (V, _CMP, _DTYPES, _FLOATS, _LOWP, _Refused, _TORCH_OF,
                     _bcast, _fmt_list, _fmt_num, _numel, _val)


# ---- Op handlers ------------------------------------------------------------


_HANDLERS = {}


def _registrar(table):
    """A decorator factory that files a function in table under names."""
    def register(*names):
        def deco(f):
            for n in names:
                table[n] = f
            return f
        return deco
    return register


_h = _registrar(_HANDLERS)


def _probe(x):
    if isinstance(x, V):
        return torch.empty(() if x.rank == 0 else (1,),
                           dtype=_TORCH_OF[x.dtype], device="meta")
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
        acc = torch.empty(() if zero_dim else (1,), dtype=rt, device="meta")
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
    return float(torch.tensor(x, dtype=_TORCH_OF[dt], device="cpu").item()) != \
        float(x)


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


@_h("zero", "zeros", "zeros_like", "new_zeros", "empty", "empty_like", "new_empty",
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
    "native_dropout")
def _random(w, node, args, kwargs):
    """Random ops on the writer's draws (Philox uniform from the trace's
    seed parameter; w.uniform refuses them where the writer takes none):
    rand as drawn; randn by Box-Muller from two draws; bernoulli as a draw
    below p; uniform(from, to) scaled; native_dropout as PyTorch's own
    decomposition writes it (keep where a draw exceeds p, scale by
    1/(1-p)). The numbers are not PyTorch's (its generator is not Philox
    at these offsets), only distributed as they are, as with Inductor."""
    name = node.target.overloadpacket.__name__.rstrip("_")
    if name == "native_dropout":
        x, p, train = args[0], args[1], args[2]
        if not train or p == 0:
            return [x, w.full(x.shape, 1, "bool")]
        if p == 1:
            return [w.full(x.shape, 0, x.dtype), w.full(x.shape, 0, "bool")]
        keep = w.ew("gt", [w.uniform(x.shape, _draw_dtype(x.dtype), name),
                           p])
        y = w.ew("mul", [w.ew("mul", [keep, x], x.dtype), 1.0 / (1.0 - p)],
                 x.dtype)
        return [y, keep]
    dt, shape = w.out_meta()
    if dt not in _FLOATS:
        raise _Refused("%s of dtype %s (fusec draws floats)" % (name, dt))
    if name in ("rand", "rand_like"):
        return w.uniform(shape, dt, name)
    if name in ("randn", "randn_like"):
        return _normal(w, shape, dt, name)
    if name == "uniform":
        lo = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
        hi = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
        if kwargs.get("generator") is not None:
            raise _Refused("uniform with a generator of its own")
        u = w.uniform(shape, _draw_dtype(dt), name)
        return w.cast(w.ew("add", [w.ew("mul", [u, hi - lo]), lo]), dt)
    # bernoulli(x): 1 where a draw is below x's element; bernoulli(x, p)
    # below the number p
    if kwargs.get("generator") is not None:
        raise _Refused("bernoulli with a generator of its own")
    p = args[1] if len(args) > 1 else kwargs.get("p", args[0])
    if isinstance(p, V) and p.dtype not in _FLOATS:
        raise _Refused("bernoulli with probabilities of dtype %s" % p.dtype)
    cd = _draw_dtype(p.dtype if isinstance(p, V) else dt)
    u = w.uniform(shape, cd, name)
    return w.cast(w.ew("lt", [u, p], cd), dt)


def _draw_dtype(dt):
    """The dtype to draw in for a result of dtype dt: f32 but for f64 (a
    half draw holds 8 to 11 bits, too coarse to compare with p)."""
    return "f64" if dt == "f64" else "f32"


def _normal(w, shape, dt, name):
    """Standard normal numbers by Box-Muller from two uniform draws u1, u2
    in [0, 1): sqrt(-2 log(1 - u1)) cos(2 pi u2), in f32 (f64 for f64)."""
    cd = _draw_dtype(dt)
    u1, u2 = w.uniform(shape, cd, name), w.uniform(shape, cd, name)
    r = w.ew("sqrt", [w.ew("mul", [w.ew("log", [w.ew("sub", [1.0, u1])]),
                                   -2.0])])
    c = w.ew("cos", [w.ew("mul", [u2, 2 * math.pi])])
    return w.cast(w.ew("mul", [r, c]), dt)


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


_SCATTER_MAX = 64  # entries per row that scatter writes as a chain of wheres


@_h("scatter")
def _scatter(w, node, args, kwargs):
    dt, shape = w.out_meta()
    x, dim, idx, src = args[0], args[1] % args[0].rank, args[2], args[3]
    if kwargs.get("reduce") or len(args) > 4:
        raise _Refused("scatter with reduce")
    # result[..i..] = src[..j..] where i == idx[..j..] along dim: with idx
    # of x's extents but along dim, where it holds k entries per row (the
    # backward of topk), one compare with iota and one where per entry, in
    # order, so that a repeated index keeps the last, as PyTorch's CPU
    # kernel does.
    k = idx.shape[dim] if idx.rank else 1
    if any(e != shape[d] for d, e in enumerate(idx.shape) if d != dim):
        raise _Refused("scatter whose index is smaller than its input "
                       "outside dim")
    if k > _SCATTER_MAX:
        raise _Refused("scatter of %d entries per row (at most %d)" %
                       (k, _SCATTER_MAX))
    if isinstance(src, V) and src.shape != idx.shape:
        if _numel(src.shape) == 1:
            src = w.reshape(src, ())
        elif src.rank == idx.rank and all(
                a >= b for a, b in zip(src.shape, idx.shape)):
            for d in range(src.rank):  # scatter reads src where idx is
                src = w.slice(src, d, 0, idx.shape[d])
        else:
            raise _Refused("scatter of a src smaller than its index")
    io = w.iota(shape[dim], idx.dtype)
    io = w.reshape(io, tuple(shape[dim] if d == dim else 1
                             for d in range(len(shape))))
    s = w.cast(src, dt) if isinstance(src, V) else w.literal(src, dt)
    r = w.cast(x, dt)
    for j in range(k):
        ij = idx if k == 1 else w.slice(idx, dim, j, j + 1)
        sj = s if k == 1 or s.rank == 0 else w.slice(s, dim, j, j + 1)
        hit = w.ew("eq", [io, ij])
        r = w.emit("where", [hit, sj, r], [], dt, shape)
    return r


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
_p = _registrar(_PRIMS)


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


@_p("fma")
def _prim_fma(w, node, args, kwargs):
    """a b + c rounded once (torch._refs' lerp, AdamW's moments): in f64
    for narrower floats, where a b is exact and the sum rounds once more
    only where it lands on a tie of the result's dtype; f64 as mul, add."""
    dt, _ = w.out_meta()
    wide = "f64" if dt in _FLOATS else dt
    return w.cast(w.ew("add", [w.ew("mul", list(args[:2]), wide), args[2]], wide),
                  dt)


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
