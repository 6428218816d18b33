"""fusec.torch.values: what the exporter writes a trace out of.

The fusec dtypes of PyTorch's dtypes (and their sizes), V (a value written
to the trace: its name, dtype and shape), number and list literals in the
trace grammar, identifiers, broadcasting and element counts, the source
line of an FX node, and the exporter's errors: ExportError (public) and
the internal _Unmapped / _Refused / _Unlocated that the writer collects.

No behaviour lives here: nothing is traced, walked or written.
"""

import re

import torch


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


def _unique(base, used):
    """base, or base_1, base_2...: the first not in used (then added)."""
    nm, k = base, 1
    while nm in used:
        nm = "%s_%d" % (base, k)
        k += 1
    used.add(nm)
    return nm


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


_CMP = ("eq", "ne", "lt", "le", "gt", "ge")


def _is_size(x):
    """Is x a size (an int, or a symbolic one from Dynamo) rather than a
    tensor?"""
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def _concrete(e, sizes):
    """e as an int: a SymInt's expression evaluated with sizes ({sympy
    symbol: int}); _Refused where a symbol has no value there."""
    if isinstance(e, int):
        return e
    if isinstance(e, torch.SymInt):
        c = e.node.maybe_as_int()
        if c is not None:
            return c
        try:
            return int(e.node.expr.xreplace(sizes))
        except TypeError:  # a symbol left
            raise _Refused("symbolic size %s: its symbols have no value "
                           "here" % e.node.expr) from None
    return int(e)
