"""fusec.Program: parse, verify, bind, run on the reference interpreter."""

import sys
import unittest

import fzcheck

fzcheck.need_torch()

import torch  # noqa: E402

import fusec  # noqa: E402

RMS = """
trace rms(x: f32[B, 8], w: f32[8]) {
  ms = sum(mul(x, x), dims=[1], keepdim=true)
  r = rsqrt(add(div(ms, 8), 1e-5))
  y = mul(mul(x, r), w)
  return y, ms
}
"""


def rms(x, w):
    ms = (x * x).sum(1, keepdim=True)
    return x * torch.rsqrt(ms / 8 + 1e-5) * w, ms


BF16_PRODUCTS = """
import sys
sys.path[:0] = %r
import torch
import fusec
p = fusec.Program(\"\"\"trace mm(a: bf16[70, 1], b: bf16[1, 13],
    x: bf16[129, 64], w: bf16[40, 64], bias: bf16[40],
    c: bf16[3, 33, 20], d: bf16[20, 17], e: bf16[1, 300], f: bf16[50, 300],
    g: bf16[9, 0], h: bf16[0, 5], q: bf16[20, 33], s: bf16[20, 7]) {
  y1 = matmul(a, b)
  y2 = linear(x, w, bias)
  y3 = matmul(c, d)
  y4 = linear(e, f)
  y5 = matmul(g, h)
  y6 = matmul(transpose(q, 0, 1), s)
  return y1, y2, y3, y4, y5, y6
}\"\"\", device="cpu")
if not torch.backends.mkl.is_available():
    p(*[torch.zeros(s).bfloat16() for s in ((70, 1), (1, 13), (129, 64),
        (40, 64), (40,), (3, 33, 20), (20, 17), (1, 300), (50, 300), (9, 0),
        (0, 5), (20, 33), (20, 7))])
    print("no mkl")
    sys.exit(0)
torch.manual_seed(0)
r = lambda *s: torch.randn(*s).bfloat16()
a, b = r(70, 1), r(13, 1).t()              # b a transposed view
x, w, bias = r(64, 129).t(), r(40, 64), r(40)
c, d = r(3, 33, 40)[:, :, ::2], r(20, 17)  # c strided
e, f = r(1, 300), r(50, 300)
g, h = r(9, 0), r(0, 5)
q, s = r(20, 33), r(20, 7)                 # q read transposed
y1, y2, y3, y4, y5, y6 = p(a, b, x, w, bias, c, d, e, f, g, h, q, s)
print(fusec.cpu_blas())
assert torch.equal(y1, (a.double() @ b.double()).bfloat16())
# two bf16 ulps, and where a sum cancels to near 0, its f32 sums' order
# (K 300 products of |x| ~ 1: ~K 2^-24 sum|x w| apart) rounded to bf16
near = lambda got, want: torch.testing.assert_close(
    got.float(), want.bfloat16().float(), rtol=2 ** -7, atol=1e-3)
near(y2, x.float() @ w.float().t() + bias.float())
near(y3, c.float() @ d.float())
near(y4, e.float() @ f.float().t())
assert torch.equal(y5, torch.zeros(9, 5).bfloat16())
near(y6, q.float().t() @ s.float())
""" % (list(sys.path),)


