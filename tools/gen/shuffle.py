#!/usr/bin/env python3
"""Write a renamed and reordered copy of a trace file: same computation,
other value names, independent statements in another order.

The structural cache keys a fusion region by what it computes, blind to
value names and to the written order of independent statements; this is
the copy that tests it (tests/cache_run.sh): after the original is
compiled or run, the copy must compile nothing.

    python3 tools/gen/shuffle.py IN.trace [--seed N] [-o OUT.trace]

What changes, deterministically for a seed:
  - every value name (parameters, statement results) becomes `vN`, with N
    drawn from a permutation, so names do not follow the written order;
  - the statements of each trace are written in a random topological order
    of their data dependences (Kahn's algorithm, a seeded random choice
    among the ready statements), so every value is still defined before
    it is used.
What stays: parameter order and types, symbolic extent names (so --bind
works on both files), attribute keys and values, op names, comments
(dropped). A statement may span lines; it ends where its parentheses and
brackets balance.
"""
import argparse
import random
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip_comment(line):
    i = line.find("#")
    return line if i < 0 else line[:i]


def rename_expr(text, names):
    """Renames the identifiers of text that are value names; an identifier
    followed by '(' is an op, one followed by '=' an attribute key."""
    out, pos = [], 0
    for m in IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if (word in names and not rest.startswith("(")
                and not (rest.startswith("=") and not rest.startswith("=="))):
            out.append(text[pos:m.start()])
            out.append(names[word])
            pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def used(text, names):
    """The value names an expression reads."""
    got = []
    for m in IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if (word in names and not rest.startswith("(")
                and not (rest.startswith("=") and not rest.startswith("=="))):
            got.append(word)
    return got


def balanced(text):
    return text.count("(") == text.count(")") and text.count("[") == text.count("]")


def shuffle_trace(header, stmts, ret, rng):
    # header: "trace NAME(params) [world N] {"; params "name: type"
    open_i, close_i = header.index("("), header.rindex(")")
    params = header[open_i + 1:close_i]
    pnames = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*:", params)
    defs = []  # per statement: names it defines, expression
    for s in stmts:
        eq = s.index("=")
        lhs = [n.strip() for n in s[:eq].split(",")]
        defs.append((lhs, s[eq + 1:].strip()))
    values = pnames + [n for lhs, _ in defs for n in lhs]
    perm = list(range(len(values)))
    rng.shuffle(perm)
    names = {v: "v%d" % perm[i] for i, v in enumerate(values)}

    # data dependences, then a random topological order
    producer = {}
    for i, (lhs, _) in enumerate(defs):
        for n in lhs:
            producer[n] = i
    deps = [set(producer[u] for u in used(expr, names) if u in producer)
            for _, expr in defs]
    users = [[] for _ in defs]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    order = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    assert len(order) == len(defs), "the statements have a cycle"

    new_params = rename_expr(params, {p: names[p] for p in pnames})
    out = [header[:open_i + 1] + new_params + header[close_i:]]
    for i in order:
        lhs, expr = defs[i]
        out.append("  %s = %s" % (", ".join(names[n] for n in lhs),
                                  rename_expr(expr, names)))
    out.append("  return " + rename_expr(ret, names))
    out.append("}")
    return "\n".join(out) + "\n"


def shuffle_text(text, seed):
    rng = random.Random(seed)
    lines = [strip_comment(l).rstrip() for l in text.splitlines()]
    out, i = [], 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line:
            continue
        if not line.startswith("trace"):
            raise SystemExit("shuffle.py: expected 'trace', got: " + line)
        header = line
        while not header.endswith("{"):
            header += " " + lines[i].strip()
            i += 1
        stmts, ret = [], None
        while True:
            s = lines[i].strip()
            i += 1
            if not s:
                continue
            while not balanced(s):
                s += " " + lines[i].strip()
                i += 1
            if s.startswith("return"):
                ret = s[len("return"):].strip()
                break
            stmts.append(s)
        while not lines[i].strip():
            i += 1
        if lines[i].strip() != "}":
            raise SystemExit("shuffle.py: expected '}' after return")
        i += 1
        out.append(shuffle_trace(header, stmts, ret, rng))
    return "# shuffled copy (tools/gen/shuffle.py --seed %d)\n" % seed + "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    with open(a.trace) as f:
        text = shuffle_text(f.read(), a.seed)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
