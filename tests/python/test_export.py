"""fusec.torch.export on small functions: the op mappings, refusals and
errors, each exported text run on the reference interpreter against
PyTorch."""

import unittest

import fzcheck

fzcheck.need_torch()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusec  # noqa: E402
import fusec.torch as ft  # noqa: E402


def run(fn, *args, tol=1e-5, **kw):
    text = ft.export(fn, *args, **kw)
    p = fusec.Program(text)
    out = p(*[a.detach() for a in args])
    ref = fn(*args)
    en, em = fzcheck.worst(out, ref)
    assert en <= tol and em <= 10 * tol, (en, em, text)
    return text


class TestMappings(unittest.TestCase):
    def test_linear_relu(self):
        t = run(lambda x, w, b: F.relu(F.linear(x, w, b)),
                torch.randn(4, 8), torch.randn(16, 8), torch.randn(16))
        self.assertIn("linear(", t)

    def test_elementwise_in_the_computed_operands_shape(self):
        # t + rows(x).view(...): computed in the rows' shape [8, 16], t
        # reshaped to it, so the add can join the rows' kernel
        rows = lambda x: (x - x.amax(1, keepdim=True)).exp()  # noqa: E731
        t = run(lambda x, g: g + rows(x).view(2, 4, 16),
                torch.randn(8, 16), torch.randn(2, 4, 16))
        self.assertRegex(t, r"= reshape\(g, shape=\[8, 16\]\)")
        self.assertNotRegex(t, r"add\(g,")
        # both operands computed: the op keeps its own shape
        t = run(lambda x, y: (y * 2) + rows(x).view(2, 4, 16),
                torch.randn(8, 16), torch.randn(2, 4, 16))
        self.assertNotRegex(t, r"reshape\(mul[_0-9a-z]*, shape=\[8, 16\]\)")

    def test_promotion_casts(self):
        t = run(lambda x, y, i: (x * y + i, (i / 2)),
                torch.randn(3, 4), torch.randn(4).bfloat16(),
                torch.arange(4))
        self.assertIn("cast(", t)

    def test_inf_literal(self):
        def f(x):
            m = torch.ones(4, 4, dtype=torch.bool).tril()
            return x.masked_fill(~m, float("-inf")).softmax(-1)
        t = run(f, torch.randn(2, 4, 4))
        self.assertIn("reciprocal(", t)   # -inf spelled as -1/0
        self.assertNotIn("inf)", t.replace("_inf", ""))

    def test_reductions(self):
        run(lambda x: (x.sum(1), x.mean((0, 2), keepdim=True), x.amax(-1),
                       x.var(1), torch.var_mean(x, 2, correction=0)[1],
                       x.max(), x.min(0).values),
            torch.randn(3, 4, 5))

    def test_meta_ops(self):
        def f(x):
            a = x.view(2, 3, 4).permute(2, 0, 1)
            b = x.t().unsqueeze(0).expand(2, 4, 6)
            c = x[1:5:2, ::3]
            d = torch.cat([x, x * 2], 1).split([3, 5], 1)
            e = torch.stack([x, x], 0).squeeze()
            return a * 1, b + 0, c, d[1], e, x.select(1, 2), x.flip(0)
        run(f, torch.randn(6, 4))

    def test_as_strided(self):
        # a transpose, a strided window, a broadcast: all become views
        def f(x):
            return (x.as_strided((4, 3), (1, 4)),
                    x.as_strided((2, 2), (5, 1), 1),
                    x.as_strided((3, 2, 4), (0, 4, 1)))
        run(f, torch.randn(3, 4))

    def test_as_strided_overlap_refused(self):
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(lambda x: x.as_strided((3, 3), (1, 1)) * 2,
                      torch.randn(9))
        self.assertIn("overlapping", str(cm.exception))

    def test_indexing(self):
        def f(w, i, t):
            e = F.embedding(i, w)
            g = torch.gather(w, 1, t)
            s = w.index_select(0, i.flatten())
            return e, g, s, w[i]
        run(f, torch.randn(10, 6), torch.randint(0, 10, (2, 3)),
            torch.randint(0, 6, (10, 2)))

    def test_cross_entropy_backward(self):
        def f(logits, tgt):
            loss = F.cross_entropy(logits, tgt)
            return loss, torch.autograd.grad(loss, [logits])[0]
        run(f, torch.randn(6, 11, requires_grad=True),
            torch.randint(0, 11, (6,)))

    def test_embedding_backward_index_add(self):
        def f(w, i):
            loss = (F.embedding(i, w) ** 2).sum()
            return torch.autograd.grad(loss, [w])[0]
        t = run(f, torch.randn(10, 4, requires_grad=True),
                torch.tensor([[1, 3, 1], [9, 0, 1]]))
        self.assertIn("index_add(", t)

    def test_activations_and_norms_backward(self):
        def f(x, w, b):
            h = F.layer_norm(x, (8,), w, b)
            h = F.gelu(h) + F.gelu(h, approximate="tanh") + F.silu(h)
            h = torch.tanh(h) * torch.sigmoid(h) + torch.erf(h) / 3
            loss = h.pow(2).mean()
            return (loss,) + torch.autograd.grad(loss, [x, w, b])
        run(f, torch.randn(4, 8, requires_grad=True),
            torch.randn(8, requires_grad=True),
            torch.randn(8, requires_grad=True))

    def test_bf16_softmax_and_mm(self):
        run(lambda q, k: (q @ k.transpose(-1, -2)).softmax(-1),
            torch.randn(2, 5, 8).bfloat16(), torch.randn(2, 6, 8).bfloat16(),
            tol=1e-2)

    def test_checkpoint(self):
        from torch.utils.checkpoint import checkpoint

        def f(x, w):
            h = checkpoint(lambda a: torch.tanh(a @ w), x,
                           use_reentrant=False)
            loss = h.sum()
            return (loss,) + torch.autograd.grad(loss, [x, w])
        t = run(f, torch.randn(3, 4, requires_grad=True),
                torch.randn(4, 4, requires_grad=True))
        self.assertEqual(ft.op_counts(t)["tanh"], 2)   # recomputed

    def test_param_names_from_dicts(self):
        t = ft.export(lambda p, x: x @ p["layer.0.w"],
                      {"layer.0.w": torch.randn(3, 3)}, torch.randn(2, 3))
        self.assertIn("layer_0_w: f32[3, 3]", t)

    def test_symbolic(self):
        def f(x, w):
            h = (x @ w).softmax(-1)
            return h.reshape(-1, 4).mean(0)
        text = ft.export(f, torch.randn(2, 3, 8), torch.randn(8, 4),
                         symbolic={"x": {0: "B", 1: "T"}})
        self.assertIn("x: f32[B, T, 8]", text)
        p = fusec.Program(text)
        for b, t in ((2, 3), (5, 7)):
            x, w = torch.randn(b, t, 8), torch.randn(8, 4)
            en, _ = fzcheck.worst(p(x, w), f(x, w))
            self.assertLess(en, 1e-5)

    def test_stats(self):
        st = {}
        ft.export(lambda x: (x * 2).exp(), torch.randn(4, 4), stats=st)
        self.assertEqual(st["ops"], {"mul": 1, "exp": 1})
        self.assertEqual(st["peak_bytes_trace_order"], 2 * 64)


