"""fusec: Python binding of the fusec C library, and the PyTorch bridge.

Pure Python over libfusec through ctypes; there is no build step. Set
PYTHONPATH=tools/python and, if the library is not in the repository's build
folder or on the system path, FUSEC_LIBRARY=/path/to/libfusec.so.

    import fusec, fusec.torch
    text = fusec.torch.export(fn, x, w)        # trace text (needs PyTorch)
    prog = fusec.Program(text, device="reference")
    y = prog(x, w)                             # torch in, torch out

Program parses and verifies the text in the C library; a parse or verify
error raises FusecError carrying the library's diagnostic (FILE:LINE:COL,
the source line and a caret). A Program on a device holds one prepared
program (fz_exec): the first call at some input shapes plans the trace,
resolves its kernels through the in-memory and disk caches (FUSEC_CACHE_DIR,
else XDG_CACHE_HOME/fusec, else ~/.cache/fusec) and sizes its arena; every
later call with the same dtypes, shapes and strides only hands the library
the inputs' pointers and output tensors, which it fills in place. Devices:

  "reference"  the C reference interpreter (every op in f64, rounded to its
               dtype at its output); slow, exact, always there.
  "cpu"        generated host code (the library's "cpu" target).
  "cuda"       an NVIDIA GPU, on CUDA tensors, where the library has one.
  "emu"        the GPU's kernels emulated on the CPU, where built.
  "auto"       cuda where a device exists, else cpu.

Inputs may be torch tensors (any strides; on the program's device: a tensor
elsewhere is an error naming it) or numpy arrays; the outputs are torch
tensors when any input is one, else numpy arrays.

Outputs on the CPU. A torch output of 64 KiB or more lives in a block of
the library's host cache (fz_host_alloc), handed to torch through DLPack:
when the tensor dies the block goes back to the cache, still mapped, and
the next output of its size class reuses it without faulting a page in
(a fresh torch.empty of a large tensor is a new mapping every call, and
its page faults cost more than many kernels). host_cache_stats() says
what the cache holds; empty_host_cache() unmaps what it keeps;
set_host_cache_limit(bytes) bounds it (default a quarter of physical
memory, or $FUSEC_HOST_CACHE_MB). Such a tensor is an ordinary CPU tensor,
except that its storage cannot be resized (as with torch.from_numpy).
"""

import ctypes
import operator
import threading

from . import _lib
from ._lib import DTYPES, FusecLibraryError  # noqa: F401

__all__ = ["Program", "FusecError", "FusecLibraryError", "DEVICES",
           "host_cache_stats", "empty_host_cache", "set_host_cache_limit",
           "cpu_blas"]

DEVICES = ("reference", "cpu", "cuda", "emu", "auto")


