"""fusec.torch.symbolic: symbolic extents for fusec.torch.export.

export(symbolic=) traces fn a second time, with fake tensors, at other
sizes for the named dims, and _merge_symbolic writes the numbers that
moved as the symbols' names, as sums of products of them (T+1, B*T-B;
confirmed on a third trace), or as a reshape's one -1. Also here: reading
the user's symbolic= spec (_resolve_symbolic) and making the fake example
arguments at the other sizes (_other_sizes).

Not here: tracing and writing (fusec.torch.exporter, fusec.torch.writer).
"""

import re

import torch
import torch.utils._pytree as pytree

from .values import ExportError, _fmt_num, _ident, _numel, _unique


# ---- Symbolic extents -------------------------------------------------------
#
# fn is traced twice: at the example sizes (text A) and, with fake tensors,
# at other sizes for the symbolic dims (text B). Both walks write the same
# statements; only numbers that depend on the symbolic sizes differ. Each
# such number is written as the symbol whose size it is in both traces, or
# as the extent c*M*(P+k) it fits (T+1, B*T-B, 2*T: _fits; confirmed on a
# third trace, since two points fit more than one form), or, in a
# reshape's shape, as its one -1. A literal operand that is a size becomes
# a rank-0 value built from the symbols. Any other size-dependent number
# (a slice start) cannot be written in the trace format and is an
# ExportError naming the statement.

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


def _subsets(syms):
    import itertools
    for r in range(len(syms) + 1):
        for S in itertools.combinations(syms, r):
            yield list(S)


def _fits(x, y, sizes_a, sizes_b):
    """Every extent c*M*(P+k) that is x at sizes_a and y at sizes_b, M and
    P disjoint products of symbols (P not empty), c and k integers: T+1
    (P=T, k=1), B*T-B (M=B, P=T, k=-1), 2*T+2, B*T+2. As (text, form),
    the fewest symbols and the smallest constants first."""
    from fractions import Fraction
    x, y = int(x), int(y)
    syms = sorted(sizes_a)
    seen, out = set(), []
    for P in _subsets(syms):
        if not P:
            continue
        rest = [s for s in syms if s not in P]
        pa, pb = _numel([sizes_a[s] for s in P]), _numel([sizes_b[s] for s in P])
        if pa == pb:
            continue
        for M in _subsets(rest):
            ma = _numel([sizes_a[s] for s in M])
            mb = _numel([sizes_b[s] for s in M])
            if not ma or not mb:
                continue
            c = (Fraction(y, mb) - Fraction(x, ma)) / (pb - pa)
            if c == 0 or c.denominator != 1:
                continue
            k = Fraction(x, ma) / c - pa
            if k.denominator != 1:
                continue
            form = (int(c), tuple(M), tuple(P), int(k))
            text = _form_text(*form)
            if text not in seen:
                seen.add(text)
                out.append((len(M) + len(P), abs(int(k)), abs(int(c)),
                            text, form))
    out.sort()
    return [(o[3], o[4]) for o in out]


def _form_text(c, M, P, k):
    """c*M*(P+k) multiplied out, as the trace grammar writes a sum:
    "B*T-B", "2*T+2"."""
    def term(coef, names):
        parts = ([str(abs(coef))] if abs(coef) != 1 or not names else []) \
            + list(names)
        return ("-" if coef < 0 else "+") + "*".join(parts)
    text = term(c, list(M) + list(P))
    if k:
        text += term(c * k, list(M))
    return text[1:] if text[0] == "+" else text


def _form_value(form, sizes):
    c, M, P, k = form
    return c * _numel([sizes[s] for s in M]) * (
        _numel([sizes[s] for s in P]) + k)