class TestInPlaceAndScans(unittest.TestCase):
    """Issue 16: in-place updates of views are exported by their functional
    meaning (the graph is functionalized), and cumsum, topk, argmax and
    max.dim's indices are fusec ops. Each runs on the interpreter and on
    generated code for the CPU."""

    def both(self, fn, *args, tol=1e-6):
        text = ft.export(fn, *args)
        ref = fn(*args)
        for dev in ("reference", "cpu"):
            out = fusec.Program(text, device=dev)(*[a.detach() for a in args])
            en, em = fzcheck.worst(out, ref)
            self.assertLessEqual(en, tol, (dev, text))
            self.assertLessEqual(em, 10 * tol, (dev, text))
        return text

    def test_inplace_div_of_a_matmul_view(self):
        def f(q, k):
            s = q @ k.transpose(-1, -2)
            s /= 4.0
            return s
        self.both(f, torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
        bf = torch.bfloat16
        self.both(f, torch.randn(2, 3, 4, 5).to(bf),
                  torch.randn(2, 3, 4, 5).to(bf), tol=1e-3)

    def test_shift_right_of_labels(self):
        def g(x):
            y = x.new_zeros(x.shape)
            y[..., 1:] = x[..., :-1].clone()
            return y
        self.both(g, torch.randn(3, 7))
        self.both(g, torch.randint(0, 100, (2, 9)))

    def test_inplace_on_views(self):
        def h(x):
            w = (x + 0).view(12)
            w /= 2.0
            return w

        def residual(a, b):
            mlp_output = (a * 2).view(2, 6)
            mlp_output += b.view(2, 6)
            return mlp_output

        def masked(x):
            y = x.clone()
            y[y < 0] = 0.0          # index_put_ on a mask
            y[:, 0] += 1.0          # select then add_: a view of a view
            return y
        self.both(h, torch.randn(3, 4))
        self.both(residual, torch.randn(3, 4), torch.randn(12))
        self.both(masked, torch.randn(3, 4))

    def test_inplace_with_backward(self):
        def f(x, w):
            h = x @ w
            h[:, 1:] *= 0.5
            loss = (h * h).sum()
            return (loss,) + torch.autograd.grad(loss, [x, w])
        self.both(f, torch.randn(4, 3, requires_grad=True),
                  torch.randn(3, 5, requires_grad=True), tol=1e-5)

    def test_cumsum(self):
        t = self.both(lambda m: m.cumsum(-1),
                      torch.ones(2, 8, dtype=torch.long))
        self.assertIn("cumsum(", t)
        self.both(lambda x: torch.cumsum(x, 1), torch.randn(3, 40, 2))
        # position ids from a padded attention mask, as the models do
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        self.both(lambda m: (torch.cumsum(m, dim=1) - 1).masked_fill(
            m == 0, 1), mask)
        self.both(lambda b: b.cumsum(0), torch.rand(6) > 0.5)

    def test_cumsum_bf16_and_backward(self):
        def f(x):
            y = torch.cumsum(x, -1)
            return (y,) + torch.autograd.grad(y.float().sum(), [x])
        x = torch.randn(4, 33).bfloat16().requires_grad_()
        self.both(f, x, tol=1e-2)

    def test_topk(self):
        t = self.both(lambda x: torch.topk(x, 2, dim=-1)[0],
                      torch.randn(3, 4))
        self.assertIn("topk(", t)

        def route(logits):
            probs = logits.softmax(-1)
            v, i = torch.topk(probs, 2, dim=-1)
            return v / v.sum(-1, keepdim=True), i
        # the two largest of each row apart from each other and the rest,
        # at random places: a tie (bf16 probabilities of 64 logits often
        # round alike) would leave the indices to torch's unordered choice
        torch.manual_seed(0)
        logits = torch.randn(5, 64)
        for r in range(5):
            a, b = torch.randperm(64)[:2].tolist()
            logits[r, a] += 4.0
            logits[r, b] += 3.0
        self.both(route, logits)
        self.both(route, logits.bfloat16(), tol=1e-3)
        self.both(lambda x: torch.topk(x, 3, dim=0), torch.randn(7, 4))
        # ties: torch's CPU kernel returns them in no set order (2, 4, 1
        # here); fusec's go to the lower index, as DESIGN.md says
        x = torch.tensor([[1., 2., 2., 0., 2.]])
        text = ft.export(lambda x: torch.topk(x, 3), x)
        for dev in ("reference", "cpu"):
            v, i = fusec.Program(text, device=dev)(x)
            self.assertEqual(v.tolist(), [[2., 2., 2.]])
            self.assertEqual(i.tolist(), [[1, 2, 4]])

    def test_argmax_and_max_dim(self):
        def f(x):
            v, i = x.max(-1)
            m, j = torch.min(x, 0, keepdim=True)
            return (v, i, m, j, x.argmax(1), x.argmin(), x.argmax(
                1, keepdim=True))
        self.both(f, torch.randn(4, 6))
        self.both(lambda x: (x.argmax(-1), x.max(1)[1]),
                  torch.randint(0, 3, (3, 9)))

    def test_negative_index_wraps(self):
        self.both(lambda x: (x[..., [-2], :], x[:, torch.tensor([-1, 0])]),
                  torch.randn(2, 6, 3))

    def test_branch_on_data_refused_with_its_line(self):
        def f(x, m):
            if m.all():
                return x * 2
            return x
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(f, torch.randn(3), torch.ones(3, dtype=torch.bool))
        msg = str(cm.exception)
        self.assertIn("depends on a tensor's value", msg)
        self.assertIn("test_export.py", msg)
        self.assertIn("if m.all():", msg)

    def test_topk_smallest_refused_with_its_line(self):
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(lambda x: torch.topk(x, 2, largest=False),
                      torch.randn(3, 4))
        msg = str(cm.exception)
        self.assertIn("largest=False", msg)
        self.assertIn("test_export.py", msg)


def differing(fn, *args, **kw):
    """The fraction of output elements in which fusec and PyTorch differ at
    all (bit for bit), over every output of fn."""
    p = fusec.Program(ft.export(fn, *args, **kw))
    out = p(*[a.detach() for a in args])
    ref = fn(*args)
    if not isinstance(out, tuple):
        out, ref = (out,), (ref,)
    n = bad = 0
    for o, r in zip(out, ref):
        n += r.numel()
        bad += int((o != r.detach()).sum())
    return bad / n


def _grads(f, n):
    """(f(*xs), d f/d xs . g): the first n arguments are the inputs, the
    last the output gradient g."""
    def h(*a):
        y = f(*a[:n])
        return (y,) + torch.autograd.grad(y, a[:n], a[n])
    return h


class TestTorchNumerics(unittest.TestCase):
    """bf16 traces round where PyTorch's CPU kernels round, so that fusec's
    results are PyTorch's, bit for bit (the exporter's notes name each
    kernel)."""

    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        bf = torch.bfloat16
        cls.x = torch.randn(2, 8, 64).to(bf).requires_grad_()
        cls.w = (1 + 0.1 * torch.randn(64)).to(bf).requires_grad_()
        cls.b = (0.1 * torch.randn(64)).to(bf).requires_grad_()
        cls.g = torch.randn(2, 8, 64).to(bf)

    def test_layer_norm_and_backward(self):
        ln = _grads(lambda x, w, b: F.layer_norm(x, (64,), w, b, 1e-5), 3)
        self.assertEqual(differing(ln, self.x, self.w, self.b, self.g,
                                   cpu_threads=torch.get_num_threads()), 0)
        # by default dgamma and dbeta sum in f32 instead of PyTorch's
        # per-thread bf16 buffers: a different, not a worse, rounding
        self.assertLess(differing(ln, self.x, self.w, self.b, self.g), 0.5)

    def test_layer_norm_backward_follows_the_thread_count(self):
        ln = _grads(lambda x, w, b: F.layer_norm(x, (64,), w, b, 1e-5), 3)
        n = torch.get_num_threads()
        try:
            for k in (1, 3):
                torch.set_num_threads(k)
                self.assertEqual(differing(ln, self.x, self.w, self.b,
                                           self.g, cpu_threads=k), 0, k)
        finally:
            torch.set_num_threads(n)

    def test_log_softmax_and_backward(self):
        f = _grads(lambda x: torch.log_softmax(x, -1), 1)
        self.assertEqual(differing(f, self.x, self.g), 0)

    def test_attention_and_backward(self):
        bf = torch.bfloat16
        q, k, v = [torch.randn(2, 4, 8, 16).to(bf).requires_grad_()
                   for _ in range(3)]
        go = torch.randn(2, 4, 8, 16).to(bf)
        f = _grads(lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), 3)
        # The math form (export(attention="math"), and the forms the
        # attention primitive does not take) rounds where PyTorch's CPU
        # flash kernel rounds; the primitive, the default, rounds once and
        # is tested against f64 with an argued tolerance in test_sdpa.py.
        # PyTorch 2.15's CPU flash kernel sums p @ v (and the backward's
        # products) in another order than the one-block f32 sums the trace
        # writes, so its f32 results differ in the last bit and 1% to 3% of
        # the bf16 outputs round the other way (under 1% with the torch
        # this test was first written against). Measured on 20 draws, in every such element of the output
        # the trace's value is the correctly rounded one and the kernel's
        # is one bf16 step off. What holds across versions: few elements
        # differ, and those by one rounding step.
        self.assertLess(differing(f, q, k, v, go, attention="math"), 0.06)
        p = fusec.Program(ft.export(f, q, k, v, go, attention="math"))
        out = p(q.detach(), k.detach(), v.detach(), go)
        for o, r in zip(out, f(q, k, v, go)):
            r = r.detach().float()
            o = o.float()
            step = torch.maximum(o.abs(), r.abs()) * 2.0 ** -7
            # one step of bf16 (8 significant bits), or a difference no
            # larger than the rounding of the largest element (dq: rows
            # whose gradient is a cancellation to ~1e-7)
            tol = torch.maximum(step, r.abs().max() * 2.0 ** -8)
            self.assertTrue(bool(((o - r).abs() <= tol).all()))

    def test_products_with_python_numbers(self):
        # x * 0.044715 in f32 then rounded (PyTorch's opmath), x ** 3 as
        # x * x * x rounding each product; GPT-2's tanh GELU is made of them
        def gelu_new(x):
            return 0.5 * x * (1.0 + torch.tanh(
                0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))
        self.assertEqual(differing(gelu_new, self.x.detach()), 0)
        self.assertEqual(differing(lambda x: (x / 3.3, x + 0.1),
                                   self.x.detach()), 0)