class FusecError(RuntimeError):
    """An error reported by the fusec library: .status names the fz_status,
    the message is the library's diagnostic text."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def __getattr__(name):
    # `fusec.torch` without an explicit `import fusec.torch`; imported late
    # so that `import fusec` works where PyTorch is absent.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'fusec' has no attribute %r" % name)


def _check(lib, status, errp, what):
    if status != 0:
        msg = _lib.take_string(lib, errp.value) if errp is not None else ""
        name = lib.fz_status_name(status).decode()
        raise FusecError("%s failed (%s)%s" % (what, name,
                         (":\n" + msg.rstrip("\n")) if msg else ""), name)


# ---- Tensors in and out -----------------------------------------------------

def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


_TORCH_DTYPES = {}


def _torch_dtype_map(torch):
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({
            torch.float64: "f64", torch.float32: "f32", torch.float16: "f16",
            torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32",
            torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool"})
    return _TORCH_DTYPES


_NUMPY_DTYPES = {"float64": "f64", "float32": "f32", "float16": "f16",
                 "int64": "i64", "int32": "i32", "int8": "i8", "uint8": "u8",
                 "bool": "bool"}


def _is_torch(x):
    t = type(x)
    return t.__module__.startswith("torch") and hasattr(x, "data_ptr")


def _describe(i, x, keep, to_host=True):
    """An fz_tensor for input x; appends what must stay alive to keep. A
    torch tensor off the CPU is copied to the host when to_host."""
    ft = _lib.Tensor()
    if _is_torch(x):
        torch = _torch()
        dmap = _torch_dtype_map(torch)
        if x.dtype not in dmap:
            raise TypeError("input %d: dtype %s has no fusec dtype" %
                            (i, x.dtype))
        if x.device.type != "cpu" and to_host:
            x = x.detach().to("cpu")
        x = x.detach()
        if x.dim() > _lib.FZ_MAX_RANK:
            raise ValueError("input %d: rank %d exceeds %d" %
                             (i, x.dim(), _lib.FZ_MAX_RANK))
        keep.append(x)
        dname = dmap[x.dtype]
        ft.data = x.data_ptr() if x.numel() else None
        shape, strides = tuple(x.shape), tuple(x.stride())
    else:
        import numpy as np
        x = np.asarray(x)
        dname = _NUMPY_DTYPES.get(x.dtype.name)
        if dname is None:
            raise TypeError("input %d: dtype %s has no fusec dtype" %
                            (i, x.dtype))
        if x.ndim > _lib.FZ_MAX_RANK:
            raise ValueError("input %d: rank %d exceeds %d" %
                             (i, x.ndim, _lib.FZ_MAX_RANK))
        if any(s % x.itemsize for s in x.strides):
            x = np.ascontiguousarray(x)
        keep.append(x)
        ft.data = x.ctypes.data if x.size else None
        shape = x.shape
        strides = tuple(s // x.itemsize for s in x.strides)
    ft.dtype = _lib.DTYPE_INDEX[dname]
    ft.rank = len(shape)
    for k, (n, s) in enumerate(zip(shape, strides)):
        ft.shape[k] = n
        ft.strides[k] = s
    return ft, dname


def _take_output(lib, ft, as_torch, device):
    """Copies a library-allocated contiguous output into a fresh tensor and
    releases the library's buffer."""
    dname = _lib.DTYPES[ft.dtype]
    shape = tuple(ft.shape[k] for k in range(ft.rank))
    n = 1
    for e in shape:
        n *= e
    nbytes = n * _lib.DTYPE_SIZE[dname]
    try:
        if as_torch:
            torch = _torch()
            inv = {v: k for k, v in _torch_dtype_map(torch).items()}
            out = torch.empty(shape, dtype=inv[dname], device="cpu")
            if nbytes:
                ctypes.memmove(out.data_ptr(), ft.data, nbytes)
            return out.to(device) if device is not None else out
        import numpy as np
        if dname == "bf16":
            raise TypeError("a bf16 output needs torch (numpy has no bf16)")
        inv = {v: k for k, v in _NUMPY_DTYPES.items()}
        out = np.empty(shape, dtype=inv[dname])
        if nbytes:
            ctypes.memmove(out.ctypes.data, ft.data, nbytes)
        return out
    finally:
        if ft.data:
            lib.fz_free(ft.data)
            ft.data = None


# ---- outputs from the host cache -----------------------------------------------

HOST_CACHE_MIN = 64 << 10  # smaller outputs come from torch.empty

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _HostOutput:
    """Makes contiguous CPU torch tensors of one shape and dtype in blocks of
    the library's host cache: called once per output per run."""

    __slots__ = ("_alloc", "_dlpack", "_release", "_from", "_args", "_data",
                 "_pdata")

    def __init__(self, lib, torch, shape, dname, n):
        self._alloc, self._dlpack = lib.fz_host_alloc, lib.fz_host_block_dlpack
        self._release = lib.fz_host_release
        import torch.utils.dlpack
        self._from = torch.utils.dlpack.from_dlpack
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self._args = (n, _lib.DTYPE_INDEX[dname], len(shape), dims)
        self._data = ctypes.c_void_p()
        self._pdata = ctypes.byref(self._data)

    def __call__(self):
        n, dtype, rank, dims = self._args
        b = self._alloc(n, self._pdata)
        if not b:
            raise MemoryError("fusec: no memory for a %d-byte output" % n)
        dl = self._dlpack(b, dtype, rank, dims)
        if not dl:
            self._release(b)
            raise FusecError("the host cache cannot describe a %d-byte "
                             "output of rank %d" % (n, rank))
        cap = _capsule_new(dl, b"dltensor", None)
        try:
            return self._from(cap)
        except BaseException:
            if _capsule_valid(cap, b"dltensor"):  # torch did not take it
                self._release(b)
            raise


def _host_output(lib, torch, shape, dname):
    """A _HostOutput for a CPU output of that size, else None (torch.empty)."""
    n = _lib.DTYPE_SIZE[dname]
    for e in shape:
        n *= e
    return _HostOutput(lib, torch, shape, dname, n) \
        if n >= HOST_CACHE_MIN else None