class TestProgram(unittest.TestCase):
    def test_run_matches_torch(self):
        p = fusec.Program(RMS)
        self.assertEqual(p.name, "rms")
        self.assertEqual(p.symbols, ("B",))
        self.assertEqual([q[0] for q in p.params], ["x", "w"])
        x, w = torch.randn(5, 8), torch.randn(8)
        y, ms = p(x, w)
        ry, rms_ = rms(x, w)
        self.assertIsInstance(y, torch.Tensor)
        self.assertEqual(tuple(y.shape), (5, 8))
        torch.testing.assert_close(y, ry, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ms, rms_, rtol=1e-5, atol=1e-6)

    def test_cpu_device_runs_generated_code(self):
        ref, cpu = fusec.Program(RMS), fusec.Program(RMS, device="cpu")
        self.assertEqual(cpu.device, "cpu")
        for b in (1, 3, 17):
            x, w = torch.randn(b, 8), torch.randn(8)
            for got, want in zip(cpu(x, w), rms(x, w)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            for got, want in zip(cpu(x, w), ref(x, w)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        p = fusec.Program("trace t(x: f32[4], i: i64[1]) {\n"
                          "  y = take(x, i, dim=0)\n  return y\n}\n",
                          device="cpu")
        with self.assertRaises(fusec.FusecError):
            p(torch.randn(4), torch.tensor([9]))

    def test_symbol_rebinds_per_call(self):
        p = fusec.Program(RMS)
        for b in (1, 3, 7):
            x, w = torch.randn(b, 8), torch.randn(8)
            self.assertEqual(tuple(p(x, w)[0].shape), (b, 8))

    def test_strided_input(self):
        p = fusec.Program(RMS)
        base = torch.randn(8, 10)
        x = base.t()[:, :8][:6]          # non-contiguous view
        self.assertFalse(x.is_contiguous())
        w = torch.randn(16)[::2]         # stride 2
        torch.testing.assert_close(p(x, w)[0], rms(x, w)[0], rtol=1e-5,
                                   atol=1e-6)

    def test_bf16_and_int(self):
        p = fusec.Program("trace t(x: bf16[4], i: i64[3]) {\n"
                          "  y = take(x, i, dim=0)\n  return y\n}\n")
        x = torch.randn(4).bfloat16()
        i = torch.tensor([3, 0, 2])
        self.assertTrue(torch.equal(p(x, i), x[i]))

    def test_parse_error_has_diagnostic(self):
        with self.assertRaises(fusec.FusecError) as cm:
            fusec.Program("trace t(x: f32[2]) {\n  y = nosuchop(x)\n"
                          "  return y\n}\n", filename="bad.trace")
        msg = str(cm.exception)
        self.assertIn("bad.trace:2:", msg)
        self.assertIn("nosuchop", msg)
        self.assertIn("^", msg)

    def test_verify_error(self):
        with self.assertRaises(fusec.FusecError):
            fusec.Program("trace t(x: f32[2], y: f16[2]) {\n"
                          "  z = add(x, y)\n  return z\n}\n")

    def test_wrong_inputs(self):
        p = fusec.Program(RMS)
        with self.assertRaises(TypeError):
            p(torch.randn(2, 8))
        with self.assertRaises(TypeError):
            p(torch.randn(2, 8).double(), torch.randn(8))
        with self.assertRaises(fusec.FusecError):
            p(torch.randn(2, 7), torch.randn(8))   # 7 is not 8

    def test_out_of_range_index_is_an_error(self):
        p = fusec.Program("trace t(x: f32[4], i: i64[1]) {\n"
                          "  y = take(x, i, dim=0)\n  return y\n}\n")
        with self.assertRaises(fusec.FusecError):
            p(torch.randn(4), torch.tensor([9]))

    def test_devices(self):
        if torch.cuda.is_available():
            self.assertEqual(fusec.Program(RMS, device="cuda").device, "cuda")
            self.assertEqual(fusec.Program(RMS, device="auto").device, "cuda")
        else:
            # no GPU: a clear error for cuda, the CPU for auto
            with self.assertRaises(fusec.FusecError) as cm:
                fusec.Program(RMS, device="cuda")
            self.assertIn("no CUDA device", str(cm.exception))
            self.assertEqual(fusec.Program(RMS, device="auto").device, "cpu")
        with self.assertRaises(ValueError):
            fusec.Program(RMS, device="tpu")

    def test_emu_device_runs_the_gpu_kernels(self):
        ref, emu = fusec.Program(RMS), fusec.Program(RMS, device="emu")
        self.assertEqual(emu.device, "emu")
        for b in (1, 3, 17):
            x, w = torch.randn(b, 8), torch.randn(8)
            for got, want in zip(emu(x, w), ref(x, w)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    def test_trace_by_name(self):
        text = RMS + "trace neg1(x: f32[3]) {\n  y = neg(x)\n  return y\n}\n"
        p = fusec.Program(text, trace="neg1")
        self.assertTrue(torch.equal(p(torch.ones(3)), -torch.ones(3)))
        self.assertEqual(fusec.check(text), 2)

    def test_library_error_names_what_was_tried(self):
        from fusec import _lib
        self.assertTrue(issubclass(_lib.FusecLibraryError, ImportError))
        tried = [w for w, _ in _lib._candidates()]
        self.assertIn("repository build folder", tried)


class TestPrepared(unittest.TestCase):
    """device="cpu": one prepared program, outputs allocated by torch."""

    def test_call_path_reuses_the_signature(self):
        p = fusec.Program(RMS, device="cpu")
        x, w = torch.randn(5, 8), torch.randn(8)
        for _ in range(3):
            y, ms = p(x, w)
            ry, rms_ = rms(x, w)
            torch.testing.assert_close(y, ry, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(ms, rms_, rtol=1e-5, atol=1e-6)
        self.assertEqual(len(p._sigs), 1)
        # fresh outputs per call, never the inputs' memory
        y2, _ = p(x, w)
        self.assertNotEqual(y2.data_ptr(), y.data_ptr())
        # another batch size: another signature, another plan
        x3 = torch.randn(3, 8)
        torch.testing.assert_close(p(x3, w)[0], rms(x3, w)[0], rtol=1e-5,
                                   atol=1e-6)
        self.assertEqual(len(p._sigs), 2)

    def test_calls_from_threads_take_turns(self):
        # a framework serving requests calls one compiled program from
        # several threads; the library runs one fz_exec on one thread at a
        # time, so the calls must queue, each with its own sizes, and never
        # compute in one another's plan (before: wrong rows in most calls,
        # now and then a corrupted heap)
        import threading
        p = fusec.Program(RMS, device="cpu")
        g = torch.Generator().manual_seed(3)
        w = torch.randn(8, generator=g)
        xs = [torch.randn(8000 + 2000 * k, 8, generator=g) for k in range(4)]
        want = [rms(x, w)[0] for x in xs]
        bad = []

        def work(k):
            for r in range(40):
                i = (k + r) % len(xs)
                try:
                    y, _ = p(xs[i], w)
                except fusec.FusecError as e:  # a thread's own, not raised
                    bad.append((k, r, str(e)))
                    continue
                if not torch.allclose(y, want[i], rtol=1e-5, atol=1e-6):
                    bad.append((k, r, "wrong values"))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(bad, [])
        self.assertEqual(len(p._sigs), 4)

    def test_a_forked_child_runs_the_program(self):
        # a DataLoader worker, or a server's worker forked after the model
        # was warmed up, calls a program of its parent's: the pool's
        # threads (or the OpenMP team's) stayed in the parent, where the
        # child's first launch used to wait for them forever
        import os
        import signal
        import time
        p = fusec.Program(RMS, device="cpu")
        g = torch.Generator().manual_seed(4)
        x, w = torch.randn(20000, 8, generator=g), torch.randn(8, generator=g)
        torch.testing.assert_close(p(x, w)[0], rms(x, w)[0], rtol=1e-5,
                                   atol=1e-6)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                torch.set_num_threads(1)  # as DataLoader's workers do
                ok = all(torch.allclose(p(x[:n], w)[0], rms(x[:n], w)[0],
                                        rtol=1e-5, atol=1e-6)
                         for n in (20000, 7000))
                q = fusec.Program(RMS.replace("1e-5", "1e-3"), device="cpu")
                ok = ok and torch.allclose(q(x, w)[1], rms(x, w)[1])
                code = 0 if ok else 2
            finally:
                os._exit(code)
        end = time.monotonic() + 120
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() > end:
                break
            time.sleep(0.05)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self.fail("the forked child hung in the program")
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        # and the parent's threads are as they were
        torch.testing.assert_close(p(x, w)[0], rms(x, w)[0], rtol=1e-5,
                                   atol=1e-6)

    def test_copies_are_programs_of_their_own(self):
        # copy.copy used to share the fz_exec (freed twice: a segfault when
        # both died), deepcopy and pickle raised ctypes' errors
        import copy
        import gc
        import pickle
        p = fusec.Program(RMS, device="cpu", threads=1)
        x, w = torch.randn(6, 8), torch.randn(8)
        p(x, w)
        copies = [copy.copy(p), copy.deepcopy(p),
                  pickle.loads(pickle.dumps(p))]
        del p
        gc.collect()
        for q in copies:
            self.assertEqual(q.device, "cpu")
            self.assertEqual(q.params, [("x", "f32", 2), ("w", "f32", 1)])
            torch.testing.assert_close(q(x, w)[0], rms(x, w)[0], rtol=1e-5,
                                       atol=1e-6)
        self.assertEqual(len({q._x.value for q in copies}), 3)

    def test_large_outputs_come_from_the_host_cache(self):
        # 64 KiB or more: a block of the library's cache, which comes back
        # when the tensor dies and serves the next call, already mapped
        p = fusec.Program(RMS, device="cpu")
        x, w = torch.randn(4096, 8), torch.randn(8)   # y: 128 KiB, ms: 16
        s0 = fusec.host_cache_stats()
        y, ms = p(x, w)
        before = fusec.host_cache_stats()
        # y's block; ms (16 KiB) is torch's own memory
        self.assertEqual(before["live_bytes"], s0["live_bytes"] + (128 << 10))
        ptr = y.data_ptr()
        del y
        after = fusec.host_cache_stats()
        self.assertEqual(after["live_bytes"], before["live_bytes"] - (128 << 10))
        y, ms2 = p(x, w)
        self.assertEqual(y.data_ptr(), ptr)
        self.assertEqual(fusec.host_cache_stats()["hits"], after["hits"] + 1)
        torch.testing.assert_close(y, rms(x, w)[0], rtol=1e-5, atol=1e-6)
        # an ordinary tensor: views, in-place work, autograd's inputs
        self.assertTrue(y.is_contiguous())
        self.assertEqual(y.device.type, "cpu")
        v = y.view(-1)[:8]
        v.mul_(2)
        self.assertEqual(y[0, 0].item(), v[0].item())
        z = y.clone().requires_grad_()
        (z * 2).sum().backward()
        self.assertTrue(bool((z.grad == 2).all()))
        # a view keeps the block: it comes back only when the last view dies
        live = fusec.host_cache_stats()["live_bytes"]
        del y
        self.assertEqual(fusec.host_cache_stats()["live_bytes"], live)
        del v
        self.assertEqual(fusec.host_cache_stats()["live_bytes"],
                         live - (128 << 10))
        fusec.empty_host_cache()
        self.assertEqual(fusec.host_cache_stats()["cached_bytes"], 0)

    def test_products_on_the_process_mkl(self):
        # PyTorch's CPU build carries MKL (aten::mm runs on it): fusec's
        # products inside this process run there too, and leave MKL's
        # thread setting of the calling thread as they found it
        p = fusec.Program("trace mm(a: f32[M, K], b: f32[K, N], "
                          "c: bf16[3, M, K], d: bf16[3, K, N]) {\n"
                          "  y = matmul(a, b)\n  z = matmul(c, d)\n"
                          "  return y, z\n}\n", device="cpu")
        a, b = torch.randn(300, 200), torch.randn(200, 260)
        c = torch.randn(3, 300, 200).bfloat16()
        d = torch.randn(3, 200, 260).bfloat16()
        if not torch.backends.mkl.is_available():
            y, z = p(a, b, c, d)
            self.assertNotIn("mkl", fusec.cpu_blas())
            self.skipTest("this PyTorch has no MKL")
        import ctypes
        import os
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib",
                                       "libtorch_cpu.so"))
        before = lib.MKL_Get_Max_Threads()
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = lib.MKL_Get_Max_Threads()
            y, z = p(a, b, c, d)
            self.assertEqual(lib.MKL_Get_Max_Threads(), one)
        finally:
            torch.set_num_threads(threads)
        self.assertEqual(lib.MKL_Get_Max_Threads(), before)
        self.assertTrue(fusec.cpu_blas().startswith("mkl"), fusec.cpu_blas())
        torch.testing.assert_close(y, a @ b, rtol=1e-4, atol=1e-4)
        # bf16: f32 sums of exact products, rounded once (as torch's CPU mm)
        want = (c.float() @ d.float()).bfloat16()
        torch.testing.assert_close(z, want, rtol=1e-2, atol=1e-2)

    def test_bf16_products_in_bf16(self):
        # where the process's MKL has a bf16 product (gemm_bf16bf16f32),
        # bf16 operands go to it as they lie (by default only on a CPU
        # with bf16 arithmetic; FUSEC_BLAS_BF16=1 takes it on any):
        # transposed and strided operands, a broadcast batch, a bias, one row,
        # K = 0, each against f32 sums rounded once; at K = 1 every
        # product is exact, so the result is the reference's bit for bit
        import os
        import subprocess
        env = dict(os.environ, FUSEC_BLAS_BF16="1")
        r = subprocess.run([sys.executable, "-c", BF16_PRODUCTS], env=env,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        if "no mkl" in r.stdout:
            self.skipTest("this PyTorch has no MKL")
        self.assertIn("bf16 products in bf16", r.stdout)

    def test_strided_inputs_in_place(self):
        p = fusec.Program(RMS, device="cpu")
        big = torch.randn(8, 10)
        x = big.t()[:, :8]             # strides (1, 10)
        w = torch.randn(16)[::2]       # stride 2
        for _ in range(2):
            torch.testing.assert_close(p(x, w)[0], rms(x, w)[0], rtol=1e-5,
                                       atol=1e-6)

    def test_bad_inputs_name_the_input(self):
        p = fusec.Program(RMS, device="cpu")
        x, w = torch.randn(5, 8), torch.randn(8)
        p(x, w)
        with self.assertRaises(TypeError) as cm:
            p(x.double(), w)
        self.assertIn("input 0 (x)", str(cm.exception))
        with self.assertRaises(TypeError):
            p(x, w[None])              # rank
        with self.assertRaises(fusec.FusecError) as cm:
            p(x, torch.randn(7))       # shape
        self.assertIn("input 1 ('w'", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            p(x.to("meta"), w)         # device
        self.assertIn("input 0 (x) is on meta", str(cm.exception))
        with self.assertRaises(TypeError):
            p(x)                       # count
        torch.testing.assert_close(p(x, w)[0], rms(x, w)[0])

    def test_kernels_come_from_the_disk_cache(self):
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            old = os.environ.get("FUSEC_CACHE_DIR")
            os.environ["FUSEC_CACHE_DIR"] = d
            try:
                p = fusec.Program(RMS, device="cpu")
                p(torch.randn(2, 8), torch.randn(8))
            finally:
                if old is None:
                    del os.environ["FUSEC_CACHE_DIR"]
                else:
                    os.environ["FUSEC_CACHE_DIR"] = old
            entries = [f for _, _, fs in os.walk(d) for f in fs]
            self.assertTrue(entries, "no cache entry was written")


if __name__ == "__main__":
    unittest.main()