class TestErrors(unittest.TestCase):
    def test_unmapped_ops_are_listed_with_their_line(self):
        def f(x):
            return torch.cumprod(x, 0), torch.argsort(x)
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(f, torch.randn(5))
        msg = str(cm.exception)
        self.assertIn("no fusec mapping", msg)
        self.assertIn("cumprod", msg)
        self.assertIn("sort", msg)
        self.assertIn("test_export.py", msg)   # the model line

    def test_random_refused(self):
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(lambda x: F.dropout(x, 0.5, training=True),
                      torch.randn(4))
        self.assertIn("random=True", str(cm.exception))

    def test_random_exported_when_asked(self):
        """export(random=True) writes dropout on Philox uniform of a seed
        parameter, the trace's last: one seed, one mask (on the
        interpreter and on generated code alike); another seed, another;
        a quarter of 2^16 elements dropped within 5 standard errors, the
        rest scaled by 4/3, symbolic extents and all."""
        def f(x):
            return F.dropout(x, 0.25, training=True)
        x = torch.randn(256, 256)
        t = ft.export(f, x, random=True, symbolic={0: {0: "B"}})
        self.assertEqual(t.seed, "seed")
        self.assertIn("seed: i64[])", t.splitlines()[0])
        self.assertIn("uniform(seed, ", t)
        ref = fusec.Program(t)
        cpu = fusec.Program(t, device="cpu")
        s1, s2 = torch.tensor(11), torch.tensor(-12)
        a, b = cpu(x, s1), cpu(x, s2)
        self.assertTrue(torch.equal(a, ref(x, s1)))
        self.assertFalse(torch.equal(a == 0, b == 0))
        drop = (a == 0).double().mean().item()
        self.assertLess(abs(drop - 0.25), 5 * (0.25 * 0.75 / 2 ** 16) ** 0.5)
        kept = a != 0
        self.assertLessEqual(fzcheck.rel_err(a[kept], x[kept] / 0.75)[1],
                             1e-6)
        self.assertEqual(tuple(cpu(x[:100], s1).shape), (100, 256))
        self.assertIsNone(ft.export(lambda x: x + 1, x, random=True).seed)

    def test_non_tensor_output(self):
        with self.assertRaises(ft.ExportError):
            ft.export(lambda x: (x, 3), torch.randn(2))

    def test_fake_export_allocates_nothing(self):
        with torch.device("meta"):
            w = torch.empty(1 << 16, 1 << 16)   # 16 GiB if real
        x = torch.empty(4, 1 << 16, device="meta")
        text = ft.export(lambda x, w: F.relu(x @ w), x, w, fake=True)
        self.assertIn("w: f32[65536, 65536]", text)