def host_cache_stats():
    """What the library's host cache holds (bytes in blocks handed out and
    not yet released, bytes cached for reuse, the limit) and how many
    requests it served from the cache (hits) and with new memory (misses)."""
    lib = _lib.load()
    s = _lib.HostStats()
    lib.fz_host_cache_stats(ctypes.byref(s))
    return {k: int(getattr(s, k)) for k, _ in _lib.HostStats._fields_}


def cpu_blas():
    """The BLAS the "cpu" device's matrix products run on while a program
    of that device exists (None when none does): OpenBLAS in a plain
    process, the MKL that PyTorch's CPU build carries when it is already
    loaded (as aten::mm does), "none" for the built-in loop."""
    name = _lib.load().fz_cpu_blas()
    return name.decode() if name else None


def empty_host_cache():
    """Unmaps every block the host cache keeps (live outputs stay)."""
    _lib.load().fz_host_cache_empty()


def set_host_cache_limit(nbytes):
    """Keeps at most nbytes of released blocks cached from now on."""
    _lib.load().fz_host_cache_set_limit(int(nbytes))


# ---- Program ----------------------------------------------------------------

def _remake(text, device, trace, filename, cache_dir, threads):
    return Program(text, device=device, trace=trace, filename=filename,
                   cache_dir=cache_dir, threads=threads)


