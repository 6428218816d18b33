"""_lib: the ctypes view of libfusec (include/fusec.h).

This module only finds the shared library and declares the C signatures that
the binding uses; everything with behaviour lives in fusec/__init__.py.

Where the library comes from, first hit wins:
  1. $FUSEC_LIBRARY, a path to libfusec.so (an explicit choice: a
     sanitized build, another build folder);
  2. the package's own folder (fusec/libfusec.so, put there by
     `pip install .`);
  3. the repository's build folder (build/libfusec.so beside tools/: the
     source tree, or an editable install of it);
  4. the system library path (ctypes.util.find_library("fusec")).
When none loads, FusecLibraryError names every place that was tried and why
it failed, so a missing build is one clear message, not a ctypes traceback.
"""

import ctypes
import ctypes.util
import os

FZ_MAX_RANK = 8

# fz_dtype, in the enum's order.
DTYPES = ("f64", "f32", "f16", "bf16", "i64", "i32", "i8", "u8", "bool")
DTYPE_INDEX = {name: i for i, name in enumerate(DTYPES)}
DTYPE_SIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4,
              "i8": 1, "u8": 1, "bool": 1}

STATUS = ("FZ_OK", "FZ_EPARSE", "FZ_EVERIFY", "FZ_EBIND", "FZ_ERANGE",
          "FZ_ENOMEM", "FZ_EIO", "FZ_EINVAL", "FZ_EUNSUPPORTED",
          "FZ_ERUNTIME")


class FusecLibraryError(ImportError):
    """libfusec could not be found or loaded."""