class TestSymbolicSums(unittest.TestCase):
    """Sizes that are sums of the symbols (T+1, T-1, B*T-B) become extents
    (issue 21, point 3): one export serves every sequence length."""

    def test_label_shift_losses(self):
        torch.manual_seed(0)
        def f(logits, labels):
            # transformers' ForCausalLMLoss: pad with -100, shift left
            lab = F.pad(labels, (0, 1), value=-100)[..., 1:]
            a = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                lab.reshape(-1), ignore_index=-100)
            # the older shift: logits[:, :-1] against labels[:, 1:]
            b = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                labels[:, 1:].reshape(-1))
            return a + b
        lg = torch.randn(2, 6, 5, requires_grad=True)
        lab = torch.randint(0, 5, (2, 6))

        def step(logits, labels):
            loss = f(logits, labels)
            return (loss,) + torch.autograd.grad(loss, [logits])
        text = ft.export(step, lg, lab, symbolic={"logits": {0: "B", 1: "T"},
                                                  "labels": {0: "B", 1: "T"}})
        self.assertIn("T+1", text)
        self.assertIn("B*T-B", text)
        p = fusec.Program(text)
        for b, t in ((2, 6), (3, 4), (1, 9)):
            x = torch.randn(b, t, 5, requires_grad=True)
            y = torch.randint(0, 5, (b, t))
            y[0, 0] = -100
            en, em = fzcheck.worst(p(x.detach(), y), step(x, y))
            self.assertLess(en, 1e-5)
            self.assertLess(em, 1e-5)

    def test_sums_as_literals_values_and_shapes(self):
        torch.manual_seed(0)
        def f(x):
            return (x.sum() / (x.shape[0] + 1) +
                    torch.full((x.shape[0] + 1,), float(x.shape[1] - 1)).sum()
                    + x.mean(0)[:-1].sum())
        text = ft.export(f, torch.randn(4, 3),
                         symbolic={"x": {0: "B", 1: "T"}})
        for piece in ("value=B+1", "shape=[B+1], value=T-1", "end=[T-1]"):
            self.assertIn(piece, text)
        p = fusec.Program(text)
        for shape in ((4, 3), (6, 5), (1, 2)):
            x = torch.randn(*shape)
            self.assertLess(fzcheck.worst(p(x), f(x))[0], 1e-6)

    def test_first_T_positions_of_a_table(self):
        # a learned position table sliced to the sequence length: T may not
        # pass the table's 64 rows, which binding checks
        def f(x, pos):
            return x + pos[: x.shape[1]]
        text = ft.export(f, torch.randn(2, 5, 3), torch.randn(64, 3),
                         symbolic={"x": {0: "B", 1: "T"}})
        p = fusec.Program(text)
        x, pos = torch.randn(3, 64, 3), torch.randn(64, 3)
        self.assertLess(fzcheck.worst(p(x, pos), f(x, pos))[0], 1e-6)
        with self.assertRaises(fusec.FusecError) as cm:
            p(torch.randn(1, 65, 3), pos)
        self.assertIn("-T+64", str(cm.exception))