class Program:
    """A parsed and verified trace, ready to run on a device.

    text      the trace text (DESIGN.md); a file may hold several traces
    device    "reference" | "cpu" | "cuda" | "auto"
    trace     which trace of the file: an index or a name (default: first)
    filename  the name diagnostics use
    cache_dir the kernel cache's folder (default: FUSEC_CACHE_DIR, ...)
    threads   cpu: threads a kernel may use (default 0: all)

    Calls from several threads take turns (one run at a time). A copy
    (copy.copy, copy.deepcopy, pickle) is a Program of its own, made again
    from the same text and options.
    """

    def __init__(self, text, device="reference", trace=0,
                 filename="<trace>", cache_dir=None, threads=None):
        if device not in DEVICES:
            raise ValueError("device must be one of %s, not %r" %
                             (", ".join(DEVICES), device))
        # what a copy or an unpickled Program is made from again
        self._made_with = (text, device, trace, filename, cache_dir, threads)
        lib = self._lib = _lib.load()
        self._x = None
        # one call at a time: the library runs one fz_exec on one thread
        # at a time (and refuses a second), and a call binds its pointers
        # into the signature's shared ctypes arrays
        self._lock = threading.Lock()
        if isinstance(text, str):
            text = text.encode("utf-8")
        self._mod = ctypes.c_void_p()
        diag = ctypes.c_void_p()
        st = lib.fz_module_parse(text, len(text), filename.encode(),
                                 ctypes.byref(self._mod), ctypes.byref(diag))
        _check(lib, st, diag, "parse")
        n = lib.fz_module_count(self._mod)
        if isinstance(trace, str):
            names = [lib.fz_trace_name(lib.fz_module_trace(self._mod, i))
                     .decode() for i in range(n)]
            if trace not in names:
                raise ValueError("no trace named %r in the text (it has %s)" %
                                 (trace, ", ".join(names)))
            trace = names.index(trace)
        if not 0 <= trace < n:
            raise IndexError("trace %d of a text with %d traces" % (trace, n))
        self._t = lib.fz_module_trace(self._mod, trace)
        err = ctypes.c_void_p()
        _check(lib, lib.fz_trace_verify(self._t, ctypes.byref(err)), err,
               "verify")
        self.name = lib.fz_trace_name(self._t).decode()
        self.symbols = tuple(lib.fz_trace_symbol(self._t, i).decode() for i in
                             range(lib.fz_trace_symbol_count(self._t)))
        self.params = []
        for i in range(lib.fz_trace_param_count(self._t)):
            v = lib.fz_trace_param(self._t, i)
            nm = lib.fz_value_name(v)
            self.params.append((nm.decode() if nm else "arg%d" % i,
                                _lib.DTYPES[lib.fz_value_dtype(v)],
                                lib.fz_value_rank(v)))
        self.n_outputs = lib.fz_trace_output_count(self._t)
        self.device = device
        self._sigs = {}
        self._err = ctypes.c_void_p()
        self._errp = ctypes.byref(self._err)
        if device != "reference":
            x = ctypes.c_void_p()
            err = ctypes.c_void_p()
            opts = self._cuda_options(lib, device)
            if cache_dir is not None or threads is not None:
                if opts is None:
                    opts = _lib.ExecOptions()
                    lib.fz_exec_options_init(ctypes.byref(opts))
                if cache_dir is not None:
                    self._cache_dir = str(cache_dir).encode()
                    opts.cache_dir = self._cache_dir
                if threads is not None:
                    opts.threads = int(threads)
            _check(lib, lib.fz_exec_new(self._t, device.encode(),
                                        ctypes.byref(opts) if opts else None,
                                        ctypes.byref(x), ctypes.byref(err)),
                   err, "prepare")
            self._x = x
            self.device = lib.fz_exec_device(x).decode()

    def _cuda_options(self, lib, device):
        """For "cuda" and "auto" with torch on a GPU: the program's arenas
        come from PyTorch's caching allocator (on the current device and
        stream, so fusec and torch share one pool), the device is torch's
        current one, and f32 matmuls use TF32 only where torch allows it
        (torch.backends.cuda.matmul.allow_tf32). None otherwise."""
        if device not in ("cuda", "auto"):
            return None
        try:
            import torch
            if not torch.cuda.is_available():
                return None
        except ImportError:
            return None
        idx = torch.cuda.current_device()
        o = _lib.ExecOptions()
        lib.fz_exec_options_init(ctypes.byref(o))
        o.device = idx
        o.tf32 = int(bool(torch.backends.cuda.matmul.allow_tf32))

        def alloc(ctx, n):
            try:
                return torch.cuda.caching_allocator_alloc(
                    n, device=idx, stream=torch.cuda.current_stream(idx))
            except Exception:  # out of memory: the library says so
                return None

        def release(ctx, p):
            torch.cuda.caching_allocator_delete(p)

        # kept alive as long as the program: the library calls them
        self._alloc_cb = _lib.ALLOC_FN(alloc)
        self._release_cb = _lib.RELEASE_FN(release)
        o.alloc = ctypes.cast(self._alloc_cb, ctypes.c_void_p)
        o.release = ctypes.cast(self._release_cb, ctypes.c_void_p)
        return o

    def __reduce__(self):
        # a copy (copy.copy, deepcopy, pickle: a compiled model's deepcopy
        # for an EMA, a spawned worker) is a Program of its own, made again
        # from the same text and options: it shares no fz_exec (two owners
        # of one would free it twice) and its first call plans again
        return (_remake, self._made_with)

    def __del__(self):
        x = getattr(self, "_x", None)
        if x:
            self._lib.fz_exec_free(x)
            self._x = None
        mod = getattr(self, "_mod", None)
        if mod:
            self._lib.fz_module_free(mod)
            self._mod = None

    def profile(self, reset=False):
        """Where this program's runs spent their time, when FUSEC_PROFILE=1
        was in the environment as it was made (else no steps): {"runs": n,
        "steps": [{"region", "kind" (kernel, matmul, copy, collective,
        wait), "s" (seconds over the runs), "flop" (per run), "what"}]};
        reset=True zeroes the sums after reading them."""
        if self._x is None:
            return {"runs": 0, "steps": []}
        out = ctypes.c_void_p()
        with self._lock:
            _check(self._lib, self._lib.fz_exec_profile(
                self._x, int(bool(reset)), ctypes.byref(out)), None,
                "profile")
        rows = _lib.take_string(self._lib, out.value).splitlines()[1:]
        steps, runs = [], 0
        for line in rows:
            region, kind, n, sec, flop, what = line.split("\t", 5)
            runs = max(runs, int(n))
            steps.append({"region": int(region), "kind": kind, "s": float(sec),
                          "flop": float(flop) * int(n), "what": what})
        return {"runs": runs, "steps": steps}

    @property
    def op_count(self):
        """Primitive ops of the trace, after lowering of composites."""
        return self._lib.fz_trace_op_count(self._t)

    def text(self):
        """The trace as the library prints it."""
        out = ctypes.c_void_p()
        _check(self._lib, self._lib.fz_trace_print(self._t,
                                                   ctypes.byref(out)),
               None, "print")
        return _lib.take_string(self._lib, out.value)

    def __call__(self, *inputs, **symbols):
        """Runs the trace on inputs; symbols=sizes fixes symbolic extents
        (the rest are taken from the inputs' shapes). Returns one tensor, or
        a tuple when the trace returns several. Calls from several threads
        take turns."""
        with self._lock:
            if self._x is not None and not symbols:
                # the call path: known dtypes, shapes, strides and devices
                try:
                    sig = self._sigs.get(_signature(inputs))
                except (AttributeError, TypeError):
                    sig = None
                if sig is not None:
                    return self._run(sig, inputs)
            return self._call_slow(inputs, symbols)

    def _run(self, sig, inputs):
        ins, outs, specs, sizes, n_in, n_out, torch, stream, run = sig
        for ft, x in zip(ins, inputs):
            ft.data = x.data_ptr()
        empty = torch.empty
        if n_out == 1:  # the common case, without the lists
            shape, dt, dev, host = specs[0]
            res = (host() if host is not None else
                   empty(shape, dtype=dt) if dev is None else
                   empty(shape, dtype=dt, device=dev))
            outs[0].data = res.data_ptr()
        else:
            res = tuple([host() if host is not None else
                         empty(shape, dtype=dt) if dev is None else
                         empty(shape, dtype=dt, device=dev)
                         for shape, dt, dev, host in specs])
            for ft, o in zip(outs, res):
                ft.data = o.data_ptr()
        if stream is not None:  # cuda: the stream current now
            # a c_void_p, never a bare int: without argtypes ctypes passes
            # an int as a 32-bit C int, and the stream is the seventh
            # argument, on the stack, whose upper half would be whatever
            # libffi's stack held (a segfault in the driver, now and then)
            stream = _VOIDP(torch.cuda.current_stream(specs[0][2])
                            .cuda_stream)
        # the C function without argtypes: the arguments are ctypes objects
        # and ints that fit a C int (n_in, n_out), and converting them
        # costs more than the run
        st = run(self._x, sizes, ins.arr, n_in, outs.arr, n_out, stream,
                 self._errp)
        if st:
            _check(self._lib, st, self._err, "run")
        return res

    def _describe_all(self, inputs, keep):
        arr = (_lib.Tensor * max(1, len(inputs)))()
        as_torch, device = False, None
        for i, x in enumerate(inputs):
            if _is_torch(x) and not as_torch:
                as_torch, device = True, x.device
            if _is_torch(x) and self._x is not None:
                want = "cuda" if self.device == "cuda" else "cpu"
                if x.device.type != want:
                    raise ValueError(
                        "input %d (%s) is on %s; this program runs on %s "
                        "(device=%r)" % (i, self.params[i][0], x.device,
                                         want, self.device))
            ft, dname = _describe(i, x, keep, self.device != "cuda")
            pname, pdtype, prank = self.params[i]
            if dname != pdtype or ft.rank != prank:
                raise TypeError("input %d (%s) must be %s of rank %d, got %s "
                                "of rank %d" % (i, pname, pdtype, prank,
                                                dname, ft.rank))
            arr[i] = ft
        return arr, as_torch, device

    def _call_slow(self, inputs, symbols):
        """The first call at some signature (or with numpy inputs, or with
        explicit sizes): checks and binds in the library, then runs; a
        torch signature is kept for the call path."""
        lib = self._lib
        if len(inputs) != len(self.params):
            raise TypeError("trace %s takes %d inputs (%s), got %d" %
                            (self.name, len(self.params),
                             ", ".join(p[0] for p in self.params),
                             len(inputs)))
        keep = []
        arr, as_torch, device = self._describe_all(inputs, keep)
        nsym = len(self.symbols)
        sizes = (ctypes.c_int64 * max(1, nsym))(*([-1] * max(1, nsym)))
        for k, v in symbols.items():
            if k not in self.symbols:
                raise TypeError("trace %s has no symbolic extent %r" %
                                (self.name, k))
            sizes[self.symbols.index(k)] = int(v)
        err = ctypes.c_void_p()
        _check(lib, lib.fz_trace_bind(self._t, arr, len(inputs), sizes,
                                      ctypes.byref(err)), err, "bind")
        if self._x is None:
            return self._interpret(arr, sizes, inputs, as_torch, device)
        # output shapes at the bound sizes, and tensors for them
        specs = []
        for k in range(self.n_outputs):
            v = lib.fz_trace_output(self._t, k)
            shape = tuple(lib.fz_value_extent(v, d, sizes)
                          for d in range(lib.fz_value_rank(v)))
            specs.append((shape, _lib.DTYPES[lib.fz_value_dtype(v)]))
        outs = (_lib.Tensor * max(1, self.n_outputs))()
        res = []
        torch = _torch() if as_torch else None
        tdev = device if (device is not None and self.device == "cuda") \
            else "cpu"
        tspecs = []
        for k, (shape, dname) in enumerate(specs):
            if as_torch:
                inv = {v: key for key, v in _torch_dtype_map(torch).items()}
                host = (_host_output(lib, torch, shape, dname)
                        if tdev == "cpu" else None)
                o = (host() if host is not None else
                     torch.empty(shape, dtype=inv[dname], device=tdev))
                tspecs.append((shape, inv[dname], tdev, host))
                ptr = o.data_ptr()
            else:
                import numpy as np
                if dname == "bf16":
                    raise TypeError("a bf16 output needs torch (numpy has "
                                    "no bf16)")
                ninv = {v: key for key, v in _NUMPY_DTYPES.items()}
                o = np.empty(shape, dtype=ninv[dname])
                ptr = o.ctypes.data
            res.append(o)
            ft = outs[k]
            ft.data = ptr
            ft.dtype = _lib.DTYPE_INDEX[dname]
            ft.rank = len(shape)
            acc = 1
            for d in range(len(shape) - 1, -1, -1):
                ft.shape[d] = shape[d]
                ft.strides[d] = acc
                acc *= shape[d]
        stream = None
        if self.device == "cuda" and as_torch:
            stream = torch.cuda.current_stream(device).cuda_stream
        err = ctypes.c_void_p()
        st = lib.fz_exec_run(self._x, sizes, arr, len(inputs), outs,
                             self.n_outputs, stream, ctypes.byref(err))
        _check(lib, st, err, "run")
        if as_torch and not symbols and all(_is_torch(x) for x in inputs):
            if self.device != "cuda":
                tspecs = [(shape, dt, None, host)
                          for shape, dt, _, host in tspecs]
            self._sigs[_signature(inputs)] = _Signature(
                arr, outs, tspecs, sizes, len(inputs), self.n_outputs, torch,
                stream, _lib.run_fn(lib))
        del keep
        return res[0] if self.n_outputs == 1 else tuple(res)

    def _interpret(self, arr, sizes, inputs, as_torch, device):
        lib = self._lib
        outs = (_lib.Tensor * max(1, self.n_outputs))()
        err = ctypes.c_void_p()
        st = lib.fz_trace_interpret(self._t, sizes, arr, len(inputs), outs,
                                    self.n_outputs, ctypes.byref(err))
        if st != 0:
            for k in range(self.n_outputs):
                if outs[k].data:
                    lib.fz_free(outs[k].data)
        _check(lib, st, err, "run")
        dev = device if (device is not None and device.type != "cpu") \
            else None
        res = [_take_output(lib, outs[k], as_torch, dev)
               for k in range(self.n_outputs)]
        return res[0] if self.n_outputs == 1 else tuple(res)