class Tensor(ctypes.Structure):
    """fz_tensor: a strided view of memory; strides count elements."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * FZ_MAX_RANK),
        ("strides", ctypes.c_int64 * FZ_MAX_RANK),
    ]


class ExecOptions(ctypes.Structure):
    """fz_exec_options (include/fusec.h)."""
    _fields_ = [
        ("disk_cache", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("max_plans", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("device", ctypes.c_int),
        ("tf32", ctypes.c_int),
        ("alloc", ctypes.c_void_p),
        ("release", ctypes.c_void_p),
        ("alloc_ctx", ctypes.c_void_p),
        ("warn", ctypes.c_void_p),
        ("warn_ctx", ctypes.c_void_p),
    ]


class HostStats(ctypes.Structure):
    """fz_host_stats (include/fusec.h)."""
    _fields_ = [
        ("live_bytes", ctypes.c_size_t),
        ("cached_bytes", ctypes.c_size_t),
        ("limit_bytes", ctypes.c_size_t),
        ("hits", ctypes.c_int64),
        ("misses", ctypes.c_int64),
    ]


# fz_exec_options.alloc and .release: the caller's allocator for arenas.
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


def _candidates():
    env = os.environ.get("FUSEC_LIBRARY")
    if env:
        yield "$FUSEC_LIBRARY", env
    here = os.path.dirname(os.path.abspath(__file__))
    yield "the fusec package", os.path.join(here, "libfusec.so")
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield "repository build folder", os.path.join(repo, "build", "libfusec.so")
    found = ctypes.util.find_library("fusec")
    yield "system library path", found or "libfusec.so"


def _declare(lib):
    P = ctypes.c_void_p
    S = ctypes.c_int  # fz_status
    pchar = ctypes.POINTER(ctypes.c_char_p)
    i64p = ctypes.POINTER(ctypes.c_int64)
    tens = ctypes.POINTER(Tensor)
    sigs = {
        "fz_status_name": (ctypes.c_char_p, [S]),
        "fz_kernel_builds": (ctypes.c_int64, []),
        "fz_free": (None, [P]),
        "fz_module_parse": (S, [ctypes.c_char_p, ctypes.c_size_t,
                                ctypes.c_char_p, ctypes.POINTER(P), P]),
        "fz_module_free": (None, [P]),
        "fz_module_count": (ctypes.c_int, [P]),
        "fz_module_trace": (P, [P, ctypes.c_int]),
        "fz_module_print": (S, [P, P]),
        "fz_trace_name": (ctypes.c_char_p, [P]),
        "fz_trace_verify": (S, [P, P]),
        "fz_trace_print": (S, [P, P]),
        "fz_trace_param_count": (ctypes.c_int, [P]),
        "fz_trace_param": (P, [P, ctypes.c_int]),
        "fz_trace_output_count": (ctypes.c_int, [P]),
        "fz_trace_output": (P, [P, ctypes.c_int]),
        "fz_trace_op_count": (ctypes.c_int, [P]),
        "fz_trace_symbol_count": (ctypes.c_int, [P]),
        "fz_trace_symbol": (ctypes.c_char_p, [P, ctypes.c_int]),
        "fz_value_dtype": (ctypes.c_int, [P]),
        "fz_value_rank": (ctypes.c_int, [P]),
        "fz_value_name": (ctypes.c_char_p, [P]),
        "fz_value_extent": (ctypes.c_int64, [P, ctypes.c_int, i64p]),
        "fz_trace_bind": (S, [P, tens, ctypes.c_int, i64p, P]),
        "fz_trace_interpret": (S, [P, i64p, tens, ctypes.c_int, tens,
                                   ctypes.c_int, P]),
        "fz_trace_run": (S, [P, ctypes.c_char_p, i64p, tens, ctypes.c_int,
                             tens, ctypes.c_int, P]),
        "fz_exec_options_init": (None, [ctypes.POINTER(ExecOptions)]),
        "fz_exec_new": (S, [P, ctypes.c_char_p, ctypes.POINTER(ExecOptions),
                            ctypes.POINTER(P), P]),
        "fz_exec_run": (S, [P, i64p, tens, ctypes.c_int, tens, ctypes.c_int,
                            P, P]),
        "fz_exec_sync": (S, [P, P, P]),
        "fz_exec_free": (None, [P]),
        "fz_exec_device": (ctypes.c_char_p, [P]),
        "fz_exec_profile": (S, [P, ctypes.c_int, P]),
        "fz_nccl_unique_id": (S, [ctypes.c_char_p, P]),
        "fz_host_alloc": (P, [ctypes.c_size_t, ctypes.POINTER(P)]),
        "fz_host_release": (None, [P]),
        "fz_host_block_dlpack": (P, [P, ctypes.c_int, ctypes.c_int, i64p]),
        "fz_host_cache_stats": (None, [ctypes.POINTER(HostStats)]),
        "fz_host_cache_set_limit": (None, [ctypes.c_size_t]),
        "fz_host_cache_empty": (None, []),
        "fz_cpu_blas": (ctypes.c_char_p, []),
    }
    missing = []
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name, None)
        if fn is None:
            missing.append(name)
            continue
        fn.restype = res
        fn.argtypes = args
    del pchar
    return missing


_LIB = None


def load():
    """The loaded library (cached), or FusecLibraryError naming what was
    tried."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for where, path in _candidates():
        if where != "system library path" and not os.path.exists(path):
            tried.append("%s: %s (no such file)" % (where, path))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (where, path, e))
            continue
        missing = _declare(lib)
        if missing:
            tried.append("%s: %s (lacks %s)" % (where, path,
                                                ", ".join(missing)))
            continue
        _LIB = lib
        return lib
    raise FusecLibraryError(
        "cannot load libfusec; tried:\n  " + "\n  ".join(tried) +
        "\nbuild it with `cmake -S . -B build && cmake --build build` "
        "or point $FUSEC_LIBRARY at libfusec.so")


_RUN = {}


def run_fn(lib):
    """fz_exec_run without argtypes, for the call path (its callers pass
    ctypes objects and ints, which need no conversion)."""
    fn = _RUN.get(id(lib))
    if fn is None:
        fn = _RUN[id(lib)] = ctypes.CDLL(lib._name).fz_exec_run
        fn.restype = ctypes.c_int
    return fn


def take_string(lib, p):
    """Decodes a heap string the library returned and releases it."""
    if not p:
        return ""
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib.fz_free(p)