class TestModuleState(unittest.TestCase):
    """Module state is never frozen into a trace (issue 21, point 6)."""

    def setUp(self):
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)
        self.lin.register_buffer("scale", torch.rand(3))

    def f(self, x):
        return self.lin(x) * self.lin.scale

    def test_closure_state_is_named(self):
        torch.manual_seed(0)
        lin = self.lin

        def f(x):
            return lin(x) * lin.scale
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(f, torch.randn(2, 4))
        msg = str(cm.exception)
        for name in ("lin.weight", "lin.bias", "lin.scale"):
            self.assertIn(name, msg)
        # a bound method reaches its module through self
        with self.assertRaises(ft.ExportError) as cm:
            ft.export(self.f, torch.randn(2, 4))
        self.assertIn("lin.weight", str(cm.exception))

    def test_closure_state_as_inputs(self):
        torch.manual_seed(0)
        lin = self.lin

        def f(x):
            return lin(x) * lin.scale
        x = torch.randn(5, 4)
        text = ft.export(f, torch.randn(2, 4), closure="inputs",
                         symbolic={"x": {0: "B"}})
        self.assertEqual(text.closure_names,
                         ("lin_weight", "lin_bias", "lin_scale"))
        self.assertNotIn("full(", text)        # nothing written as literals
        p = fusec.Program(text)
        with torch.no_grad():  # an optimizer step: the program sees it
            lin.weight.add_(0.5)
            lin.scale.mul_(2)
        en, _ = fzcheck.worst(p(x, *text.closure_inputs), f(x))
        self.assertLess(en, 1e-6)

    def test_literals_past_256_elements_verify(self):
        torch.manual_seed(0)
        vals = [float(i % 17) - 8 for i in range(1000)]

        def f(x):
            return x * torch.tensor(vals).reshape(10, 100)
        x = torch.randn(10, 100)
        text = ft.export(f, x)
        self.assertLess(fzcheck.worst(fusec.Program(text)(x), f(x))[0],
                        1e-6)