_VOIDP = ctypes.c_void_p
_META = operator.attrgetter("dtype", "shape", "device")
_STRIDE = operator.methodcaller("stride")


def _signature(inputs):
    """What decides a prepared call: each input's dtype, shape, device and
    strides (C-level getters: this runs on every call)."""
    return tuple(map(_META, inputs)), tuple(map(_STRIDE, inputs))


class _Signature(tuple):
    """What the call path reuses for one input signature: the fz_tensor
    arrays (only .data changes per call), the outputs' shapes and dtypes,
    the bound sizes, the stream and fz_exec_run."""

    def __new__(cls, in_arr, out_arr, specs, sizes, n_in, n_out, torch,
                stream, run):
        ins = _Elems(in_arr, n_in)
        outs = _Elems(out_arr, n_out)
        return tuple.__new__(cls, (ins, outs, tuple(specs), sizes, n_in,
                                   n_out, torch, stream, run))


class _Elems(list):
    """The elements of a ctypes array of fz_tensor (views of its memory),
    with the array itself as .arr."""

    def __init__(self, arr, n):
        super().__init__(arr[i] for i in range(n))
        self.arr = arr


def check(text, filename="<trace>"):
    """Parses and verifies every trace of text; raises FusecError with the
    diagnostics, returns the number of traces."""
    lib = _lib.load()
    if isinstance(text, str):
        text = text.encode("utf-8")
    mod = ctypes.c_void_p()
    diag = ctypes.c_void_p()
    _check(lib, lib.fz_module_parse(text, len(text), filename.encode(),
                                    ctypes.byref(mod), ctypes.byref(diag)),
           diag, "parse")
    try:
        n = lib.fz_module_count(mod)
        for i in range(n):
            err = ctypes.c_void_p()
            _check(lib, lib.fz_trace_verify(lib.fz_module_trace(mod, i),
                                            ctypes.byref(err)), err,
                   "verify")
        return n
    finally:
        lib.fz_module_free(mod)
