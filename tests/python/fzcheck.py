"""Shared by the Python tests: skip (exit 77) without PyTorch, find the
binding, and compare fusec's outputs with PyTorch's.

The tests import the installed fusec package (./setup.sh --test installs
it into .venv, editable); where none is installed, the source tree's
tools/python. The library is the build tree's where ctest names it
(FUSEC_LIBRARY)."""

import atexit
import importlib.metadata
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
try:
    importlib.metadata.distribution("fusec")
    INSTALLED = True
except importlib.metadata.PackageNotFoundError:
    INSTALLED = False
    sys.path.insert(0, os.path.join(ROOT, "tools", "python"))


def need_torch():
    """Exit 77 (ctest's SKIP_RETURN_CODE) when PyTorch is absent."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: PyTorch is not installed (pip install torch)")
        sys.exit(77)


def scratch_dir(prefix):
    """A new directory under the system's temporary one, removed with
    everything in it when the test process exits (a test's cache of
    compiled kernels and exported texts: 1 MB each, and ctest runs the
    Python tests on every build)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


def rel_err(got, want):
    """(norm-wise, max-wise) relative error of got against want:
    ||got - want||_2 / ||want||_2 and max|got - want| / max|want|."""
    g, w = got.double(), want.double()
    d = (g - w)
    nw = w.norm().item() or 1.0
    mw = w.abs().max().item() or 1.0
    return d.norm().item() / nw, d.abs().max().item() / mw


def worst(outs, refs):
    if not isinstance(outs, (tuple, list)):
        outs, refs = (outs,), (refs,)
    assert len(outs) == len(refs), (len(outs), len(refs))
    en = em = 0.0
    for o, r in zip(outs, refs):
        assert tuple(o.shape) == tuple(r.shape), (o.shape, r.shape)
        assert o.dtype == r.dtype, (o.dtype, r.dtype)
        a, b = rel_err(o, r.detach())
        en, em = max(en, a), max(em, b)
    return en, em


# Tolerances of the issue: relative error against PyTorch.
TOL = {"float32": 1e-5, "bfloat16": 1e-2}