def _merge_symbolic(text_a, text_b, sizes_a, sizes_b, lit_dtypes,
                    third=None):
    """third: None, or a function that traces once more at a third set of
    sizes and returns (its text, those sizes); called once, the first time
    a number is not one symbol's size, to confirm the extent fitted to the
    two traces (T+1, B*T-B) at a third point."""
    la, lb = text_a.splitlines(), text_b.splitlines()
    confirm = {}

    def at_third(lno, k):
        if "lines" not in confirm:
            tc, sc = third() if third else (None, None)
            confirm["lines"] = tc.splitlines() if tc else None
            confirm["sizes"] = sc
        lc = confirm["lines"]
        if lc is None or len(lc) != len(la):
            return None
        tc = _TOKEN.findall(lc[lno])
        return (tc[k], confirm["sizes"]) if k < len(tc) and \
            _is_num(tc[k]) else None

    def fit(lno, k, x, y):
        """The one extent form of the number at token k of line lno, or
        None."""
        try:
            cands = _fits(int(x), int(y), sizes_a, sizes_b)
        except ValueError:
            return None
        if not cands:
            return None
        z = at_third(lno, k)
        if z is None:
            return None
        cands = [c for c in cands if _form_value(c[1], z[1]) == int(z[0])]
        return cands[0] if cands else None
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
            ext = key in ("shape", "end", "length", "param", "value")
            form = fit(lno, k, x, y) if ext and not hit else None
            if form and key == "value":
                c, M, P, kk = form[1]
                if c != 1 or M or (not kk and len(P) > 1):
                    form = None  # full's value is one symbol: T+1, not 2*T
            if ext and hit:
                res.append(hit[0])
            elif form:
                res.append(form[0])
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
            elif key is None and depth == 1 and lno in lit_dtypes and \
                    _is_int(x) and _is_int(y) and fit(lno, k, x, y):
                # a literal that is a sum of sizes (a mean over T-1 rows):
                # c * M * full(value=P+k)
                (_, (c, M, P, kk)) = fit(lno, k, x, y)
                inner = _form_text(1, (), P, kk)
                pre = []
                res.append(_scalar_of(c, list(M) + [inner], lit_dtypes[lno],
                                      used, scalars, pre))
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


def _is_int(tok):
    return re.match(r"^-?\d+$", tok) is not None


def _scalar_of(c, S, dt, used, scalars, pre):
    """A rank-0 value c * prod(S) of dtype dt, defined by statements appended
    to pre (once per distinct scalar)."""
    key = (c, tuple(S), dt)
    if key in scalars:
        return scalars[key]

    def fresh(base):
        return _unique(base, used)
    cur = None
    for sname in S:
        nm = fresh("size_%s_%s" % (_ident(sname, "s"), dt))
        pre.append("  %s = full(shape=[], value=%s, dtype=%s)" %
                   (nm, sname, dt))
        if cur is not None:
            nm2 = fresh("size_%s_%s" % (_ident("_".join(S), "s"), dt))
            pre.append("  %s = mul(%s, %s)" % (nm2, cur, nm))
            nm = nm2
        cur = nm
    if c != 1:
        nm = fresh("size_%s_%s" % (_ident("_".join(S), "s"), dt))
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


def _other_sizes(example_args, flat, tpos, tensors, sym, third=False):
    """Fake example arguments whose symbolic dims have other sizes (a
    third set with third=True)."""
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
    sizes_b = {nm: sizes_a[nm] + (7 + 4 * k if not third else 3 + 6 * k)
               for k, nm in enumerate(sorted(sizes_a))}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    leaves, tensors_b = list(flat), []
    for j, i in enumerate(tpos):
        t = tensors[j]
        shape = list(t.shape)
        for d, nm in sym.get(j, {}).items():
            shape[d] = sizes_b[nm]
        with mode:
            ft = torch.empty(shape, dtype=t.dtype, device=t.device)
        if t.requires_grad:
            ft.requires_grad_(True)
        leaves[i] = ft
        tensors_b.append(ft)
    args_b = pytree.tree_unflatten(leaves,
                                   pytree.tree_flatten(example_args)[1])
    return sizes_a, sizes_b, args_b, tensors_b