class TestMixtureOfExperts(unittest.TestCase):
    """Top-k routing forward and backward (issue 21, point 6)."""

    def test_topk_routing_backward(self):
        torch.manual_seed(0)
        def moe(x, router, w1, w2):
            # a token's k=2 experts of 4: softmax, top-k, renormalize, the
            # experts' weights gathered per (token, k), weighted sum
            probs = torch.softmax(x @ router.t(), -1)
            wts, idx = probs.topk(2, dim=-1)
            wts = wts / wts.sum(-1, keepdim=True)
            xs = x.repeat_interleave(2, dim=0)
            e = idx.reshape(-1)
            h = torch.bmm(xs.unsqueeze(1), w1[e]).squeeze(1).relu()
            o = torch.bmm(h.unsqueeze(1), w2[e]).squeeze(1)
            y = (o * wts.reshape(-1, 1)).view(x.shape[0], 2, -1).sum(1)
            loss = y.square().mean()
            return (loss,) + torch.autograd.grad(loss, [x, router, w1, w2])
        torch.manual_seed(0)
        args = (torch.randn(6, 8, requires_grad=True),
                torch.randn(4, 8, requires_grad=True),
                torch.randn(4, 8, 16, requires_grad=True),
                torch.randn(4, 16, 8, requires_grad=True))
        text = ft.export(moe, *args)
        self.assertIn("index_add", text)
        out = fusec.Program(text)(*[a.detach() for a in args])
        en, em = fzcheck.worst(out, moe(*args))
        self.assertLess(en, 1e-5)
        self.assertLess(em, 1e-5)

    def test_scatter_k_entries_per_row(self):
        torch.manual_seed(0)
        x, src = torch.randn(3, 6), torch.randn(3, 4)
        idx = torch.tensor([[0, 5, 2, 5], [1, 1, 1, 1], [3, 2, 4, 0]])
        f = lambda x, idx, src: x.scatter(1, idx, src)  # noqa: E731
        text = ft.export(f, x, idx, src)
        out = fusec.Program(text)(x, idx, src)  # a repeat keeps the last
        self.assertEqual(fzcheck.worst(out, f(x, idx, src))[0], 0)

    def test_transformers_moe(self):
        torch.manual_seed(0)
        try:
            import transformers as tr
        except ImportError:
            self.skipTest("transformers is not installed")
        dec = dict(vocab_size=64, hidden_size=32, intermediate_size=32,
                   num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1)
        for cfg, cls in (
                (tr.MixtralConfig(**dec, num_local_experts=4,
                                  num_experts_per_tok=2),
                 tr.MixtralForCausalLM),
                (tr.Qwen2MoeConfig(**dec, num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=16,
                                   shared_expert_intermediate_size=32),
                 tr.Qwen2MoeForCausalLM)):
            cfg._attn_implementation = "eager"
            torch.manual_seed(0)
            m = cls(cfg)
            impl = m.config._experts_implementation
            pn = [n for n, _ in m.named_parameters()]
            params = dict(m.named_parameters())
            params.update(m.named_buffers())

            def step(params, ids, mask):
                out = torch.func.functional_call(
                    m, params, (ids,), {"attention_mask": mask,
                                        "labels": ids, "use_cache": False})
                g = torch.autograd.grad(out.loss, [params[n] for n in pn],
                                        allow_unused=True)
                return (out.loss,) + tuple(x for x in g if x is not None)
            def data(t):
                mask = torch.ones(2, t, dtype=torch.long)
                mask[0, :2] = 0       # left padding on the first row
                return torch.randint(0, 64, (2, t)), mask
            text = ft.export(step, params, *data(5),
                             symbolic={"ids": {1: "T"}, "mask": {1: "T"}})
            self.assertEqual(m.config._experts_implementation, impl)
            p = fusec.Program(text)
            for t in (5, 7):
                ids, mask = data(t)
                out = p(*[x.detach() for x in params.values()], ids, mask)
                en, em = fzcheck.worst(out, step(params, ids, mask))
                self.assertLess(en, 1e-5, cls.__name__)
                self.assertLess(em, 1e-5, cls.__name__)


if __name__ == "__main__":
    unittest.main()
