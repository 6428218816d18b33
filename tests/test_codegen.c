/*
 * test_codegen.c: the code generator, on both targets.
 *
 * Host: small traces written as text run through the whole path (plan,
 * LLVM IR per region, O3, ORC JIT, the CPU runner) and are compared with
 * the reference interpreter: bit for bit where the semantics say so (f32
 * + - * /, casts, integer wrap, Philox), within a few ulp for the math
 * functions. Each skeleton is exercised (pointwise with lanes and without,
 * inner and outer reductions, normalization, gathers, index_add's
 * scatter), and each run-time error path (index out of range, integer fmod
 * by zero) both ways.
 *
 * NVPTX: PTX comes out, is a kernel, uses no local memory, and the layer
 * norm at 16x128x1600 bf16 reads with 16-byte vector loads. A row that fits
 * a thread's registers is read from global memory once for all passes (the
 * bytes of x each thread loads, counted in the optimized IR), a row that
 * does not (long or symbolic) once per pass. fz_kernel_launch_dims, at odd
 * and large sizes: whole warps, grids within their caps that cover the
 * work with no idle block, and FZ_ROW_BLOCK threads where a kernel's
 * register-held row depends on it.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg.h"
#include "exec.h"
#include "fusec.h"
#include "ir.h"
#include "math_sweep.h"
#include "numeric.h"

static fz_module *parse(const char *src)
{
	fz_module *m = NULL;
	char *diag = NULL;
	fz_status st = fz_module_parse(src, strlen(src), "test.trace", &m, &diag);
	ck_assert_msg(st == FZ_OK, "parse: %s", diag ? diag : "?");
	fz_free(diag);
	return m;
}

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1p-53;
}

/* Random inputs for every parameter at syms (ints in [0, bound)). */
static fz_tensor *inputs(const fz_trace *t, const int64_t *syms, int64_t bound)
{
	int n = fz_trace_param_count(t);
	fz_tensor *in = calloc((size_t)n + 1, sizeof *in);
	for (int i = 0; i < n; i++) {
		const fz_value *p = fz_trace_param(t, i);
		fz_tensor *x = &in[i];
		x->dtype = fz_value_dtype(p);
		x->rank = fz_value_rank(p);
		int64_t acc = 1;
		for (int d = x->rank - 1; d >= 0; d--) {
			x->shape[d] = fz_value_extent(p, d, syms);
			x->strides[d] = acc;
			acc *= x->shape[d];
		}
		x->data = malloc((size_t)acc * fz_dtype_size(x->dtype) + 8);
		for (int64_t k = 0; k < acc; k++) {
			double v = fz_dtype_is_float(x->dtype) ? urand() * 4 - 2 :
				   x->dtype == FZ_BOOL ? (double)(urand() < 0.5) :
				   (double)(int64_t)(urand() * (double)bound);
			fz_store_f64(x->data, x->dtype, k, v);
		}
	}
	return in;
}

static void free_tensors(fz_tensor *t, int n)
{
	for (int i = 0; t && i < n; i++)
		fz_free(t[i].data);
	free(t);
}

/* Runs src's first trace on generated code and on the interpreter; the
 * worst error over all outputs relative to (atol + rtol |want|). */
static double compare_run_with(const char *src, const int64_t *syms, int64_t bound,
			       double rtol, double atol, fz_status *st_out,
			       void (*adjust)(fz_tensor *in, int n_in))
{
	fz_module *m = parse(src);
	fz_trace *t = fz_module_trace(m, 0);
	int n_in = fz_trace_param_count(t), n_out = fz_trace_output_count(t);
	fz_tensor *in = inputs(t, syms, bound);
	if (adjust)
		adjust(in, n_in);
	fz_tensor *got = calloc((size_t)n_out, sizeof *got);
	fz_tensor *want = calloc((size_t)n_out, sizeof *want);
	char *err = NULL;
	fz_status st = fz_trace_run(t, "cpu", syms, in, n_in, got, n_out, &err);
	double worst = 0;
	if (st_out)
		*st_out = st;
	if (st == FZ_OK) {
		fz_status si = fz_trace_interpret(t, syms, in, n_in, want, n_out, &err);
		ck_assert_msg(si == FZ_OK, "interpret: %s", err ? err : "?");
		for (int k = 0; k < n_out; k++) {
			int64_t n = 1;
			for (int d = 0; d < want[k].rank; d++)
				n *= want[k].shape[d];
			for (int64_t i = 0; i < n; i++) {
				double g = fz_load_f64(got[k].data, got[k].dtype, i);
				double w = fz_load_f64(want[k].data, want[k].dtype, i);
				if ((isnan(g) && isnan(w)) || g == w)
					continue;
				double r = fabs(g - w) / (atol + rtol * fabs(w));
				if (isnan(r))
					r = INFINITY;
				if (r > worst)
					worst = r;
			}
		}
	} else if (!st_out) {
		ck_abort_msg("run: %s", err ? err : fz_status_name(st));
	}
	fz_free(err);
	free_tensors(in, n_in);
	free_tensors(got, st == FZ_OK ? n_out : 0);
	free_tensors(want, st == FZ_OK ? n_out : 0);
	fz_module_free(m);
	return worst;
}

static double compare_run(const char *src, const int64_t *syms, int64_t bound,
			  double rtol, double atol, fz_status *st_out)
{
	return compare_run_with(src, syms, bound, rtol, atol, st_out, NULL);
}

#define EXACT(src, ...) do { \
	int64_t s_[] = {__VA_ARGS__}; \
	double w_ = compare_run(src, s_, 7, 0, 0x1p-200, NULL); \
	ck_assert_msg(w_ == 0, "not bit-exact: worst %g", w_); \
} while (0)

#define CLOSE(src, tol, ...) do { \
	int64_t s_[] = {__VA_ARGS__}; \
	double w_ = compare_run(src, s_, 7, tol, tol, NULL); \
	ck_assert_msg(w_ <= 1, "worst error %g x tolerance", w_); \
} while (0)

/* ---- pointwise ------------------------------------------------------------- */

START_TEST(pointwise_f32_exact)
{
	const char *src =
		"trace f(x: f32[B, 12], y: f32[B, 12], b: f32[12]) {\n"
		"  z = div(add(mul(x, y), b), sub(abs(y), -1.5))\n"
		"  w = maximum(minimum(z, x), neg(y))\n"
		"  return z, w\n}\n";
	for (int64_t B = 1; B <= 17; B += 4)
		EXACT(src, B);
}
END_TEST

START_TEST(pointwise_odd_inner_extents)
{
	/* 7: no lanes; 1: broadcast; a symbolic inner extent: no lanes */
	EXACT("trace f(x: f32[B, 7], y: f32[1, 7]) {\n"
	      "  r0 = add(x, y)\n"
	      "  return r0\n}\n", 3);
	EXACT("trace f(x: bf16[T], y: bf16[T]) {\n"
	      "  r0 = mul(x, y)\n"
	      "  return r0\n}\n", 1001);
}
END_TEST

START_TEST(pointwise_casts_and_ints)
{
	EXACT("trace f(x: f32[5, 8]) {\n"
	      "  a = cast(mul(x, 100.0), dtype=i8)\n"
	      "  b = cast(add(a, a), dtype=i32)\n"
	      "  c = cast(x, dtype=bf16)\n"
	      "  d = cast(x, dtype=f16)\n"
	      "  e = cast(gt(x, 0.0), dtype=u8)\n"
	      "  return a, b, c, d, e\n}\n");
	EXACT("trace f(x: i32[4, 8], y: i32[4, 8]) {\n"
	      "  r0 = mul(add(x, 2147483000), y)\n"
	      "  r1 = maximum(x, y)\n"
	      "  r2 = sign(sub(x, y))\n"
	      "  return r0, r1, r2\n}\n");
}
END_TEST

/* f64 -> bf16 and f64 -> f16 round once (issue 23.4): just above a
 * half-type halfway point (1 + 2^-8 + k 2^-30 for bf16, 1 + 2^-11 +
 * k 2^-30 for f16) rounds up, where a rounding to f32 first lands on the
 * halfway point and ties to even, one ulp low; at k = 0, exactly halfway,
 * to even. Also beyond f32's range, and at the half types' subnormals. */
static const char *const CAST_F64_HALF =
	"trace f(x: f64[B, 64]) {\n"
	"  k = cast(iota(length=64, dtype=i64), dtype=f64)\n"
	"  t = mul(k, 9.313225746154785e-10)\n"
	"  v = add(t, 1.00390625)\n"
	"  w = add(t, 1.00048828125)\n"
	"  big = mul(add(t, 1.0), 3.4e38)\n"
	"  tiny = mul(add(t, 1.5), 5.960464477539063e-08)\n"
	"  r0 = cast(v, dtype=bf16)\n"
	"  r1 = cast(neg(w), dtype=f16)\n"
	"  r2 = cast(neg(v), dtype=bf16)\n"
	"  r3 = cast(w, dtype=f16)\n"
	"  r4 = cast(big, dtype=bf16)\n"
	"  r5 = cast(tiny, dtype=f16)\n"
	"  r6 = cast(mul(tiny, 1e-30), dtype=bf16)\n"
	"  r7 = cast(x, dtype=bf16)\n"
	"  r8 = cast(x, dtype=f16)\n"
	"  return r0, r1, r2, r3, r4, r5, r6, r7, r8\n}\n";

START_TEST(cast_f64_to_half_rounds_once)
{
	EXACT(CAST_F64_HALF, 3);
}
END_TEST

START_TEST(pointwise_meta)
{
	EXACT("trace f(q: f32[2, 3, 16]) {\n"
	      "  a = slice(q, start=[0, 0, 0], end=[2, 3, 8], step=[1, 1, 1])\n"
	      "  b = slice(q, start=[0, 0, 8], end=[2, 3, 16], step=[1, 1, 1])\n"
	      "  c = cat(neg(b), a, dim=2)\n"
	      "  d = permute(reshape(c, shape=[2, 3, 4, 4]), dims=[0, 2, 1, 3])\n"
	      "  e = slice(q, start=[0, 0, 1], end=[2, 3, 16], step=[1, 1, 3])\n"
	      "  r0 = add(c, q)\n"
	      "  r1 = mul(d, 2.0)\n"
	      "  return r0, r1, e\n}\n");
}
END_TEST

START_TEST(pointwise_uniform_iota)
{
	EXACT("trace f(x: f32[B, 13]) {\n"
	      "  u = uniform(shape=[B, 13], seed=7, offset=3, dtype=f32)\n"
	      "  h = uniform(shape=[B, 13], seed=9, offset=0, dtype=bf16)\n"
	      "  i = cast(iota(length=13, dtype=i32), dtype=f32)\n"
	      "  r0 = add(mul(x, u), i)\n"
	      "  return r0, h\n}\n", 5);
}
END_TEST

/* ---- uniform's seed operand ---------------------------------------------- */

/* Draws of every dtype from one seed operand, fused with dropout's compare
 * and scale; the f64 draw sits 2^40 counters on (a second stream). */
#define SEEDED(sdt) \
	"trace f(x: f32[B, 13], s: " sdt "[]) {\n" \
	"  u = uniform(s, shape=[B, 13], offset=3, dtype=f32)\n" \
	"  h = uniform(s, shape=[B, 13], dtype=bf16)\n" \
	"  g = uniform(s, shape=[3, B], offset=7, dtype=f16)\n" \
	"  d = uniform(s, shape=[5], offset=1099511627776, dtype=f64)\n" \
	"  k = cast(gt(u, 0.1), dtype=f32)\n" \
	"  r0 = mul(mul(x, k), 1.1111111111111112)\n" \
	"  return r0, h, g, d, u\n}\n"

typedef struct drawn {
	int n;
	fz_tensor out[8];
} drawn;

/* A trace prepared on a device (x NULL: the interpreter). */
typedef struct seeded {
	fz_module *m;
	fz_trace *t;
	fz_exec *x;
} seeded;

static seeded seeded_new(const char *src, const char *device)
{
	seeded s = {parse(src), NULL, NULL};
	s.t = fz_module_trace(s.m, 0);
	if (device) {
		fz_exec_options o;
		fz_exec_options_init(&o);
		o.disk_cache = 0;
		char *err = NULL;
		ck_assert_msg(fz_exec_new(s.t, device, &o, &s.x, &err) == FZ_OK,
			      "%s", err ? err : "?");
	}
	return s;
}

static void seeded_free(seeded *s)
{
	fz_exec_free(s->x);
	fz_module_free(s->m);
}

/* Runs s at B = b: float parameters get a fixed pattern, the rank-0
 * integer one the seed. */
static drawn run_seeded(const seeded *s, int64_t seed, int64_t b)
{
	const fz_trace *t = s->t;
	int n_in = fz_trace_param_count(t);
	drawn r = {.n = fz_trace_output_count(t)};
	ck_assert_int_le(r.n, 8);
	ck_assert_int_le(n_in, 4);
	int64_t syms[] = {b, -1}, s64 = seed;
	int32_t s32 = (int32_t)seed;
	float *x = malloc(sizeof *x * (size_t)(b * 13 + 1));
	for (int64_t i = 0; i < b * 13; i++)
		x[i] = (float)(i % 17) - 8.25f;
	fz_tensor in[4];
	int64_t shape[FZ_MAX_RANK];
	for (int i = 0; i < n_in; i++) {
		const fz_value *p = fz_trace_param(t, i);
		fz_dtype d = fz_value_dtype(p);
		for (int k = 0; k < fz_value_rank(p); k++)
			shape[k] = fz_value_extent(p, k, syms);
		if (d == FZ_F32)
			fz_tensor_contiguous(&in[i], x, d, fz_value_rank(p), shape);
		else
			fz_tensor_contiguous(&in[i], d == FZ_I32 ? (void *)&s32 :
					     (void *)&s64, d, 0, NULL);
	}
	char *err = NULL;
	fz_status st;
	if (s->x) {
		for (int k = 0; k < r.n; k++) {
			const fz_value *o = fz_trace_output(t, k);
			int64_t n = 1;
			for (int d = 0; d < fz_value_rank(o); d++)
				n *= shape[d] = fz_value_extent(o, d, syms);
			fz_tensor_contiguous(&r.out[k], calloc((size_t)n + 1, 8),
					     fz_value_dtype(o), fz_value_rank(o), shape);
		}
		st = fz_exec_run(s->x, syms, in, n_in, r.out, r.n, NULL, &err);
		if (st == FZ_OK)
			st = fz_exec_sync(s->x, NULL, &err);
	} else {
		st = fz_trace_interpret(t, syms, in, n_in, r.out, r.n, &err);
	}
	ck_assert_msg(st == FZ_OK, "%s: %s", s->x ? fz_exec_device(s->x) :
		      "interpreter", err ? err : "?");
	free(x);
	return r;
}

static int64_t numel_of(const fz_tensor *t)
{
	int64_t n = 1;
	for (int d = 0; d < t->rank; d++)
		n *= t->shape[d];
	return n;
}

/* Elements of output k that are equal, bit for bit, in a and b. */
static int64_t same_bits(const drawn *a, const drawn *b, int k)
{
	const fz_tensor *x = &a->out[k], *y = &b->out[k];
	ck_assert_int_eq(x->dtype, y->dtype);
	ck_assert_int_eq(numel_of(x), numel_of(y));
	size_t sz = fz_dtype_size(x->dtype);
	int64_t same = 0;
	for (int64_t i = 0; i < numel_of(x); i++)
		same += memcmp((char *)x->data + i * (int64_t)sz,
			       (char *)y->data + i * (int64_t)sz, sz) == 0;
	return same;
}

static void drawn_free(drawn *r)
{
	for (int k = 0; k < r->n; k++)
		free(r->out[k].data); /* fz_free is free (the interpreter's) */
}

/* The interpreter, the host code and the GPU's kernels (emulated) draw the
 * same bits from one seed operand, of either integer dtype, at any size:
 * seeds with both key words set, a negative one, zero. */
START_TEST(seed_operand_bitwise)
{
	const int64_t seeds[] = {0, 7, INT64_C(0x0123456789abcdef), -3};
	const int64_t sizes[] = {1, 37};
	const char *srcs[] = {SEEDED("i64"), SEEDED("i32")};
	const char *devs[] = {"cpu", "emu"};
	for (int si = 0; si < 2; si++) {
		seeded ref = seeded_new(srcs[si], NULL);
		seeded dev[2] = {seeded_new(srcs[si], devs[0]),
				 seeded_new(srcs[si], devs[1])};
		for (int k = 0; k < 4; k++)
			for (int b = 0; b < 2; b++) {
				drawn want = run_seeded(&ref, seeds[k], sizes[b]);
				for (int d = 0; d < 2; d++) {
					drawn got = run_seeded(&dev[d], seeds[k], sizes[b]);
					for (int o = 0; o < want.n; o++)
						ck_assert_msg(same_bits(&got, &want, o) ==
							      numel_of(&want.out[o]),
							      "%s, seed %lld, B=%lld: output %d "
							      "differs from the interpreter",
							      devs[d], (long long)seeds[k],
							      (long long)sizes[b], o);
					drawn_free(&got);
				}
				drawn_free(&want);
			}
		seeded_free(&ref);
		seeded_free(&dev[0]);
		seeded_free(&dev[1]);
	}
}
END_TEST

/* One seed, one stream: the same seed draws the same numbers, and the same
 * as seed=S written in; another seed draws others (equal f32 draws at a
 * rate of about 2^-24, so none among 13 * 64). */
START_TEST(seed_operand_streams)
{
	seeded s = seeded_new(SEEDED("i64"), "cpu");
	drawn a = run_seeded(&s, 11, 64), b = run_seeded(&s, 11, 64);
	drawn c = run_seeded(&s, 12, 64);
	drawn e = run_seeded(&s, INT64_C(11) + (INT64_C(1) << 32), 64);
	for (int o = 0; o < a.n; o++)
		ck_assert_int_eq(same_bits(&a, &b, o), numel_of(&a.out[o]));
	ck_assert_int_eq(same_bits(&a, &c, 4), 0);
	ck_assert_int_eq(same_bits(&a, &e, 4), 0);  /* the key's high word */
	ck_assert_int_eq(same_bits(&a, &c, 3), 0);
	seeded at = seeded_new("trace f(x: f32[B, 13]) {\n"
			       "  u = uniform(shape=[B, 13], seed=11, offset=3, dtype=f32)\n"
			       "  return u\n}\n", "cpu");
	drawn w = run_seeded(&at, 0, 64);
	ck_assert_int_eq(memcmp(w.out[0].data, a.out[4].data, 64 * 13 * 4), 0);
	drawn_free(&a);
	drawn_free(&b);
	drawn_free(&c);
	drawn_free(&e);
	drawn_free(&w);
	seeded_free(&s);
	seeded_free(&at);
}
END_TEST

/* A large draw is uniform on [0, 1): its mean, its variance and the
 * correlation of neighbours lie within 5 standard errors of 1/2, 1/12 and
 * 0, for several seeds. */
START_TEST(seed_operand_statistics)
{
	const int64_t seeds[] = {1, 2, INT64_C(-6148914691236517206)};
	const int64_t N = INT64_C(1) << 20;
	seeded s = seeded_new("trace f(s: i64[]) {\n"
			      "  u = uniform(s, shape=[1048576], dtype=f32)\n"
			      "  return u\n}\n", "cpu");
	for (int k = 0; k < 3; k++) {
		drawn r = run_seeded(&s, seeds[k], 1);
		const float *u = r.out[0].data;
		double sum = 0, sq = 0, lag = 0, lo = 1, hi = 0;
		for (int64_t i = 0; i < N; i++) {
			double v = u[i];
			sum += v;
			lo = fmin(lo, v);
			hi = fmax(hi, v);
		}
		double mean = sum / (double)N;
		for (int64_t i = 0; i < N; i++) {
			double v = u[i] - mean;
			sq += v * v;
			if (i)
				lag += v * (u[i - 1] - mean);
		}
		double var = sq / (double)N, corr = lag / sq;
		/* standard errors: of the mean sqrt(1/12 / N); of the variance
		 * sqrt((1/80 - 1/144) / N); of a correlation 1 / sqrt(N) */
		double se_mean = sqrt(1.0 / 12 / (double)N);
		double se_var = sqrt((1.0 / 80 - 1.0 / 144) / (double)N);
		ck_assert_msg(fabs(mean - 0.5) < 5 * se_mean, "seed %lld: mean %.6f",
			      (long long)seeds[k], mean);
		ck_assert_msg(fabs(var - 1.0 / 12) < 5 * se_var, "seed %lld: "
			      "variance %.6f", (long long)seeds[k], var);
		ck_assert_msg(fabs(corr) < 5 / sqrt((double)N), "seed %lld: "
			      "neighbours correlate: %.5f", (long long)seeds[k], corr);
		ck_assert(lo >= 0 && hi < 1);
		drawn_free(&r);
	}
	seeded_free(&s);
}
END_TEST

/* The seed operand is an input, not part of the kernel: a prepared program
 * draws with new seeds, and a second program of the same text is prepared,
 * and nothing compiles; a new seed=S written in compiles a new kernel. On
 * the host and on the GPU's kernels (emulated). */
START_TEST(seed_operand_compiles_once)
{
	const char *op = "trace f(x: f32[B, 13], s: i64[]) {\n"
			 "  u = uniform(s, shape=[B, 13], offset=9, dtype=f32)\n"
			 "  y = mul(cast(gt(u, 0.25), dtype=f32), x)\n"
			 "  return y\n}\n";
	const char *devs[] = {"cpu", "emu"};
	for (int d = 0; d < 2; d++) {
		seeded s = seeded_new(op, devs[d]);
		drawn a = run_seeded(&s, 5, 16);
		int64_t built = fz_kernel_builds();
		drawn b = run_seeded(&s, 6, 16), c = run_seeded(&s, 5, 16);
		seeded s2 = seeded_new(op, devs[d]);
		drawn e = run_seeded(&s2, 7, 16);
		ck_assert_int_eq(fz_kernel_builds(), built);
		ck_assert_int_lt(same_bits(&a, &b, 0), 16 * 13);
		ck_assert_int_eq(same_bits(&a, &c, 0), 16 * 13);
		for (int k = 1; k <= 2; k++) {
			char at[256];
			snprintf(at, sizeof at, "trace f(x: f32[B, 13]) {\n"
				 "  u = uniform(shape=[B, 13], seed=%d, offset=9, dtype=f32)\n"
				 "  y = mul(cast(gt(u, 0.25), dtype=f32), x)\n"
				 "  return y\n}\n", k);
			built = fz_kernel_builds();
			seeded sa = seeded_new(at, devs[d]);
			drawn w = run_seeded(&sa, 0, 16);
			ck_assert_int_gt(fz_kernel_builds(), built);
			drawn_free(&w);
			seeded_free(&sa);
		}
		drawn_free(&a);
		drawn_free(&b);
		drawn_free(&c);
		drawn_free(&e);
		seeded_free(&s2);
		seeded_free(&s);
	}
}
END_TEST

START_TEST(pointwise_math_close)
{
	CLOSE("trace f(x: f32[3, 64]) {\n"
	      "  a = add(exp(x), log(add(abs(x), 0.1)))\n"
	      "  b = add(tanh(x), erf(x))\n"
	      "  c = add(sin(mul(x, 5.0)), cos(x))\n"
	      "  d = add(expm1(x), log1p(abs(x)))\n"
	      "  e = add(pow(add(abs(x), 0.5), x), fmod(x, 0.3))\n"
	      "  r5 = sigmoid(x)\n"
	      "  r6 = exp2(x)\n"
	      "  r7 = log2(add(abs(x), 1e-3))\n"
	      "  return a, b, c, d, e, r5, r6, r7\n}\n",
	      2e-6);
}
END_TEST

/* f32 tanh (codegen/math.c's rational form, 5.3 ulp at most) within 2e-7
 * (1 + |tanh|) over [-12, 12], 1 - 2.7e-7 from the clamp at 7.9 on;
 * relatively near 0 (scaled back from 1e-30 and from a subnormal 1e-40),
 * exactly x below 2.9e-4; +-1 at the infinities, NaN at NaN. f32 exp
 * (0.88 ulp) within 2e-7 relative over [-80, 80] (a tenth of
 * pointwise_math_close's tolerance, which the old Taylor form met too). */
START_TEST(pointwise_exp_tanh_close)
{
	double w = compare_run("trace f(x: f32[B, 64]) {\n"
			       "  a = exp(mul(x, 40.0))\n  b = exp(x)\n"
			       "  return a, b\n}\n", (int64_t[]){33}, 7, 2e-7, 0, NULL);
	ck_assert_msg(w <= 1, "exp: worst error %g x 2e-7 relative", w);
	CLOSE("trace f(x: f32[B, 64]) {\n"
	      "  a = tanh(mul(x, 6.0))\n"
	      "  b = tanh(mul(x, 0.3))\n"
	      "  c = div(tanh(mul(x, 1e-30)), 1e-30)\n"
	      "  d = div(tanh(mul(x, 1e-40)), 1e-40)\n"
	      "  i = div(x, 0.0)\n"
	      "  e = add(tanh(i), tanh(sub(i, i)))\n"
	      "  return a, b, c, d, e\n}\n", 2e-7, 33);
	/* below 2.9e-4 tanh(x) rounds to x, and is x: a comparison of the two
	 * goes as the interpreter's (test_difftest found one that did not) */
	EXACT("trace f(x: f32[B, 64]) {\n"
	      "  a = tanh(mul(x, 1.4e-4))\n"
	      "  b = lt(a, mul(x, 1.4e-4))\n"
	      "  return a, b\n}\n", 33);
}
END_TEST

/* exp and exp2 at their ends: overflow to inf, subnormal results (one
 * rounding: codegen/math.c's scale2), underflow to 0, infinities and NaN
 * (x / 0 and its difference with itself), in f32 and through bf16 */
START_TEST(pointwise_exp_ends)
{
	CLOSE("trace f(x: f32[B, 64]) {\n"
	      "  a = exp(mul(x, 60.0))\n"
	      "  b = exp2(mul(x, 80.0))\n"
	      "  i = div(x, 0.0)\n"
	      "  c = add(exp(i), exp2(i))\n"
	      "  d = exp(sub(i, i))\n"
	      "  return a, b, c, d\n}\n", 2e-6, 9);
	CLOSE("trace f(x: bf16[B, 64]) {\n"
	      "  a = exp(mul(x, 60.0))\n  return a\n}\n", 1e-2, 5);
}
END_TEST

/* f32 -> bf16 at its edges, bit for bit: ties to even both ways (1 +
 * 2^-8 down to 1, 1 + 3 2^-8 up to 1 + 2^-6), a carry into the exponent,
 * overflow to infinity, infinities, NaN, subnormal results; and bf16 ops
 * that round the same way (emit.c's round_to) */
START_TEST(bf16_rounding_edges)
{
	EXACT("trace f(x: f32[B, 16]) {\n"
	      "  z = mul(x, 0.0)\n"
	      "  a = cast(add(z, 1.00390625), dtype=bf16)\n"
	      "  b = cast(add(z, 1.01171875), dtype=bf16)\n"
	      "  c = cast(add(z, 1.99609375), dtype=bf16)\n"
	      "  d = cast(mul(x, 1.7e38), dtype=bf16)\n"
	      "  i = div(x, 0.0)\n"
	      "  e = cast(i, dtype=bf16)\n"
	      "  n = cast(sub(i, i), dtype=bf16)\n"
	      "  s = cast(mul(x, 3e-39), dtype=bf16)\n"
	      "  return a, b, c, d, e, n, s\n}\n", 9);
	EXACT("trace f(x: bf16[B, 16], y: bf16[B, 16]) {\n"
	      "  a = mul(x, y)\n"
	      "  b = add(mul(x, 1e38), mul(y, 1e38))\n"
	      "  c = mul(mul(x, 1e-30), mul(y, 1e-8))\n"
	      "  return a, b, c\n}\n", 9);
}
END_TEST

/* f32 -> bf16 of subnormal inputs, bit for bit: the host's vcvtneps2bf16
 * takes a subnormal for zero, and emit.c's f32_to_bf16_host works around
 * it. Ties to even at the subnormals (0x00008000 down to 0, 0x00018000 up
 * to 0x0002, 0x807e8000 down to 0x807e), ties and a carry into the
 * smallest normal (0x007f8000, 0x007fffff -> 0x0080), a plain subnormal
 * (0x00012345 -> 0x0001); a negative one rounding to -0 and a rounded -0,
 * told from +0 by their reciprocals (-inf); and bf16 ops with subnormal
 * operands and results (round_to's host form), a tie among them (the mean
 * of 0x0001 and 0x0002). */
START_TEST(bf16_subnormal_conversions)
{
	EXACT("trace f(x: f32[B, 16]) {\n"
	      "  z = mul(x, 0.0)\n"
	      "  a = cast(add(z, 4.591774807899561e-41), dtype=bf16)\n"
	      "  b = cast(add(z, 1.3775324423698682e-40), dtype=bf16)\n"
	      "  c = cast(add(z, -1.1617190263985888e-38), dtype=bf16)\n"
	      "  d = cast(add(z, 1.170902576014388e-38), dtype=bf16)\n"
	      "  e = cast(add(z, 1.1754942106924411e-38), dtype=bf16)\n"
	      "  h = cast(add(z, 1.0448781999237998e-40), dtype=bf16)\n"
	      "  n = cast(add(mul(z, 0.0), -3.587324068671532e-43), dtype=bf16)\n"
	      "  r = div(1.0, cast(n, dtype=f32))\n"
	      "  nz = cast(neg(sub(z, z)), dtype=bf16)\n"
	      "  rz = div(1.0, cast(nz, dtype=f32))\n"
	      "  return a, b, c, d, e, h, r, rz\n}\n", 9);
	EXACT("trace f(x: bf16[B, 2]) {\n"
	      "  i = iota(length=2, dtype=bf16)\n"
	      "  v = add(mul(x, 0.0), add(mul(i, 9.183549615799121e-41), 9.183549615799121e-41))\n"
	      "  m = mean(v, dims=[1])\n"
	      "  p = mul(v, 1.5)\n"
	      "  q = mul(x, 1e-38)\n"
	      "  return m, p, q\n}\n", 9);
}
END_TEST

/* pow by 0, 1, 2 and -1 is one IEEE operation (1, x, x x, 1/x), the
 * correctly rounded result, so it matches the interpreter's f64 pow
 * rounded to f32 bit for bit, specials (NaN base, zeros) included */
START_TEST(pointwise_pow_constant)
{
	EXACT("trace f(x: f32[B, 16]) {\n"
	      "  a = pow(x, 2.0)\n"
	      "  b = pow(x, 1.0)\n"
	      "  c = pow(div(x, 0.0), 0.0)\n"
	      "  d = pow(x, -1.0)\n"
	      "  e = pow(sub(x, x), -1.0)\n"
	      "  return a, b, c, d, e\n}\n", 5);
	EXACT("trace f(x: bf16[B, 16]) {\n"
	      "  a = pow(x, 2.0)\n"
	      "  return a\n}\n", 3);
}
END_TEST

/* x in [0.01, 1000) spread over its exponents, y one of five exponents */
static void pow_operands(fz_tensor *in, int n_in)
{
	(void)n_in;
	static const float ys[] = {1.5f, 3.0f, -1.5f, 0.5f, 2.5f};
	float *x = in[0].data, *y = in[1].data;
	for (int64_t i = 0; i < in[0].shape[0]; i++) {
		x[i] = 0.01f * powf(1e5f, (float)i / (float)in[0].shape[0]);
		y[i] = ys[i % 5];
	}
}

/* f32 pow by any exponent within an ulp of the interpreter's (f64 pow,
 * rounded once): with its log2 and product in f32 it was 28 ulp off for
 * x^3 near 1000 */
START_TEST(pointwise_pow_within_an_ulp)
{
	int64_t s[] = {4099};
	double w = compare_run_with("trace f(x: f32[N], y: f32[N]) {\n"
				    "  z = pow(x, y)\n  return z\n}\n",
				    s, 7, 0x1p-23, 0x1p-200, NULL, pow_operands);
	ck_assert_msg(w <= 1, "worst error %g x an ulp", w);
}
END_TEST

/* ---- reductions and normalizations ------------------------------------------ */

START_TEST(reduction_inner_outer)
{
	CLOSE("trace f(x: f32[B, 33]) {\n"
	      "  r0 = sum(x, dims=[1])\n"
	      "  r1 = amax(x, dims=[0])\n"
	      "  r2 = amin(x, dims=[0, 1])\n"
	      "  return r0, r1, r2\n}\n",
	      1e-5, 7);
	EXACT("trace f(x: i32[B, 5, 3]) {\n"
	      "  r0 = sum(x, dims=[1], keepdim=true)\n"
	      "  r1 = amax(x, dims=[0, 2])\n"
	      "  return r0, r1\n}\n", 4);
}
END_TEST

/* src at B = n against the interpreter: bit for bit (rtol 0), or within
 * the tolerance */
static void columns_case(const char *src, int64_t n, double rtol, double atol)
{
	int64_t s[] = {n};
	double w = compare_run(src, s, 7, rtol, atol, NULL);
	ck_assert_msg(rtol ? w <= 1 : w == 0, "B = %lld: worst %g (x tolerance)\n%s",
		      (long long)n, w, src);
}

/* Outer reductions on the host walk the reduced elements in order over
 * blocks of columns (reduction.c, "columns"): every column must get its
 * own elements, in the interpreter's order (f32 and bf16 sums in f64: bit
 * for bit), at column counts that fill blocks of 64 (AVX-512 f32; 32
 * with AVX2, 32 and 16 for f64: 128), leave columns past the last block
 * (75, 101, 70, 41: the last block moved back over the one before it),
 * make a block one vector (20) or no vector (5), at one, three and a
 * thousand reduced rows, with a kept outer dim, keepdim, and outputs made
 * from the reduced values. f64
 * sums are pairs, nearer the exact sum than the interpreter's plain one:
 * within its rounding errors. */
START_TEST(reduction_columns)
{
	static const int64_t ns[] = {1, 3, 1000};
	for (int i = 0; i < 3; i++) {
		columns_case("trace f(g: f32[B, 75], x: f32[B, 75], r: f32[B, 1]) {\n"
			     "  y = sum(mul(g, mul(x, r)), dims=[0])\n"
			     "  return y\n}\n", ns[i], 0, 0x1p-200);
		columns_case("trace f(x: f32[B, 128]) {\n"
			     "  s = sum(x, dims=[0])\n"
			     "  return s\n}\n", ns[i], 0, 0x1p-200);
		columns_case("trace f(x: f32[B, 20]) {\n"
			     "  s = sum(x, dims=[0])\n"
			     "  return s\n}\n", ns[i], 0, 0x1p-200);
		columns_case("trace f(x: f32[B, 5]) {\n"
			     "  m = amax(x, dims=[0], keepdim=true)\n"
			     "  s = sum(x, dims=[0], keepdim=true)\n"
			     "  y = mul(m, s)\n"
			     "  return y\n}\n", ns[i], 0, 0x1p-200);
		columns_case("trace f(x: bf16[3, B, 101], w: bf16[101]) {\n"
			     "  wb = broadcast_in_dim(w, shape=[3, B, 101], dims=[2])\n"
			     "  s = sum(mul(x, wb), dims=[1], keepdim=true)\n"
			     "  m = amax(x, dims=[1], keepdim=true)\n"
			     "  d = sub(s, m)\n"
			     "  return s, d\n}\n", ns[i], 0, 0x1p-200);
		columns_case("trace f(x: f64[B, 41]) {\n"
			     "  s = sum(x, dims=[0])\n"
			     "  return s\n}\n", ns[i], 1e-12, 1e-9);
	}
	columns_case("trace f(x: i32[B, 70]) {\n"
		     "  r = sum(x, dims=[0])\n"
		     "  m = amin(x, dims=[0])\n"
		     "  return r, m\n}\n", 1000, 0, 0x1p-200);
	/* the norm's backward beside its weight's gradient: outputs of the
	 * domain's shape stored by the walk, at blocks moved back (75, 101),
	 * one vector (20), one column (5) */
	static const int cols[] = {75, 20, 5};
	for (int i = 0; i < 3; i++) {
		char src[512];
		snprintf(src, sizeof src, "trace f(g: f32[B, %d], h: f32[B, %d], x: f32[B, %d], "
			 "w: f32[%d]) {\n  a = add(g, h)\n  m = mul(a, w)\n"
			 "  s = sum(mul(a, x), dims=[0])\n  d = mul(x, 2.0)\n"
			 "  return s, m, d\n}\n", cols[i], cols[i], cols[i], cols[i]);
		columns_case(src, 1000, 0, 0x1p-200);
		columns_case(src, 3, 0, 0x1p-200);
	}
	columns_case("trace f(x: bf16[3, B, 101], w: bf16[101]) {\n"
		     "  wb = broadcast_in_dim(w, shape=[3, B, 101], dims=[2])\n"
		     "  y = mul(x, wb)\n"
		     "  s = sum(y, dims=[1], keepdim=true)\n"
		     "  return s, y\n}\n", 100, 0, 0x1p-200);
	/* rotary's backward: the sums of other columns, half turned */
	columns_case("trace f(x: f32[2, B, 16]) {\n"
		     "  s = sum(x, dims=[1])\n"
		     "  a = slice(s, start=[0, 0], end=[2, 8])\n"
		     "  b = slice(s, start=[0, 8], end=[2, 16])\n"
		     "  n = neg(b)\n"
		     "  c = cat(n, a, dim=1)\n"
		     "  y = add(c, s)\n"
		     "  return y\n}\n", 5, 0, 0x1p-200);
}
END_TEST

/* ---- scans and selection ------------------------------------------------------ */

/* cumsum on the host against the interpreter at row lengths around a warp
 * and far beyond it: f32 (accumulated in f64 like the interpreter, so bit
 * for bit), i64 and i32 (exact, wrapping), bf16 (accumulated in f32, then
 * rounded to bf16: within one bf16 step of the f64 oracle), and a scan
 * along an outer dim (rows `inner` apart). */
START_TEST(scan_lengths)
{
	static const int lengths[] = {1, 31, 32, 33, 1000, 100000};
	char src[512];
	for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
		int n = lengths[i];
		snprintf(src, sizeof src, "trace f(x: f32[2, %d], y: i64[%d], "
			 "z: i32[%d, 3]) {\n  a = cumsum(x, dim=1)\n"
			 "  b = cumsum(y, dim=0)\n  c = cumsum(z, dim=0)\n"
			 "  return a, b, c\n}\n", n, n, n);
		EXACT(src, 0);
		snprintf(src, sizeof src, "trace f(x: bf16[%d, 2]) {\n"
			 "  a = cumsum(x, dim=0)\n  return a\n}\n", n);
		CLOSE(src, 0x1p-7, 0); /* a bf16 step is up to 2^-7 relative */
	}
}
END_TEST

/* topk, argmax, argmin on the host: exact against the interpreter, with
 * ties (integers in [0, 7)) and without, rows of 1 to 300, along the last
 * dim and an outer one. */
START_TEST(select_rows)
{
	static const int lengths[] = {1, 5, 33, 300};
	char src[512];
	for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
		int n = lengths[i], k = n < 8 ? n : 8;
		snprintf(src, sizeof src, "trace f(x: f32[B, %d], y: i64[%d, B]) {\n"
			 "  v, i = topk(x, k=%d, dim=1)\n  a = argmax(x, dim=1)\n"
			 "  b = argmin(y, dim=0, keepdim=true)\n"
			 "  w, j = topk(y, k=%d, dim=0)\n"
			 "  return v, i, a, b, w, j\n}\n", n, n, k, k);
		EXACT(src, 3);
	}
}
END_TEST

START_TEST(normalization_softmax_layernorm)
{
	CLOSE("trace f(x: f32[B, 4, 40]) {\n"
	      "  r0 = softmax(x, dim=2)\n"
	      "  r1 = log_softmax(x, dim=2)\n"
	      "  return r0, r1\n}\n", 1e-5, 3);
	CLOSE("trace f(x: bf16[16, 128, 1600], w: bf16[1600], b: bf16[1600]) {\n"
	      "  r0 = layer_norm(x, w, b, dims=[2], eps=1e-5)\n"
	      "  return r0\n}\n", 1e-2);
	CLOSE("trace f(x: f32[B, 17], w: f32[17]) {\n"
	      "  v, m = var_mean(x, dims=[1], correction=1, keepdim=true)\n"
	      "  r0 = rms_norm(x, w, dims=[1], eps=1e-6)\n"
	      "  return r0, v, m\n}\n", 1e-5, 1);
}
END_TEST

/* var_mean on the host in one pass (codegen/reduction.c, "var_mean in
 * one pass"): the sum and the sum of squares in f64, the variance as
 * s2 - s1 mean where that cannot cancel, else the exact second pass. Bit
 * for bit against the interpreter: rows of 1000 and symbolic ones, a
 * constant row (variance 0 exactly: the second pass), a bf16 layer_norm,
 * and an add + layer_norm with h an output (the keep, stored by the one
 * pass, read back by the second where a row takes it). A row whose mean
 * is 10^6 of its deviations (the second pass) within 2^-11. */
START_TEST(var_mean_in_one_pass_host)
{
	EXACT("trace f(x: f32[B, 1000]) {\n"
	      "  s = sum(x, dims=[1])\n  v, m = var_mean(x, dims=[1])\n"
	      "  c = add(mul(x, 0.0), 3.3)\n  cv, cm = var_mean(c, dims=[1])\n"
	      "  return s, v, m, cv, cm\n}\n", 5);
	EXACT("trace f(x: f32[B, T]) {\n"
	      "  v, m = var_mean(x, dims=[1], correction=1)\n  return v, m\n}\n", 5, 333);
	EXACT("trace f(x: bf16[B, 256], w: bf16[256], b: bf16[256]) {\n"
	      "  y = layer_norm(x, w, b, dims=[1], eps=1e-5)\n  return y\n}\n", 9);
	EXACT("trace f(x: bf16[B, 4096], r: bf16[B, 4096], w: bf16[4096], b: bf16[4096]) {\n"
	      "  h = add(x, r)\n  y = layer_norm(h, w, b, dims=[1], eps=1e-5)\n"
	      "  return h, y\n}\n", 3);
	EXACT("trace f(x: f32[B, 4096], r: f32[B, 4096], w: f32[4096], b: f32[4096]) {\n"
	      "  h = add(add(x, r), 200.0)\n  y = layer_norm(h, w, b, dims=[1], eps=1e-5)\n"
	      "  return h, y\n}\n", 3);
	CLOSE("trace f(x: f32[B, 1000]) {\n"
	      "  v, m = var_mean(add(x, 1000000.0), dims=[1])\n"
	      "  return v, m\n}\n", 0x1p-11, 5);
}
END_TEST

/* ---- indexing and errors ------------------------------------------------------ */

START_TEST(indexing_take_and_index_add)
{
	CLOSE("trace f(w: f32[50, 8], ids: i64[B, T], g: f32[B, T, 8]) {\n"
	      "  e = take(w, ids, dim=0)\n"
	      "  z = full(shape=[50, 8], value=0, dtype=f32)\n"
	      "  d = index_add(z, reshape(ids, shape=[-1]), reshape(g, shape=[-1, 8]), dim=0)\n"
	      "  r0 = mul(e, 2.0)\n"
	      "  return r0, d\n}\n", 1e-6, 3, 5);
}
END_TEST

START_TEST(indexing_out_of_range)
{
	const char *src = "trace f(w: f32[5, 8], ids: i64[T]) {\n"
			  "  r0 = take(w, ids, dim=0)\n"
	      "  return r0\n}\n";
	fz_status st;
	int64_t s[] = {4};
	compare_run(src, s, 5, 1, 1, &st);   /* ids in [0, 5): fine */
	ck_assert_int_eq(st, FZ_OK);
	compare_run(src, s, 100000, 1, 1, &st); /* ids up to 99999: caught */
	ck_assert_int_eq(st, FZ_ERANGE);
	/* index_add gathered by rows (each part flags what it reads): in,
	 * then out */
	src = "trace f(x: f32[5, 8], ids: i64[T], g: f32[T, 8]) {\n"
	      "  y = index_add(x, ids, g, dim=0)\n  return y\n}\n";
	ck_assert_double_le(compare_run(src, s, 5, 1e-6, 1e-6, &st), 1);
	ck_assert_int_eq(st, FZ_OK);
	compare_run(src, s, 100000, 1, 1, &st);
	ck_assert_int_eq(st, FZ_ERANGE);
	compare_run("trace f(a: i32[6], b: i32[6]) {\n  r = fmod(a, b)\n  return r\n}\n",
		    (int64_t[]){0}, 1, 1, 1, &st); /* every b is 0 */
	ck_assert_int_eq(st, FZ_ERANGE);
}
END_TEST

/* An embedding's backward, index_add(zeros f32, idx, cast(dy)) cast to
 * bf16, is one kernel on the host (a gather by rows of the result through
 * idx's inverse: codegen/pointwise.c): its rows equal the interpreter's,
 * bit for bit (dy in quarters: every sum is exact in f32), with indices
 * repeated, in no order, rows no index names; an index out of range
 * (past the end, or negative) is reported as the interpreter reports it. */
static fz_status embedding_bwd(const int64_t *ids, int n, int cols, bool f32)
{
	char src[512];
	snprintf(src, sizeof src, "trace f(dy: %s[%d, %d], idx: i64[%d]) {\n"
		 "  z = full(shape=[13, %d], value=0, dtype=f32)\n"
		 "  acc = index_add(z, idx, cast(dy, dtype=f32), dim=0)\n"
		 "  out = cast(acc, dtype=%s)\n  return out\n}\n", f32 ? "f32" : "bf16",
		 n, cols, n, cols, f32 ? "f64" : "bf16");
	fz_module *m = parse(src);
	fz_trace *t = fz_module_trace(m, 0);
	fz_tensor in[2] = {{0}}, got = {0}, want = {0};
	in[0].dtype = f32 ? FZ_F32 : FZ_BF16;
	in[0].rank = 2;
	in[0].shape[0] = n;
	in[0].shape[1] = cols;
	in[0].strides[0] = cols;
	in[0].strides[1] = 1;
	in[0].data = malloc((size_t)(n * cols) * 4 + 4);
	for (int i = 0; i < n * cols; i++)
		fz_store_f64(in[0].data, in[0].dtype, i, ((i * 7 + i / cols * 3) % 17 - 8) / 4.0);
	in[1].dtype = FZ_I64;
	in[1].rank = 1;
	in[1].shape[0] = n;
	in[1].strides[0] = 1;
	in[1].data = (void *)ids;
	char *err = NULL, *ierr = NULL;
	fz_status st = fz_trace_run(t, "cpu", NULL, in, 2, &got, 1, &err);
	fz_status si = fz_trace_interpret(t, NULL, in, 2, &want, 1, &ierr);
	ck_assert_int_eq(st, si);
	if (st == FZ_OK) {
		ck_assert_int_eq(got.rank, 2);
		ck_assert_int_eq(got.shape[0] * got.shape[1], 13 * cols);
		ck_assert_int_eq(got.dtype, want.dtype);
		ck_assert_msg(!memcmp(got.data, want.data,
				      (size_t)(13 * cols) * fz_dtype_size(got.dtype)),
			      "the gather's rows differ from the interpreter's");
		fz_free(got.data);
		fz_free(want.data);
	}
	fz_free(err);
	fz_free(ierr);
	free(in[0].data);
	fz_module_free(m);
	return st;
}

START_TEST(indexing_embedding_backward)
{
	/* row 5 four times, 12 and 1 twice, out of order; rows 2, 4, 6-11
	 * never: bf16 rows of 96 (two lane groups of 16 a step), 72 (8
	 * lanes), f32 of 64 cast to f64 (four groups of 8 a step) */
	static const int64_t ids[] = {5, 12, 5, 0, 3, 12, 5, 1, 1, 5};
	ck_assert_int_eq(embedding_bwd(ids, 10, 96, false), FZ_OK);
	ck_assert_int_eq(embedding_bwd(ids, 10, 72, false), FZ_OK);
	ck_assert_int_eq(embedding_bwd(ids, 10, 64, true), FZ_OK);
	/* one index, and none at all */
	ck_assert_int_eq(embedding_bwd(ids, 1, 96, false), FZ_OK);
	ck_assert_int_eq(embedding_bwd(ids, 0, 96, false), FZ_OK);
	static const int64_t past[] = {5, 12, 13, 0}, below[] = {5, -1, 2, 0};
	ck_assert_int_eq(embedding_bwd(past, 4, 96, false), FZ_ERANGE);
	ck_assert_int_eq(embedding_bwd(below, 4, 96, false), FZ_ERANGE);
}
END_TEST

/* ---- NVPTX ---------------------------------------------------------------------- */

typedef struct ptx_acc {
	fz_compiler *c;
	char *all;
	size_t len;
} ptx_acc;

static fz_status keep_ptx(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	ptx_acc *a = ud;
	char *s = NULL;
	fz_status st = fz_kernel_ptx(a->c, k, &s, err);
	if (st != FZ_OK)
		return st;
	size_t n = strlen(s);
	a->all = realloc(a->all, a->len + n + 1);
	memcpy(a->all + a->len, s, n + 1);
	a->len += n;
	fz_free(s);
	return FZ_OK;
}

static char *ptx_of(const char *src, const char *target)
{
	fz_module *m = parse(src);
	fz_cg_options o;
	char *err = NULL;
	ck_assert_int_eq(fz_cg_options_parse(target, &o, &err), FZ_OK);
	ptx_acc a = {NULL, NULL, 0};
	ck_assert_int_eq(fz_compiler_new(&o, &a.c, &err), FZ_OK);
	fz_status st = fz_compile_trace(a.c, fz_module_trace(m, 0), NULL, -1, keep_ptx, &a, &err);
	ck_assert_msg(st == FZ_OK, "ptx: %s", err ? err : "?");
	fz_compiler_free(a.c);
	fz_module_free(m);
	return a.all;
}

START_TEST(ptx_layer_norm_vectorized)
{
	char *p = ptx_of("trace f(x: bf16[16, 128, 1600], w: bf16[1600], b: bf16[1600]) {\n"
			 "  r0 = layer_norm(x, w, b, dims=[2], eps=1e-5)\n"
	      "  return r0\n}\n", "sm_90");
	ck_assert_ptr_nonnull(strstr(p, ".entry fz_region_"));
	ck_assert_ptr_nonnull(strstr(p, ".target sm_90"));
	ck_assert_ptr_nonnull(strstr(p, ".v4.u32"));
	ck_assert_ptr_nonnull(strstr(p, "ld.global.nc.v4"));
	ck_assert_ptr_nonnull(strstr(p, "shfl.sync.bfly"));
	ck_assert_ptr_null(strstr(p, ".local"));
	/* sm_80 and later round to bf16 with one cvt, the vector loads kept */
	ck_assert_ptr_nonnull(strstr(p, "cvt.rn.bf16.f32"));
	free(p);
	p = ptx_of("trace f(x: bf16[16, 128, 1600], w: bf16[1600], b: bf16[1600]) {\n"
		   "  r0 = layer_norm(x, w, b, dims=[2], eps=1e-5)\n"
		   "  return r0\n}\n", "sm_75");
	ck_assert_ptr_null(strstr(p, ".bf16"));
	ck_assert_ptr_nonnull(strstr(p, "ld.global.nc.v4"));
	free(p);
}
END_TEST

/* How many times s occurs in text */
static int occurrences(const char *text, const char *s)
{
	int n = 0;
	for (const char *q = text; (q = strstr(q, s)); q++)
		n++;
	return n;
}

/* Rotary on the GPU: a thread's lane group of the cat(neg(x2), x1) lies
 * in one half (the halves are multiples of its 8 lanes), so it loads as
 * one 16-byte vector like x, cos and sin: five loads for 8 elements,
 * where a test and an index a lane made 16 loads of 2 bytes. */
START_TEST(ptx_rotary_cat_vectorized)
{
	char *p = ptx_of("trace f(x: bf16[64, 1024], cos: bf16[64, 128], sin: bf16[64, 128]) {\n"
			 "  x3 = reshape(x, shape=[64, 8, 128])\n"
			 "  x1 = slice(x3, start=[0, 0, 0], end=[64, 8, 64])\n"
			 "  x2 = slice(x3, start=[0, 0, 64], end=[64, 8, 128])\n"
			 "  rh = cat(neg(x2), x1, dim=2)\n"
			 "  y3 = add(mul(x3, unsqueeze(cos, dim=1)), mul(rh, unsqueeze(sin, dim=1)))\n"
			 "  y = reshape(y3, shape=[64, 1024])\n"
			 "  return y\n}\n", "sm_90");
	ck_assert_int_eq(occurrences(p, "ld.global"), 5);
	ck_assert_int_eq(occurrences(p, "ld.global.nc.v4"), 5);
	free(p);
}
END_TEST

/* Cross entropy on the GPU: the i64 target (one a row, [N] and [N, 1])
 * and the f32 loss (one a row) do not size the lanes, so the bf16 logits
 * load 8 at a time (16 bytes), not 2 (4 bytes, as an i64's 16-byte lane
 * group of 2 made them) */
START_TEST(ptx_cross_entropy_lanes)
{
	char *p = ptx_of("trace f(x: bf16[64, 1024], t: i64[64]) {\n"
			 "  loss = cross_entropy(x, t)\n"
			 "  lf = cast(x, dtype=f32)\n"
			 "  p = softmax(lf, dim=1)\n"
			 "  hot = cast(eq(unsqueeze(t, dim=1), iota(length=1024, dtype=i64)), dtype=f32)\n"
			 "  g = cast(sub(p, hot), dtype=bf16)\n"
			 "  return loss, g\n}\n", "sm_90");
	/* the logits, in the loss's kernel and g's */
	ck_assert_int_ge(occurrences(p, "ld.global.nc.v4"), 2);
	ck_assert_int_eq(occurrences(p, "ld.global.nc.u32"), 0);
	free(p);
}
END_TEST

/* pow(x, 2) on the GPU is the square, not exp2(2 log2 |x|): the same PTX
 * as mul(x, x) (an RMS norm's row kernel was 150 KB of PTX of pow) */
START_TEST(ptx_pow_square)
{
	char *p = ptx_of("trace f(x: f32[B, 64]) {\n  r = pow(x, 2.0)\n  return r\n}\n",
			 "sm_90");
	char *q = ptx_of("trace f(x: f32[B, 64]) {\n  r = mul(x, x)\n  return r\n}\n",
			 "sm_90");
	ck_assert_str_eq(p, q);
	free(q);
	q = ptx_of("trace f(x: f32[B, 64]) {\n  r = pow(x, 3.0)\n  return r\n}\n",
		   "sm_90");
	ck_assert_uint_gt(strlen(q), 2 * strlen(p)); /* the general form */
	free(p);
	free(q);
}
END_TEST

START_TEST(ptx_targets_and_errors)
{
	char *p = ptx_of("trace f(x: f32[B, 64]) {\n  r = exp(x)\n  return r\n}\n", "sm_80");
	ck_assert_ptr_nonnull(strstr(p, ".target sm_80"));
	ck_assert_ptr_nonnull(strstr(p, ".version 7.0"));
	free(p);
	fz_cg_options o;
	char *err = NULL;
	ck_assert_int_eq(fz_cg_options_parse("sm_9000", &o, &err), FZ_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "sm_9000"));
	fz_free(err);
	/* f64 transcendentals on the GPU: inline, no library call (issue
	 * 23.8: they were refused) */
	p = ptx_of("trace f(x: f64[4]) {\n  r = add(exp(x), erf(x))\n"
		   "  s = pow(x, r)\n  return s\n}\n", "sm_90");
	ck_assert_ptr_nonnull(strstr(p, ".f64"));
	ck_assert_ptr_null(strstr(p, "call"));
	free(p);
}
END_TEST

/* The GPU skeletons: a block per row, a warp scan by shfl.sync.up and a
 * block step through shared memory with barriers; selection by butterfly
 * shuffles; no local memory. */
START_TEST(ptx_scan_select)
{
	char *p = ptx_of("trace f(x: bf16[B, 4096], m: i64[B, T]) {\n"
			 "  a = cumsum(x, dim=1)\n  b = cumsum(m, dim=1)\n"
			 "  return a, b\n}\n", "sm_90");
	ck_assert_ptr_nonnull(strstr(p, "shfl.sync.up"));
	ck_assert_ptr_nonnull(strstr(p, "bar.sync"));
	ck_assert_ptr_nonnull(strstr(p, ".shared"));
	ck_assert_ptr_null(strstr(p, ".local"));
	free(p);
	p = ptx_of("trace f(x: f32[B, 64]) {\n  v, i = topk(x, k=2, dim=1)\n"
		   "  a = argmax(x, dim=0)\n  return v, i, a\n}\n", "sm_90");
	ck_assert_ptr_nonnull(strstr(p, "shfl.sync.bfly"));
	ck_assert_ptr_nonnull(strstr(p, "bar.sync"));
	ck_assert_ptr_null(strstr(p, ".local"));
	free(p);
}
END_TEST

/* ---- the row in registers ------------------------------------------------------ */

/* The base of a pointer: through GEPs and casts to an argument, or NULL. */
static LLVMValueRef ptr_base(LLVMValueRef p)
{
	while (p && !LLVMIsAArgument(p)) {
		if (LLVMIsAGetElementPtrInst(p) || LLVMIsACastInst(p) ||
		    (LLVMIsAConstantExpr(p) && LLVMGetNumOperands(p) > 0))
			p = LLVMGetOperand(p, 0);
		else
			return NULL;
	}
	return p;
}

/* Bytes of a scalar or vector type (ints, half, float, double). */
static int type_bytes(LLVMTypeRef t)
{
	int n = 1;
	if (LLVMGetTypeKind(t) == LLVMVectorTypeKind) {
		n = (int)LLVMGetVectorSize(t);
		t = LLVMGetElementType(t);
	}
	switch (LLVMGetTypeKind(t)) {
	case LLVMIntegerTypeKind: return n * (int)LLVMGetIntTypeWidth(t) / 8;
	case LLVMHalfTypeKind: return n * 2;
	case LLVMFloatTypeKind: return n * 4;
	default: return n * 8;
	}
}

/* The optimizer may split a vector load into scalars that the NVPTX
 * backend joins again, so loads are counted in bytes: bytes of x loaded
 * per thread per row, counting each load instruction once. */
typedef struct reg_acc {
	fz_compiler *c;
	int kernels, x_bytes, loads, local;
	fz_rowpar par;
	char *ptx;
} reg_acc;

/* Counts the loads of the first kernel parameter (x) in the optimized IR,
 * every global load in the PTX, and .local. */
static fz_status count_loads(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	reg_acc *a = ud;
	a->kernels++;
	a->par = k->par;
	for (LLVMValueRef f = LLVMGetFirstFunction(k->mod); f; f = LLVMGetNextFunction(f)) {
		if (LLVMCountBasicBlocks(f) == 0)
			continue;
		LLVMValueRef x = LLVMGetParam(f, 0);
		for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb;
		     bb = LLVMGetNextBasicBlock(bb))
			for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i;
			     i = LLVMGetNextInstruction(i))
				if (LLVMIsALoadInst(i) && ptr_base(LLVMGetOperand(i, 0)) == x)
					a->x_bytes += type_bytes(LLVMTypeOf(i));
	}
	char *p = NULL;
	fz_status st = fz_kernel_ptx(a->c, k, &p, err);
	if (st != FZ_OK)
		return st;
	for (const char *q = p; (q = strstr(q, "ld.global")); q++)
		a->loads++;
	a->local += strstr(p, ".local") != NULL;
	free(a->ptx);
	a->ptx = p;
	return FZ_OK;
}

static reg_acc regs_of(const char *src)
{
	fz_module *m = parse(src);
	fz_cg_options o;
	char *err = NULL;
	ck_assert_int_eq(fz_cg_options_parse("sm_90", &o, &err), FZ_OK);
	reg_acc a = {0};
	ck_assert_int_eq(fz_compiler_new(&o, &a.c, &err), FZ_OK);
	fz_status st = fz_compile_trace(a.c, fz_module_trace(m, 0), NULL, -1,
					count_loads, &a, &err);
	ck_assert_msg(st == FZ_OK, "ptx: %s", err ? err : "?");
	fz_compiler_free(a.c);
	fz_module_free(m);
	return a;
}

START_TEST(ptx_row_in_registers)
{
	/* GPT-2 XL's layer norm: 1600 bf16 = 200 lane groups, a block of 256
	 * per row, one step per thread: a thread's 8 elements of x (16 bytes)
	 * are loaded once, by one 16-byte load, for both passes and the tail;
	 * w and b once each */
	reg_acc a = regs_of("trace f(x: bf16[B, T, 1600], w: bf16[1600], b: bf16[1600]) {\n"
			    "  r0 = layer_norm(x, w, b, dims=[2], eps=1e-5)\n"
			    "  return r0\n}\n");
	ck_assert_int_eq(a.kernels, 1);
	ck_assert_int_eq(a.par, FZ_PAR_BLOCK);
	ck_assert_int_eq(a.x_bytes, 16);
	ck_assert_int_eq(a.loads, 3);
	ck_assert_int_eq(a.local, 0);
	ck_assert_ptr_nonnull(strstr(a.ptx, "ld.global.nc.v4"));
	free(a.ptx);
	/* Llama's rms_norm, 4096 bf16: two steps of 8 per thread, each
	 * element loaded once, not once per pass */
	a = regs_of("trace f(x: bf16[B, T, 4096], w: bf16[4096]) {\n"
		    "  r0 = rms_norm(x, w, dims=[2], eps=1e-5)\n"
		    "  return r0\n}\n");
	ck_assert_int_eq(a.x_bytes, 32);
	ck_assert_int_eq(a.local, 0);
	free(a.ptx);
	/* short odd rows: a warp per row, lanes past 17 masked; softmax's
	 * three passes read x once */
	a = regs_of("trace f(x: f32[B, 17]) {\n"
		    "  r0 = softmax(x, dim=1)\n"
		    "  return r0\n}\n");
	ck_assert_int_eq(a.par, FZ_PAR_WARP);
	ck_assert_int_eq(a.x_bytes, 4);
	ck_assert_int_eq(a.local, 0);
	free(a.ptx);
	/* too long for registers (50257 / 256 threads) or symbolic: each pass
	 * (amax, sum, tail) re-reads the row in a loop */
	a = regs_of("trace f(x: f32[B, 50257]) {\n"
		    "  r0 = softmax(x, dim=1)\n"
		    "  return r0\n}\n");
	ck_assert_int_eq(a.par, FZ_PAR_BLOCK);
	ck_assert_int_eq(a.x_bytes, 12); /* one 4-byte load in each of three loops */
	free(a.ptx);
	a = regs_of("trace f(x: f32[B, T]) {\n"
		    "  r0 = softmax(x, dim=1)\n"
		    "  return r0\n}\n");
	ck_assert_int_eq(a.x_bytes, 12); /* one 4-byte load in each of three loops */
	free(a.ptx);
}
END_TEST

/* ---- launch dimensions ------------------------------------------------------------ */

typedef struct dims_acc {
	fz_compiler *c;
	int kernels, checked;
	const int64_t (*binds)[2];
	int n_binds;
} dims_acc;

/* At every binding: the block is whole warps within CUDA's limits, the
 * grid is within its cap, covers the work (a row per block, rows per
 * block for warps, one item per thread else) unless capped, where the
 * kernel strides over the rest, and has no block with nothing to do. */
static fz_status check_dims(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	dims_acc *a = ud;
	a->kernels++;
	for (int b = 0; b < a->n_binds; b++) {
		int64_t syms[FZ_MAX_SYMS] = {a->binds[b][0], a->binds[b][1]};
		for (int e = 0; e < k->n_entries; e++) {
			int64_t work = 0;
			for (int w = 0; w < k->n_work[e]; w++) {
				int64_t x = fz_ext_eval(k->work[e][w], syms);
				work = x > work ? x : work;
			}
			int64_t grid = 0;
			int block = 0;
			fz_kernel_launch_dims(k, e, syms, &grid, &block);
			ck_assert_int_eq(block % 32, 0);
			ck_assert(block >= 32 && block <= 1024);
			ck_assert(grid >= 1 && grid <= 65535);
			int64_t per = block;
			if (k->sk == FZ_SK_ROW && k->par == FZ_PAR_BLOCK) {
				per = 1;
				ck_assert_int_eq(block, FZ_ROW_BLOCK); /* the registers' stride */
			} else if (k->sk == FZ_SK_ROW && k->par == FZ_PAR_WARP) {
				per = block / 32;
			}
			ck_assert_msg(grid * per >= work || grid == 65535 ||
				      (k->sk != FZ_SK_ROW && grid == 132 * 32),
				      "grid %lld x %lld does not cover %lld", (long long)grid,
				      (long long)per, (long long)work);
			ck_assert_msg(work == 0 || (grid - 1) * per < work,
				      "grid %lld has idle blocks for %lld", (long long)grid,
				      (long long)work);
			a->checked++;
		}
	}
	return FZ_OK;
}

/* ---- chained reductions ------------------------------------------------------- */

/* n reductions, each over exp of the last value less its reduction:
 * x_k = exp(x_{k-1} - r_k), r_{k+1} = sum or amax of x_k (issue 23.10). */
static char *chain_src(int n)
{
	size_t cap = 200 + (size_t)n * 120;
	char *s = malloc(cap);
	int len = snprintf(s, cap, "trace c(x0: f32[B, T]) {\n");
	for (int k = 1; k <= n; k++)
		len += snprintf(s + len, cap - (size_t)len,
				"  r%d = %s(x%d, dims=[1], keepdim=true)\n"
				"  x%d = exp(sub(x%d, r%d))\n", k, k % 2 ? "amax" : "sum",
				k - 1, k, k - 1, k);
	snprintf(s + len, cap - (size_t)len, "  return x%d\n}\n", n);
	return s;
}

/* The blocks of kernel k named `name` (NULL: none); its instructions are
 * added to *insts. */
static int walk_blocks(const fz_kernel *k, const char *name, int *insts)
{
	int named = 0;
	for (LLVMValueRef f = LLVMGetFirstFunction(k->mod); f; f = LLVMGetNextFunction(f))
		for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb;
		     bb = LLVMGetNextBasicBlock(bb)) {
			named += name && strcmp(LLVMGetBasicBlockName(bb), name) == 0;
			for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i;
			     i = LLVMGetNextInstruction(i))
				++*insts;
		}
	return named;
}

static fz_status count_insts(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	int *n = ud;
	walk_blocks(k, NULL, &n[0]);
	n[1]++;
	return FZ_OK;
}

/* Instructions of the chain's kernels for a target; ck fails unless the
 * chain is one kernel. */
static int chain_insts(int n, const char *target)
{
	char *src = chain_src(n);
	fz_module *m = parse(src);
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse(target, &o, NULL), FZ_OK);
	fz_compiler *c;
	ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
	int cnt[2] = {0, 0};
	ck_assert_int_eq(fz_compile_trace(c, fz_module_trace(m, 0), NULL, -1,
					  count_insts, cnt, NULL), FZ_OK);
	ck_assert_int_eq(cnt[1], 1);
	fz_compiler_free(c);
	fz_module_free(m);
	free(src);
	return cnt[0];
}

/* Where the row is not in registers, each pass reads the last pass's value
 * back instead of computing the whole chain again: the kernel grows
 * linearly with the chain (it grew as the square, the compile time as the
 * cube), and computes what the interpreter does. */
START_TEST(rows_chain_linear)
{
	const char *targets[] = {"host", "emu"};
	for (int t = 0; t < 2; t++) {
		int a = chain_insts(6, targets[t]), b = chain_insts(12, targets[t]);
		ck_assert_msg(b < 2.4 * a, "%s: %d instructions for 6 reductions, "
			      "%d for 12", targets[t], a, b);
	}
	char *src = chain_src(7);
	CLOSE(src, 1e-5, 3, 37);
	free(src);
}
END_TEST

static fz_status max_vec(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	int *v = ud;
	if (k->vec > *v)
		*v = k->vec;
	return FZ_OK;
}

/* The inputs' ranks of every kernel fz_compile_trace builds. */
typedef struct in_ranks {
	int n, rank[8];
} in_ranks;

static fz_status note_in_ranks(const fz_region *r, int op, fz_kernel *k, void *ud,
			       char **err)
{
	(void)op;
	(void)k;
	(void)err;
	in_ranks *a = ud;
	for (int i = 0; i < r->n_in && a->n < 8; i++)
		a->rank[a->n++] = r->in[i]->type.rank;
	return FZ_OK;
}

/* fz_compile_trace (`fusec emit`) builds a region as the runner launches
 * it, with the strided views it reads folded in: a bias broadcast over the
 * rows is read from its own [64] elements, not from the [B, 64] view that
 * the runner never makes (emit's code read it as a whole matrix, past the
 * bias's end). On every target. */
START_TEST(compile_trace_folds_views)
{
	const char *targets[] = {"host", "sm_90", "emu"};
	for (int i = 0; i < 3; i++) {
		fz_module *m = parse("trace f(x: f32[B, 64], b: f32[64]) {\n"
				     "  y = tanh(add(x, b))\n  return y\n}\n");
		fz_cg_options o;
		ck_assert_int_eq(fz_cg_options_parse(targets[i], &o, NULL), FZ_OK);
		fz_compiler *c;
		ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
		in_ranks a = {0};
		ck_assert_int_eq(fz_compile_trace(c, fz_module_trace(m, 0), NULL, -1,
						  note_in_ranks, &a, NULL), FZ_OK);
		ck_assert_int_eq(a.n, 2);
		ck_assert_msg((a.rank[0] == 1) != (a.rank[1] == 1),
			      "%s: input ranks %d and %d", targets[i], a.rank[0], a.rank[1]);
		fz_compiler_free(c);
		fz_module_free(m);
	}
}
END_TEST

/* Lanes per thread of a pointwise kernel over [B, 64] elements. */
static int lanes_of(const char *dtype, const char *target)
{
	char src[200];
	snprintf(src, sizeof src, "trace f(x: %s[B, 64], y: %s[B, 64]) {\n"
		 "  r = add(x, y)\n  return r\n}\n", dtype, dtype);
	fz_module *m = parse(src);
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse(target, &o, NULL), FZ_OK);
	fz_compiler *c;
	ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
	int vec = 0;
	ck_assert_int_eq(fz_compile_trace(c, fz_module_trace(m, 0), NULL, -1,
					  max_vec, &vec, NULL), FZ_OK);
	fz_compiler_free(c);
	fz_module_free(m);
	return vec;
}

/* The host has the AVX-512 that makes its lane groups 64 bytes (16 f32). */
static bool host_avx512_isa(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* The host code makes an AVX-512 host's choices: it has AVX-512, or an
 * AVX2 host models it (fz_host_model: FUSEC_HOST_MODEL=avx512). */
static bool host_avx512(void)
{
	return host_avx512_isa() || (fz_host_model() && __builtin_cpu_supports("avx2"));
}

/* A GPU thread's lanes are 16 bytes and at most FZ_VW_GPU (a u8 kernel
 * keeps 8); the host's fill its widest register: with AVX-512, 16 f32
 * (and 16 bf16 lanes, one register of f32 when they compute). */
START_TEST(lanes_by_target)
{
	const char *gpu[] = {"sm_90", "emu"};
	for (int t = 0; t < 2; t++) {
		ck_assert_int_eq(lanes_of("f32", gpu[t]), 4);
		ck_assert_int_eq(lanes_of("bf16", gpu[t]), 8);
		ck_assert_int_eq(lanes_of("u8", gpu[t]), FZ_VW_GPU);
	}
	int f = lanes_of("f32", "host"), h = lanes_of("bf16", "host");
	if (host_avx512()) {
		ck_assert_int_eq(f, 16);
		ck_assert_int_eq(h, 16);
	} else {
		ck_assert_int_le(f * 4, 32);
		ck_assert_int_ge(f, 4);
	}
}
END_TEST

START_TEST(launch_dims_properties)
{
	static const int64_t binds[][2] = {{1, 1}, {3, 17}, {17, 3}, {1, 1000},
					   {1000, 1000}, {4096, 4096}};
	static const char *srcs[] = {
		/* pointwise with lanes, pointwise without */
		"trace f(x: f32[B, T, 64]) {\n  r = exp(x)\n  return r\n}\n",
		"trace f(x: f32[B, T]) {\n  r = neg(x)\n  return r\n}\n",
		/* rows: block per row (1600 bf16, symbolic T), warp per row,
		 * thread per column */
		"trace f(x: bf16[B, T, 1600], w: bf16[1600], b: bf16[1600]) {\n"
		"  r = layer_norm(x, w, b, dims=[2], eps=1e-5)\n  return r\n}\n",
		"trace f(x: f32[B, T, T]) {\n  r = softmax(x, dim=2)\n  return r\n}\n",
		"trace f(x: f32[B, T, 17]) {\n  r = softmax(x, dim=2)\n  return r\n}\n",
		"trace f(x: f32[B, T]) {\n  r = sum(x, dims=[0])\n  return r\n}\n",
		/* index_add: two entries */
		"trace f(ids: i64[T], g: f32[T, 8]) {\n"
		"  z = full(shape=[50, 8], value=0, dtype=f32)\n"
		"  d = index_add(z, ids, g, dim=0)\n  return d\n}\n",
	};
	fz_cg_options o;
	char *err = NULL;
	ck_assert_int_eq(fz_cg_options_parse("sm_90", &o, &err), FZ_OK);
	for (size_t i = 0; i < sizeof srcs / sizeof *srcs; i++) {
		fz_module *m = parse(srcs[i]);
		dims_acc a = {NULL, 0, 0, binds, (int)(sizeof binds / sizeof *binds)};
		ck_assert_int_eq(fz_compiler_new(&o, &a.c, &err), FZ_OK);
		fz_status st = fz_compile_trace(a.c, fz_module_trace(m, 0), NULL, -1,
						check_dims, &a, &err);
		ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
		ck_assert_int_ge(a.kernels, 1);
		ck_assert_int_ge(a.checked, a.n_binds);
		fz_compiler_free(a.c);
		fz_module_free(m);
	}
}
END_TEST

/* What a host kernel's IR holds: stores marked !nontemporal, calls of
 * the sfence that ends a streaming part, stack slots. */
static fz_status count_stream(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	int *n = ud;
	unsigned nt = LLVMGetMDKindID("nontemporal", 11);
	for (LLVMValueRef f = LLVMGetFirstFunction(k->mod); f; f = LLVMGetNextFunction(f))
		for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb;
		     bb = LLVMGetNextBasicBlock(bb))
			for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i;
			     i = LLVMGetNextInstruction(i)) {
				if (LLVMIsAStoreInst(i) && LLVMGetMetadata(i, nt))
					n[0]++;
				if (LLVMIsACallInst(i)) {
					size_t len;
					const char *nm = LLVMGetValueName2(LLVMGetCalledValue(i), &len);
					n[1] += strcmp(nm, "llvm.x86.sse.sfence") == 0;
				}
				n[2] += LLVMIsAAllocaInst(i) != NULL;
			}
	return FZ_OK;
}

/* Compiles src's first trace for the host at syms (NULL: none), handing
 * each kernel to fn with ud. */
static void host_compile(const char *src, const int64_t *syms, fz_kernel_fn fn, void *ud)
{
	fz_module *m = parse(src);
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("host", &o, NULL), FZ_OK);
	fz_compiler *c;
	ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
	ck_assert_int_eq(fz_compile_trace(c, fz_module_trace(m, 0), syms, -1, fn, ud, NULL),
			 FZ_OK);
	fz_compiler_free(c);
	fz_module_free(m);
}

/* What the host compiler knows of this CPU: how many outputs a loop may
 * stream (codegen/emit.c: one on Zen), whether it converts to bf16 with
 * vcvtneps2bf16 (emit.c) */
static void host_traits(int *streams, bool *bf16)
{
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("host", &o, NULL), FZ_OK);
	fz_compiler *c;
	ck_assert_int_eq(fz_compiler_new(&o, &c, NULL), FZ_OK);
	*streams = c->host_streams;
	*bf16 = c->host_bf16;
	fz_compiler_free(c);
}

static int host_streams(void)
{
	int n;
	bool b;
	host_traits(&n, &b);
	return n;
}

static bool host_bf16_cvt(void)
{
	int n;
	bool b;
	host_traits(&n, &b);
	return b;
}

static void stream_counts(const char *src, int n[3])
{
	n[0] = n[1] = n[2] = 0;
	host_compile(src, NULL, count_stream, n);
}

/* On an x86 host a region that writes 16 MiB or more stores its final
 * values with streaming stores and fences them; a smaller one does not;
 * a row whose pass keeps a value for the tail (softmax's stash, the add
 * of an add + rms_norm) keeps it in a stack scratch, and the tail streams
 * every output, where the host streams that many a loop (AMD's Zen: one;
 * else all). The results stay those of the interpreter (codegen/emit.c,
 * "streaming stores"; reduction.c, "the scratch"). */
START_TEST(host_streaming_stores)
{
#if defined(__x86_64__)
	static const char big[] =
		"trace f(x: f32[1024, 4096], y: f32[1024, 4096]) {\n"
		"  r = mul(add(x, y), x)\n  return r\n}\n";
	static const char small[] =
		"trace f(x: f32[512, 4096], y: f32[512, 4096]) {\n"
		"  r = mul(add(x, y), x)\n  return r\n}\n";
	static const char softmax[] =
		"trace f(x: f32[1024, 4096]) {\n  y = softmax(x, dim=1)\n  return y\n}\n";
	static const char add_rms[] =
		"trace f(x: bf16[2048, 2048], r: bf16[2048, 2048], w: bf16[2048]) {\n"
		"  h = add(x, r)\n"
		"  y = rms_norm(h, w, dims=[1], eps=1e-5)\n  return h, y\n}\n";
	/* three passes and more: the chain */
	static const char chain[] =
		"trace f(x0: f32[1024, 4096]) {\n"
		"  r1 = amax(x0, dims=[1], keepdim=true)\n"
		"  x1 = exp(sub(x0, r1))\n"
		"  r2 = sum(x1, dims=[1], keepdim=true)\n"
		"  x2 = div(x1, r2)\n"
		"  r3 = sum(x2, dims=[1], keepdim=true)\n"
		"  x3 = sub(x2, r3)\n  return x3\n}\n";
	int n[3];
	stream_counts(big, n);
	ck_assert_int_ge(n[0], 1);
	ck_assert_int_ge(n[1], 1);
	stream_counts(small, n);
	ck_assert_int_eq(n[0], 0);
	ck_assert_int_eq(n[1], 0);
	stream_counts(softmax, n);
	ck_assert_int_ge(n[0], 1);
	ck_assert_int_ge(n[1], 1);
	ck_assert_int_ge(n[2], 1);
	stream_counts(add_rms, n);
	if (host_streams() >= 2)
		ck_assert_int_ge(n[0], 2); /* h and y, both from the tail */
	else
		ck_assert_int_eq(n[0], 0); /* two outputs, both plain */
	ck_assert_int_ge(n[2], 1);  /* the scratch all the same */
	stream_counts(chain, n);
	ck_assert_int_ge(n[0], 1);
	ck_assert_int_ge(n[2], 1);
	/* index_add of 16 MiB: a gather by rows streams its rows, a serial
	 * scatter (along dim 1) does not */
	stream_counts("trace f(i: i64[64], s: f32[64, 1024]) {\n"
		      "  z = full(shape=[4096, 1024], value=0, dtype=f32)\n"
		      "  y = index_add(z, i, s, dim=0)\n  return y\n}\n", n);
	ck_assert_int_ge(n[0], 1);
	ck_assert_int_ge(n[1], 1);
	stream_counts("trace f(i: i64[64], s: f32[4096, 64]) {\n"
		      "  z = full(shape=[4096, 1024], value=0, dtype=f32)\n"
		      "  y = index_add(z, i, s, dim=1)\n  return y\n}\n", n);
	ck_assert_int_eq(n[0], 0);
	/* run: the keep's and the chain's scratch, streamed tails (softmax's
	 * stash is the chain's last pass; a pointwise store is the tail's) */
	EXACT(add_rms, 0);
	CLOSE(chain, 1e-5, 0);
#endif
}
END_TEST

/* A kernel callback (host_compile's) calling fn(i, bufs, ud) on each
 * instruction of the kernel's functions that have a body, with the
 * function's buffer array (its first parameter). */
typedef struct inst_walk {
	void (*fn)(LLVMValueRef i, LLVMValueRef bufs, void *ud);
	void *ud;
} inst_walk;

static fz_status each_inst(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	inst_walk *w = ud;
	for (LLVMValueRef f = LLVMGetFirstFunction(k->mod); f; f = LLVMGetNextFunction(f)) {
		if (LLVMCountParams(f) == 0 || !LLVMGetFirstBasicBlock(f))
			continue;
		LLVMValueRef bufs = LLVMGetParam(f, 0);
		for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb;
		     bb = LLVMGetNextBasicBlock(bb))
			for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i;
			     i = LLVMGetNextInstruction(i))
				w->fn(i, bufs, w->ud);
	}
	return FZ_OK;
}

/* The buffer slot an address is in (a pointer the entry block loads from
 * that slot of the buffer array), -1 if none. */
static int slot_of(LLVMValueRef p, LLVMValueRef bufs)
{
	while (LLVMIsAGetElementPtrInst(p))
		p = LLVMGetOperand(p, 0);
	if (!LLVMIsALoadInst(p))
		return -1;
	LLVMValueRef slot = LLVMGetOperand(p, 0);
	if (slot == bufs)
		return 0;
	if (!LLVMIsAGetElementPtrInst(slot) || LLVMGetOperand(slot, 0) != bufs ||
	    !LLVMIsAConstantInt(LLVMGetOperand(slot, 1)))
		return -1;
	return (int)(LLVMConstIntGetZExtValue(LLVMGetOperand(slot, 1)) / 8);
}

static int load_slot(LLVMValueRef i, LLVMValueRef bufs)
{
	return LLVMIsALoadInst(i) ? slot_of(LLVMGetOperand(i, 0), bufs) : -1;
}

/* The blocks of a host kernel that load from input buffer 0 and from
 * input buffer 1. */
typedef struct loads_of {
	int blocks[2];
	LLVMBasicBlockRef last[2]; /* the last block counted */
} loads_of;

static void block_loads(LLVMValueRef i, LLVMValueRef bufs, void *ud)
{
	loads_of *a = ud;
	int s = load_slot(i, bufs);
	if (s < 0 || s > 1 || a->last[s] == LLVMGetInstructionParent(i))
		return;
	a->last[s] = LLVMGetInstructionParent(i);
	a->blocks[s]++;
}

/* The f32 -> f64 vector widenings and the f32 vector adds in each basic
 * block of a host kernel (each_inst's fn): does one block widen once
 * after three adds (a block of four steps), does one widen four times or
 * more (every step)? */
typedef struct widenings {
	bool blocked, per_step;
	LLVMBasicBlockRef bb; /* the block being counted, and its counts */
	int widen, adds;
} widenings;

static void widen_end(widenings *w)
{
	w->blocked = w->blocked || (w->widen == 1 && w->adds >= 3);
	w->per_step = w->per_step || w->widen >= 4;
	w->widen = w->adds = 0;
}

static void widen_inst(LLVMValueRef i, LLVMValueRef bufs, void *ud)
{
	(void)bufs;
	widenings *w = ud;
	if (LLVMGetInstructionParent(i) != w->bb) {
		widen_end(w);
		w->bb = LLVMGetInstructionParent(i);
	}
	LLVMTypeRef t = LLVMTypeOf(i);
	if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
		return;
	LLVMTypeKind e = LLVMGetTypeKind(LLVMGetElementType(t));
	w->widen += LLVMGetInstructionOpcode(i) == LLVMFPExt && e == LLVMDoubleTypeKind;
	w->adds += LLVMGetInstructionOpcode(i) == LLVMFAdd && e == LLVMFloatTypeKind;
}

static widenings widen_counts(const char *src)
{
	widenings w = {false, false, NULL, 0, 0};
	host_compile(src, NULL, each_inst, &(inst_walk){widen_inst, &w});
	widen_end(&w);
	return w;
}

/* Steps of 16 lanes: 2^25, 1, -2^25, 1 down every lane. In f32 a block of
 * those four steps sums to 0 (2^25 + 1 and 1 - 2^25 round to +-2^25); the
 * exact sum is 2. */
static void cancelling_rows(fz_tensor *in, int n_in)
{
	ck_assert_int_eq(n_in, 1);
	float *x = in[0].data;
	static const float step[4] = {0x1p25f, 1.0f, -0x1p25f, 1.0f};
	for (int64_t i = 0; i < in[0].shape[0] * in[0].shape[1]; i++)
		x[i] = step[(i / 16) % 4];
}

/* A host sum of terms never negative (softmax's exps, a sum of squares)
 * adds four steps in f32 and widens their sum once; a sum that can cancel
 * widens every step and stays the exact sum rounded once, where f32
 * blocks would lose every one of a row's ones (reduction.c, pass()). */
START_TEST(host_block_sums)
{
#if defined(__x86_64__)
	static const char softmax[] =
		"trace f(x: f32[64, 4096]) {\n  y = softmax(x, dim=1)\n  return y\n}\n";
	static const char squares[] =
		"trace f(x: bf16[64, 4096]) {\n  c = cast(x, dtype=f32)\n"
		"  s = sum(mul(c, c), dims=[1])\n  return s\n}\n";
	static const char pow2[] =
		"trace f(x: f32[64, 4096]) {\n  s = sum(pow(x, 2), dims=[1])\n  return s\n}\n";
	static const char plain[] =
		"trace f(x: f32[64, 4096]) {\n  s = sum(x, dims=[1])\n  return s\n}\n";
	widenings w = widen_counts(softmax);
	ck_assert(w.blocked);
	w = widen_counts(squares);
	ck_assert(w.blocked);
	ck_assert(!w.per_step);
	w = widen_counts(pow2);
	ck_assert(w.blocked);
	w = widen_counts(plain);
	ck_assert(!w.blocked);
	ck_assert(w.per_step);
	CLOSE(softmax, 1e-5, 0);
	CLOSE(squares, 1e-5, 0);
	CLOSE(pow2, 1e-5, 0);
	int64_t none[] = {0};
	ck_assert_double_eq(compare_run_with(plain, none, 7, 0, 0x1p-200, NULL, cancelling_rows), 0);
#endif
}
END_TEST

/* On the host the outputs of one shape that share nothing (horizontal
 * fusion's tensors of an AdamW step) get a loop each, a number both read
 * aside; outputs that share an input keep one loop (codegen/pointwise.c,
 * "independent outputs"). Results bit-exact. */
START_TEST(host_independent_loops)
{
#if defined(__x86_64__)
	static const char apart[] =
		"trace f(a: f32[256, 64], b: f32[256, 64]) {\n"
		"  x = mul(a, 2.0)\n  y = mul(b, 2.0)\n  return x, y\n}\n";
	static const char shared[] =
		"trace f(a: f32[256, 64], b: f32[256, 64]) {\n"
		"  x = mul(a, 2.0)\n  y = add(a, b)\n  return x, y\n}\n";
	loads_of a = {{0, 0}, {NULL, NULL}};
	host_compile(apart, NULL, each_inst, &(inst_walk){block_loads, &a});
	ck_assert_int_ge(a.blocks[0], 1);
	ck_assert_int_ge(a.blocks[1], 1);
	ck_assert_ptr_ne(a.last[0], a.last[1]);
	loads_of s = {{0, 0}, {NULL, NULL}};
	host_compile(shared, NULL, each_inst, &(inst_walk){block_loads, &s});
	ck_assert_ptr_eq(s.last[0], s.last[1]);
	EXACT(apart, 0);
	EXACT(shared, 0);
#endif
}
END_TEST

/* An add + layer_norm with both results as outputs, on the host: the keep
 * (h) goes to the scratch in the mean's pass, and the variance's pass and
 * the tail read it back, so x and r are read by the first pass alone (its
 * loop of four turns and its loop of the rest: two blocks; the variance's
 * pass computing h again read them in two more). Results bit-exact
 * (reduction.c, "the keep"). */
START_TEST(host_keep_first_pass)
{
#if defined(__x86_64__)
	static const char src[] =
		"trace f(x: bf16[2048, 2048], r: bf16[2048, 2048], w: bf16[2048], b: bf16[2048]) {\n"
		"  h = add(x, r)\n"
		"  y = layer_norm(h, w, b, dims=[1], eps=1e-5)\n  return h, y\n}\n";
	loads_of a = {{0, 0}, {NULL, NULL}};
	host_compile(src, NULL, each_inst, &(inst_walk){block_loads, &a});
	for (int in = 0; in < 2; in++) {
		ck_assert_int_ge(a.blocks[in], 1);
		ck_assert_int_le(a.blocks[in], 2);
	}
	EXACT(src, 0);
#endif
}
END_TEST

/* A host kernel's loads from each of its first 8 buffer slots, and its
 * selects of floats. */
typedef struct rot_counts {
	int loads[8];
	int fselects;
	int prefetches;
} rot_counts;

static void rot_inst(LLVMValueRef i, LLVMValueRef bufs, void *ud)
{
	rot_counts *a = ud;
	int s = load_slot(i, bufs);
	if (s >= 0 && s < 8)
		a->loads[s]++;
	LLVMTypeRef t = LLVMTypeOf(i);
	if (LLVMGetTypeKind(t) == LLVMVectorTypeKind)
		t = LLVMGetElementType(t);
	a->fselects += LLVMGetInstructionOpcode(i) == LLVMSelect &&
		       LLVMGetTypeKind(t) == LLVMFloatTypeKind;
	if (LLVMIsACallInst(i)) {
		size_t len;
		const char *nm = LLVMGetValueName2(LLVMGetCalledValue(i), &len);
		a->prefetches += strcmp(nm, "llvm.prefetch.p0") == 0;
	}
}

/* Rotary on the host, q bf16 [B, T, H, 128]: a step of the pointwise loop
 * is whole rows (pointwise.c, "a row at a time"), so rotate_half's cat
 * resolves when the code is built: no select between its operands, and q
 * read twice an element (as itself and as the other half), where the cat
 * read both of its operands and selected; cos and sin, broadcast over the
 * heads, are read once for 2 rows (8 heads). Bit-exact. Where the output
 * streams (16 MiB), the step prefetches q's lines ahead ("the rows'
 * prefetch"). */
/* Rotary of q bf16 [b, t, 8, 128] (cos and sin [t, 1, 128]) as a trace. */
static void rotary_src(char *buf, size_t n, int b, int t)
{
	snprintf(buf, n,
		 "trace f(q: bf16[%d, %d, 8, 128], cos: bf16[%d, 1, 128], sin: bf16[%d, 1, 128]) {\n"
		 "  q1 = slice(q, start=[0, 0, 0, 0], end=[%d, %d, 8, 64])\n"
		 "  q2 = slice(q, start=[0, 0, 0, 64], end=[%d, %d, 8, 128])\n"
		 "  r = add(mul(q, cos), mul(cat(neg(q2), q1, dim=3), sin))\n"
		 "  return r\n}\n", b, t, t, t, b, t, b, t);
}

START_TEST(host_rotary_rows)
{
#if defined(__x86_64__)
	char src[512];
	rotary_src(src, sizeof src, 2, 8);
	EXACT(src, 0);
	/* the loop's shape: rows of 128 bf16 are 8 groups of AVX-512's 16
	 * lanes (AVX2's 8 make 16 groups, more than a step takes) */
	if (!host_avx512())
		return;
	rot_counts a = {{0}, 0, 0};
	host_compile(src, NULL, each_inst, &(inst_walk){rot_inst, &a});
	ck_assert_int_eq(a.prefetches, 0); /* 64 KiB: in the cache */
	ck_assert_int_eq(a.fselects, 0);
	int q = 0; /* q's slot: the most loads; cos and sin the others */
	for (int s = 1; s < 3; s++)
		if (a.loads[s] > a.loads[q])
			q = s;
	for (int s = 0; s < 3; s++) {
		ck_assert_int_ge(a.loads[s], 1);
		if (s != q)
			ck_assert_msg(4 * a.loads[s] <= a.loads[q], "slot %d: %d loads, q %d",
				      s, a.loads[s], a.loads[q]);
	}
	/* 16 MiB streams, and prefetches each line of q (2 rows of 256 bytes
	 * a step: 8 lines), compiled only */
	rotary_src(src, sizeof src, 32, 256);
	rot_counts big = {{0}, 0, 0};
	host_compile(src, NULL, each_inst, &(inst_walk){rot_inst, &big});
	ck_assert_int_eq(big.prefetches, 8);
	ck_assert_int_eq(big.fselects, 0);
#endif
}
END_TEST

/* Host pointwise groups of 16-bit values hold their even elements in the
 * first half of their lanes and the odd ones in the second (pointwise.c,
 * "even and odd lanes"): such a group loads and stores 32-bit words, and
 * every lane's element is its own: an iota along the row, a broadcast
 * operand, a cat across the row's halves, bf16 and f16, groups of 16, 8
 * and 4 lanes (rows of 48, 24, 12), bit for bit against the interpreter.
 * A region with a 32-bit value keeps its lanes in order, as an AVX-512
 * host does. */
static void word_accesses(LLVMValueRef i, LLVMValueRef bufs, void *ud)
{
	(void)bufs;
	int *n = ud, op = LLVMGetInstructionOpcode(i);
	if (op != LLVMLoad && op != LLVMStore)
		return;
	LLVMTypeRef t = LLVMTypeOf(op == LLVMLoad ? i : LLVMGetOperand(i, 0));
	if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
		return;
	LLVMTypeRef e = LLVMGetElementType(t);
	bool word = LLVMGetTypeKind(e) == LLVMIntegerTypeKind && LLVMGetIntTypeWidth(e) == 32;
	bool half = LLVMGetTypeKind(e) == LLVMHalfTypeKind ||
		    (LLVMGetTypeKind(e) == LLVMIntegerTypeKind && LLVMGetIntTypeWidth(e) == 16);
	n[op == LLVMStore ? 2 : 0] += word;
	n[1] += half;
}

/* How src's 16-bit values meet memory on the host: with loads > 0, as
 * 32-bit words in even and odd lanes (at least `loads` word loads, a word
 * store, no 16-bit vector) where the host lacks AVX-512, and in order with
 * it (one register the group); with loads 0, in order (no word load, a
 * 16-bit vector). */
static void check_words(const char *src, const int64_t *syms, int loads, const char *what)
{
	int n[3] = {0, 0, 0};
	host_compile(src, syms, each_inst, &(inst_walk){word_accesses, n});
	if (loads == 0)
		ck_assert_msg(n[0] == 0 && n[1] >= 1, "%s: %d word loads, %d 16-bit vectors",
			      what, n[0], n[1]);
	else if (host_avx512())
		ck_assert_msg(n[0] + n[2] == 0, "%s: %d word loads, %d stores with AVX-512",
			      what, n[0], n[2]);
	else
		ck_assert_msg(n[0] >= loads && n[2] >= 1 && n[1] == 0,
			      "%s: %d word loads, %d stores, %d 16-bit vectors", what,
			      n[0], n[2], n[1]);
}

START_TEST(host_even_odd_lanes)
{
	static const char *dt[2] = {"bf16", "f16"};
	static const int row[3] = {48, 24, 12};
	char src[1024];
	for (int d = 0; d < 2; d++)
		for (int w = 0; w < 3; w++) {
			int c = row[w], h = c / 2;
			snprintf(src, sizeof src,
				 "trace f(x: %s[B, %d], b: %s[%d]) {\n"
				 "  i = reshape(iota(length=%d, dtype=%s), shape=[1, %d])\n"
				 "  x1 = slice(x, start=[0, 0], end=[B, %d])\n"
				 "  x2 = slice(x, start=[0, %d], end=[B, %d])\n"
				 "  y = add(mul(x, b), mul(cat(neg(x2), x1, dim=1), i))\n"
				 "  return y\n}\n",
				 dt[d], c, dt[d], c, c, dt[d], c, h, h, c);
			EXACT(src, 37);
			int64_t syms[1] = {37};
			char what[64];
			snprintf(what, sizeof what, "%s rows of %d", dt[d], c);
			check_words(src, syms, 2, what);
		}
	/* an f32 operand: lanes in order, 16-bit vectors loaded as such */
	static const char mixed[] =
		"trace f(x: bf16[B, 48], s: f32[B, 48]) {\n"
		"  y = cast(mul(cast(x, dtype=f32), s), dtype=bf16)\n  return y\n}\n";
	EXACT(mixed, 37);
	check_words(mixed, (int64_t[]){37}, 0, "an f32 operand");
}
END_TEST

/* Rows of 16-bit values (reduction.c, "even and odd lanes"): on a host
 * without AVX-512 a row whose every value along it is 16 bits wide loads
 * and stores 32-bit words, and its results are the interpreter's within
 * the dtype's rounding (a sum's lanes add other elements than in order):
 * rms_norm, add + layer_norm with both outputs, softmax (its stash), in
 * bf16 and f16, rows of 48 and 64. A row with an f32 operand keeps its
 * lanes in order. */
START_TEST(host_row_even_odd_lanes)
{
	static const char *dt[2] = {"bf16", "f16"};
	static const double tol[2] = {1e-2, 2e-3};
	static const int row[2] = {48, 64};
	static const char *fmt[3] = {
		"trace f(x: %1$s[B, %2$d], w: %1$s[%2$d]) {\n"
		"  y = rms_norm(x, w, dims=[1], eps=1e-5)\n  return y\n}\n",
		"trace f(x: %1$s[B, %2$d], r: %1$s[B, %2$d], w: %1$s[%2$d], b: %1$s[%2$d]) {\n"
		"  h = add(x, r)\n  y = layer_norm(h, w, b, dims=[1], eps=1e-5)\n"
		"  return h, y\n}\n",
		"trace f(x: %1$s[B, %2$d]) {\n  y = softmax(x, dim=1)\n  return y\n}\n"};
	char src[512];
	for (int d = 0; d < 2; d++)
		for (int w = 0; w < 2; w++)
			for (int f = 0; f < 3; f++) {
				snprintf(src, sizeof src, fmt[f], dt[d], row[w]);
				CLOSE(src, tol[d], 37);
				char what[64];
				snprintf(what, sizeof what, "%s rows of %d, trace %d", dt[d], row[w], f);
				check_words(src, (int64_t[]){37}, 1, what);
			}
	static const char mixed[] =
		"trace f(x: bf16[B, 48], s: f32[B, 48]) {\n"
		"  y = cast(softmax(mul(cast(x, dtype=f32), s), dim=1), dtype=bf16)\n"
		"  return y\n}\n";
	CLOSE(mixed, 1e-2, 37);
	check_words(mixed, (int64_t[]){37}, 0, "a row with an f32 operand");
}
END_TEST

/* Stores of a constant vector */
static void const_stores(LLVMValueRef i, LLVMValueRef bufs, void *ud)
{
	(void)bufs;
	if (LLVMGetInstructionOpcode(i) != LLVMStore)
		return;
	LLVMValueRef v = LLVMGetOperand(i, 0);
	*(int *)ud += LLVMGetTypeKind(LLVMTypeOf(v)) == LLVMVectorTypeKind && LLVMIsConstant(v);
}

/* An embedding's backward gathered by rows (pointwise.c, gather_rows): a
 * row no index names has a loop of its own, where the cast of zero that
 * it stores is a constant (indexing_embedding_backward holds the rows to
 * the interpreter's, bit for bit, empty ones among them); an index_add
 * into an input, whose empty rows are the input's, has no such store. */
START_TEST(indexing_empty_rows)
{
	static const char zeros[] =
		"trace f(dy: bf16[B, 96], idx: i64[B]) {\n"
		"  z = full(shape=[500, 96], value=0, dtype=f32)\n"
		"  acc = index_add(z, idx, cast(dy, dtype=f32), dim=0)\n"
		"  out = cast(acc, dtype=bf16)\n  return out\n}\n";
	static const char into[] =
		"trace f(x: f32[500, 96], dy: f32[B, 96], idx: i64[B]) {\n"
		"  acc = index_add(x, idx, dy, dim=0)\n  return acc\n}\n";
	int64_t syms[1] = {64};
	int n = 0;
	host_compile(zeros, syms, each_inst, &(inst_walk){const_stores, &n});
	ck_assert_int_ge(n, 1);
	n = 0;
	host_compile(into, syms, each_inst, &(inst_walk){const_stores, &n});
	ck_assert_int_eq(n, 0);
	CLOSE(into, 1e-6, 64);
}
END_TEST

/* A pointwise step of one lane group that streams (16 MiB out) prefetches
 * each input of its shape ahead too (swiglu's g and u: one each a step,
 * the broadcast bias none), only those its own outputs read; a small one
 * does not (pointwise.c, "the rows' prefetch"). */
START_TEST(host_pointwise_prefetch)
{
#if defined(__x86_64__)
	static const char big[] =
		"trace f(g: bf16[2048, 4096], u: bf16[2048, 4096], b: bf16[4096]) {\n"
		"  y = mul(silu(add(g, b)), u)\n  return y\n}\n";
	static const char small[] =
		"trace f(g: bf16[64, 4096], u: bf16[64, 4096], b: bf16[4096]) {\n"
		"  y = mul(silu(add(g, b)), u)\n  return y\n}\n";
	rot_counts a = {{0}, 0, 0};
	host_compile(big, NULL, each_inst, &(inst_walk){rot_inst, &a});
	ck_assert_int_eq(a.prefetches, 2);
	rot_counts s = {{0}, 0, 0};
	host_compile(small, NULL, each_inst, &(inst_walk){rot_inst, &s});
	ck_assert_int_eq(s.prefetches, 0);
	EXACT(small, 0);
	/* two independent outputs, a loop each: each loop prefetches its own
	 * input, not the other's (four prefetches, where an AdamW step of four
	 * tensors fetched three useless lines for each useful one) */
	static const char apart[] =
		"trace f(a: f32[2048, 4096], b: f32[2048, 4096]) {\n"
		"  x = mul(a, 2.0)\n  y = mul(b, 3.0)\n  return x, y\n}\n";
	rot_counts p = {{0}, 0, 0};
	host_compile(apart, NULL, each_inst, &(inst_walk){rot_inst, &p});
	ck_assert_int_eq(p.prefetches, 2);
#endif
}
END_TEST

/* ---- the pick, the row invariants, the rescale (reduction.c) ----------------------- */

/* The most passes over a row that any kernel of the trace makes. */
static fz_status max_passes(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	int *n = ud;
	if (k->row_passes > *n)
		*n = k->row_passes;
	return FZ_OK;
}

/* Blocks of the host kernels named `name` (reduction.c names the rescale's
 * branch "rescale.exp"). */
static fz_status count_named(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)r;
	(void)op;
	(void)err;
	int *n = ud, insts = 0;
	*n += walk_blocks(k, "rescale.exp", &insts);
	return FZ_OK;
}

static int host_kernels(const char *src, const int64_t *syms, fz_kernel_fn fn)
{
	int n = 0;
	host_compile(src, syms, fn, &n);
	return n;
}

/* Cross-entropy forward and backward as the exporter writes it (tools/
 * python: the scatter of -1 at the target, summed along the row again). */
#define CE_TRACE(DT) \
	"trace ce(logits: " DT "[64, 1000], target: i64[64]) {\n" \
	"  logits_f32 = cast(logits, dtype=f32)\n" \
	"  log_softmax_v = log_softmax(logits_f32, dim=1)\n" \
	"  ne_v = ne(target, -100)\n" \
	"  where_v = where(ne_v, target, full(shape=[], value=0, dtype=i64))\n" \
	"  gather = take_along(log_softmax_v, unsqueeze(where_v, dim=1), dim=1)\n" \
	"  neg_v = neg(squeeze(gather, dims=[1]))\n" \
	"  where_1 = where(ne_v, neg_v, full(shape=[], value=0, dtype=f32))\n" \
	"  sum_1_f32 = cast(sum(cast(ne_v, dtype=i64), dims=[0]), dtype=f32)\n" \
	"  div_v = div(sum(where_1, dims=[0]), sum_1_f32)\n" \
	"  div_1 = div(full(shape=[], value=1, dtype=f32), sum_1_f32)\n" \
	"  unsqueeze_1 = unsqueeze(target, dim=1)\n" \
	"  ne_3 = ne(unsqueeze_1, -100)\n" \
	"  where_2 = where(ne_3, unsqueeze_1, full(shape=[], value=0, dtype=i64))\n" \
	"  full_like_1 = full(shape=[64, 1000], value=0, dtype=f32)\n" \
	"  scatter_1 = reshape(iota(length=1000, dtype=i64), shape=[1, 1000])\n" \
	"  scatter_3 = where(eq(scatter_1, where_2), -1, full_like_1)\n" \
	"  where_3 = where(ne_3, div_1, full(shape=[], value=0, dtype=f32))\n" \
	"  mul_v = mul(scatter_3, where_3)\n" \
	"  sum_3 = sum(mul_v, dims=[1], keepdim=true)\n" \
	"  sub_v = sub(mul_v, mul(exp(log_softmax_v), sum_3))\n" \
	"  dx = cast(sub_v, dtype=" DT ")\n" \
	"  return div_v, dx\n}\n"

/* Targets at 0, n - 1 and the ignore index among random ones. */
static void ce_targets(fz_tensor *in, int n_in)
{
	ck_assert_int_eq(n_in, 2);
	int64_t *t = in[1].data;
	for (int64_t r = 0; r < in[1].shape[0]; r++)
		t[r] = r % 4 == 0 ? 0 : r % 4 == 1 ? 999 : r % 8 == 2 ? -100 : (r * 389) % 1000;
}

/* Cross entropy's row kernel with bf16 logits (reduction.c, "even and odd
 * lanes"; pointwise.c's sizes_lanes): its i64 target and f32 loss, one a
 * row, do not size the row's lanes, so on a host without AVX-512 a step
 * is 16 bf16 logits in even and odd order, loaded and stored as words;
 * the results are the interpreter's within bf16's rounding. */
START_TEST(rows_onehot_even_odd)
{
	char ce[sizeof CE_TRACE("bf16")];
	strcpy(ce, CE_TRACE("bf16"));
	for (char *p = strstr(ce, "1000"); p; p = strstr(p, "1000"))
		memcpy(p, "1024", 4);
	int64_t none[1] = {0};
	ck_assert_double_le(compare_run_with(ce, none, 7, 1e-2, 1e-2, NULL, ce_targets), 1);
	check_words(ce, none, 1, "cross entropy");
}
END_TEST

/* The sum over the one-hot is no pass: the softmax's two are all the rows
 * make (three before), and the results are the interpreter's; the
 * tail's exp of log_softmax comes from the stash (its branch exists). */
START_TEST(rows_onehot_pick)
{
	static const char ce32[] = CE_TRACE("f32"), ce16[] = CE_TRACE("bf16");
	int64_t none[1] = {0};
	ck_assert_int_eq(host_kernels(ce32, none, max_passes), 2);
	ck_assert_int_eq(host_kernels(ce16, none, max_passes), 2);
	ck_assert_int_ge(host_kernels(ce32, none, count_named), 1);
	ck_assert_double_le(compare_run_with(ce32, none, 7, 1e-5, 1e-5, NULL, ce_targets), 1);
	ck_assert_double_le(compare_run_with(ce16, none, 7, 1e-2, 1e-2, NULL, ce_targets), 1);
	/* the raw form: targets out of the row (t >= V, -100), a row weight
	 * of inf (its sum is NaN: 0 * inf in the other terms), rows of 1, 2,
	 * 3 and 40, a float and an integer sum: no pass at all */
	static const char raw[] =
		"trace f(t: i64[R], w: f32[R], k: i64[R]) {\n"
		"  tt = unsqueeze(where(eq(t, 6), -100, t), dim=1)\n"
		"  ww = unsqueeze(where(eq(t, 5), inf, w), dim=1)\n"
		"  i = reshape(iota(length=V, dtype=i64), shape=[1, V])\n"
		"  hot = eq(i, tt)\n"
		"  s = sum(mul(where(hot, 2.5, full(shape=[R, V], value=0, dtype=f32)), ww), dims=[1])\n"
		"  n = sum(where(hot, unsqueeze(mul(k, 3), dim=1), full(shape=[R, V], value=0, dtype=i64)), dims=[1], keepdim=true)\n"
		"  return s, n\n}\n";
	for (int64_t v = 1; v <= 40; v = v < 3 ? v + 1 : 40) {
		int64_t syms[2] = {37, v};
		ck_assert_int_eq(host_kernels(raw, syms, max_passes), 0);
		EXACT(raw, 37, v);
		if (v == 40)
			break;
	}
}
END_TEST

/* A row value made from an input (a per-row temperature) is loaded once
 * per row, not in every pass and in the tail: its load is in one block
 * (reduction.c, "row invariants"). */
START_TEST(rows_invariant_loaded_once)
{
	static const char src[] =
		"trace f(x: f32[64, 4096], tau: f32[64]) {\n"
		"  y = softmax(mul(x, unsqueeze(exp(tau), dim=1)), dim=1)\n"
		"  return y\n}\n";
	loads_of a = {{0, 0}, {NULL, NULL}};
	host_compile(src, NULL, each_inst, &(inst_walk){block_loads, &a});
	ck_assert_int_eq(a.blocks[0], 1); /* tau */
	ck_assert_int_ge(a.blocks[1], 2); /* x: the max's pass and the sum's */
	CLOSE(src, 1e-5, 0);
}
END_TEST

/* The rescale's branch: rows whose c is outside [0, 64] and steps whose
 * exp(y) overflowed (y = 50 x up to 100) compute exp(y - c) themselves;
 * the others multiply the stashed exp(y) by exp(-c). Where y is the
 * softmax's x - amax(x), exp(y) cannot overflow and the steps test no lane
 * for infinity (a vector fcmp oeq with inf; log's scalar one at the row
 * stays), only the row's flag. */
static fz_status count_inf_tests(const fz_region *r, int op, fz_kernel *k, void *ud,
				 char **err)
{
	(void)r;
	(void)op;
	(void)err;
	char *s = LLVMPrintModuleToString(k->mod);
	for (const char *p = s; (p = strstr(p, "fcmp oeq <")); p++) {
		const char *eol = strchr(p, '\n');
		const char *inf = strstr(p, "0x7FF0000000000000");
		*(int *)ud += inf && (!eol || inf < eol);
	}
	LLVMDisposeMessage(s);
	return FZ_OK;
}

START_TEST(rows_rescale_edges)
{
	static const char src[] =
		"trace f(x: f32[16, 256], u: f32[16]) {\n"
		"  y = mul(x, 50)\n"
		"  s = sum(exp(y), dims=[1], keepdim=true)\n"
		"  c = unsqueeze(mul(u, 40), dim=1)\n"
		"  e = exp(sub(y, c))\n"
		"  return s, e\n}\n";
	static const char shifted[] =
		"trace f(x: f32[16, 256]) {\n"
		"  y = sub(x, amax(x, dims=[1], keepdim=true))\n"
		"  s = sum(exp(y), dims=[1], keepdim=true)\n"
		"  e = exp(sub(y, log(s)))\n"
		"  return s, e\n}\n";
	int64_t none[1] = {0};
	ck_assert_int_ge(host_kernels(src, none, count_named), 1);
	ck_assert_int_ge(host_kernels(src, none, count_inf_tests), 1);
	CLOSE(src, 1e-5, 0);
	ck_assert_int_ge(host_kernels(shifted, none, count_named), 1);
	ck_assert_int_eq(host_kernels(shifted, none, count_inf_tests), 0);
	CLOSE(shifted, 1e-5, 0);
}
END_TEST

/* Functions of a kernel's module whose names start with prefix and end
 * with suffix (ud: a struct fn_count). */
struct fn_count {
	const char *prefix, *suffix;
	int n;
};

static fz_status count_functions(const fz_region *r, int op, fz_kernel *k, void *ud,
				 char **err)
{
	(void)r;
	(void)op;
	(void)err;
	struct fn_count *c = ud;
	size_t lp = strlen(c->prefix), ls = strlen(c->suffix);
	for (LLVMValueRef f = LLVMGetFirstFunction(k->mod); f; f = LLVMGetNextFunction(f)) {
		size_t len;
		const char *nm = LLVMGetValueName2(f, &len);
		c->n += len >= lp + ls && strncmp(nm, c->prefix, lp) == 0 &&
			strcmp(nm + len - ls, c->suffix) == 0;
	}
	return FZ_OK;
}

static int functions_named(const char *src, const int64_t *syms, const char *prefix,
			   const char *suffix)
{
	struct fn_count c = {prefix, suffix, 0};
	host_compile(src, syms, count_functions, &c);
	return c.n;
}

/* exp and sigmoid of f32 on the host, whose lanes math.c computes in
 * vectors (with vscalefps where the host has AVX-512; elsewhere with an
 * integer scaling where every lane is within 86 of 0, and the generic IR
 * in a branch where one is not), are the generic path's (the emu
 * target's, the GPU's IR) bit for bit, NaN as NaN, at 16, 8 and 4 lanes;
 * over math_sweep.h's inputs (subnormal results, overflow, infinities,
 * NaNs; a dense part, whose vectors take the branchless path) and 2048
 * consecutive floats on either side of -86 and 86, whose vectors take
 * one or the other. The kernels must hold vscalefps, or the branch's
 * hint, or this compares the generic path with itself. */
START_TEST(host_exp_matches_generic)
{
	static const char *src[] = {
		"trace f(x: f32[B, 16]) {\n  a = exp(x)\n  b = sigmoid(x)\n  return a, b\n}\n",
		"trace f(x: f32[B, 8]) {\n  a = exp(x)\n  b = sigmoid(x)\n  return a, b\n}\n",
		"trace f(x: f32[B, 4]) {\n  a = exp(x)\n  b = sigmoid(x)\n  return a, b\n}\n",
	};
	const int64_t n = 65536;
	bool avx512 = host_avx512();
	for (int t = 0; t < 3; t++) {
		int w = 16 >> t;
		int64_t syms[1] = {n / w};
		if (host_avx512_isa())
			ck_assert_msg(functions_named(src[t], syms, "llvm.x86.avx512.mask.scalef.ps.",
						      "") >= 1,
				      "%d lanes: no vscalefps on an AVX-512 host", w);
		else if (!avx512) /* (a model's scalef is generic IR) */
			ck_assert_msg(functions_named(src[t], syms, "llvm.expect.", "") >= 1,
				      "%d lanes: no vector exp on a host without AVX-512", w);
		fz_module *m = parse(src[t]);
		fz_trace *tr = fz_module_trace(m, 0);
		fz_tensor in = {.dtype = FZ_F32, .rank = 2, .shape = {n / w, w}, .strides = {w, 1}};
		in.data = malloc((size_t)n * 4);
		float *xs = in.data;
		math_sweep_inputs(xs, n - 8192, 8192);
		for (int e = 0; e < 2; e++) {
			float v = e ? 86.0f : -86.0f;
			for (int k = 0; k < 2048; k++)
				v = nextafterf(v, -INFINITY);
			for (int64_t k = n - 8192 + 4096 * e; k < n - 4096 + 4096 * e; k++)
				xs[k] = v = nextafterf(v, INFINITY);
		}
		fz_tensor out[2][2];
		const char *dev[2] = {"cpu", "emu"};
		for (int d = 0; d < 2; d++) {
			char *err = NULL;
			memset(out[d], 0, sizeof out[d]);
			ck_assert_msg(fz_trace_run(tr, dev[d], syms, &in, 1, out[d], 2, &err) == FZ_OK,
				      "%s: %s", dev[d], err ? err : "?");
		}
		const char *what[2] = {"exp", "sigmoid"};
		for (int o = 0; o < 2; o++) {
			const float *h = out[0][o].data, *gen = out[1][o].data, *x = in.data;
			for (int64_t i = 0; i < n; i++)
				ck_assert_msg((isnan(h[i]) && isnan(gen[i])) ||
					      memcmp(&h[i], &gen[i], 4) == 0,
					      "%s(%a), %d lanes: host %a, generic %a", what[o], x[i],
					      w, h[i], gen[i]);
			free(out[0][o].data);
			free(out[1][o].data);
		}
		free(in.data);
		fz_module_free(m);
	}
}
END_TEST

/* Runs tr on the host ("cpu") into out[0] and on emu into out[1] */
static void run_cpu_emu(fz_trace *tr, const int64_t *syms, fz_tensor *in, int n_in,
			fz_tensor out[2][8], int n_out)
{
	const char *dev[2] = {"cpu", "emu"};
	for (int k = 0; k < 2; k++) {
		char *err = NULL;
		memset(out[k], 0, sizeof out[k][0] * (size_t)n_out);
		ck_assert_msg(fz_trace_run(tr, dev[k], syms, in, n_in, out[k], n_out, &err) == FZ_OK,
			      "%s: %s", dev[k], err ? err : "?");
	}
}

/* A bf16 add, sub, mul or div of bf16 operands rounds on the host
 * without the NaN test (emit.c's round_bf16_quiet), and must give the
 * very bits the full rounding gives: the emu target keeps the full one,
 * so every bf16 pattern of x against 16 of y (NaNs of both signs,
 * signaling and quiet, infinities, zeros, subnormals, the largest
 * finite, ties-prone values), through all four ops and a chain of them,
 * compares bit for bit, NaN payloads included. */
START_TEST(host_bf16_quiet_rounding)
{
	static const char src[] =
		"trace f(x: bf16[B, 16], y: bf16[B, 16]) {\n"
		"  a = add(x, y)\n  s = sub(x, y)\n  m = mul(x, y)\n  d = div(x, y)\n"
		"  c = add(mul(x, 1.5), mul(y, x))\n  return a, s, m, d, c\n}\n";
	static const uint16_t ys[16] = {0x7fc0, 0xffff, 0x7f81, 0xff81, 0x7f80, 0xff80,
					0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0x0080,
					0x3f81, 0xbfff, 0x4049, 0x3c01};
	const int64_t n = 65536;
	int64_t syms[1] = {n};
	fz_module *m = parse(src);
	fz_trace *tr = fz_module_trace(m, 0);
	fz_tensor in[2];
	for (int i = 0; i < 2; i++) {
		in[i] = (fz_tensor){.dtype = FZ_BF16, .rank = 2, .shape = {n, 16},
				    .strides = {16, 1}};
		in[i].data = malloc((size_t)n * 16 * 2);
	}
	uint16_t *x = in[0].data, *y = in[1].data;
	for (int64_t i = 0; i < n * 16; i++) {
		x[i] = (uint16_t)(i / 16);
		y[i] = ys[i % 16];
	}
	fz_tensor out[2][8];
	run_cpu_emu(tr, syms, in, 2, out, 5);
	for (int o = 0; o < 5; o++) {
		const uint16_t *h = out[0][o].data, *e = out[1][o].data;
		int64_t i = 0;
		while (i < n * 16 && h[i] == e[i])
			i++;
		ck_assert_msg(i == n * 16, "output %d, x 0x%04x, y 0x%04x: host 0x%04x, emu 0x%04x",
			      o, x[i % (n * 16)], y[i % (n * 16)], h[i % (n * 16)], e[i % (n * 16)]);
		free(out[0][o].data);
		free(out[1][o].data);
	}
	free(in[0].data);
	free(in[1].data);
	fz_module_free(m);
}
END_TEST

static fz_status count_nan_tests(const fz_region *r, int op, fz_kernel *k, void *ud,
				  char **err)
{
	(void)r;
	(void)op;
	(void)err;
	int *n = ud;
	for (LLVMValueRef f = LLVMGetFirstFunction(k->mod); f; f = LLVMGetNextFunction(f))
		for (LLVMBasicBlockRef b = LLVMGetFirstBasicBlock(f); b; b = LLVMGetNextBasicBlock(b))
			for (LLVMValueRef i = LLVMGetFirstInstruction(b); i; i = LLVMGetNextInstruction(i))
				*n += LLVMGetInstructionOpcode(i) == LLVMFCmp &&
				      LLVMGetFCmpPredicate(i) == LLVMRealUNO;
	return FZ_OK;
}

static bool bf16_nan(uint16_t h) { return (h & 0x7fff) > 0x7f80; }

/* A host kernel whose inputs are all bf16 (no f32 or f64 buffer) rounds
 * every bf16 result without the NaN test (emit.c's cg_nan_clean): every
 * NaN it computes has a zero low half, so the test would change nothing.
 * Over every bf16 pattern of x, each unary math op of bf16 (some of them
 * read from tables the kernel fills), the same ops in f32 cast back to
 * bf16, binary ops with constants and a softmax and log_softmax along
 * rows of 16 must give the emu target's results (the full rounding), bit
 * for bit, NaN as NaN (a skipped test would make a NaN infinite or
 * finite). Where the host rounds in integers (no AVX512-BF16), the
 * rounding of an f32 product must hold no NaN test with a bf16 input and
 * one with an f32 input, or this compares the full rounding with itself. */
START_TEST(host_bf16_clean_nans)
{
	static const char *src[] = {
		"trace f(x: bf16[B, 16]) {\n  a = exp(x)\n  b = log(x)\n  c = sqrt(x)\n"
		"  d = rsqrt(x)\n  e = tanh(x)\n  g = sigmoid(x)\n  h = erf(x)\n"
		"  i = sin(x)\n  return a, b, c, d, e, g, h, i\n}\n",
		"trace f(x: bf16[B, 16]) {\n  a = cos(x)\n  b = expm1(x)\n  c = log1p(x)\n"
		"  d = exp2(x)\n  e = log2(x)\n  g = reciprocal(x)\n  h = silu(x)\n"
		"  i = gelu(x, approximate=tanh)\n  return a, b, c, d, e, g, h, i\n}\n",
		"trace f(x: bf16[B, 16]) {\n  xf = cast(x, dtype=f32)\n"
		"  a = cast(exp(xf), dtype=bf16)\n  b = cast(mul(xf, 3.0), dtype=bf16)\n"
		"  c = cast(log(xf), dtype=bf16)\n  d = pow(x, 2.5)\n  e = fmod(x, 1.5)\n"
		"  g = maximum(x, 1.0)\n  h = div(1.0, x)\n  i = gelu(x)\n"
		"  return a, b, c, d, e, g, h, i\n}\n",
		"trace f(x: bf16[B, 16]) {\n  a = softmax(x, dim=1)\n  b = log_softmax(x, dim=1)\n"
		"  c = cast(softmax(cast(x, dtype=f32), dim=1), dtype=bf16)\n"
		"  return a, b, c\n}\n",
	};
	static const int outs[] = {8, 8, 8, 3};
	const int64_t n = 4096; /* rows of 16: every bf16 pattern */
	int64_t syms[1] = {n};
	for (size_t t = 0; t < sizeof src / sizeof *src; t++) {
		fz_module *m = parse(src[t]);
		fz_trace *tr = fz_module_trace(m, 0);
		fz_tensor in = {.dtype = FZ_BF16, .rank = 2, .shape = {n, 16}, .strides = {16, 1}};
		in.data = malloc((size_t)n * 16 * 2);
		uint16_t *x = in.data;
		for (int64_t i = 0; i < n * 16; i++)
			x[i] = (uint16_t)i;
		fz_tensor out[2][8];
		run_cpu_emu(tr, syms, &in, 1, out, outs[t]);
		for (int o = 0; o < outs[t]; o++) {
			const uint16_t *h = out[0][o].data, *e = out[1][o].data;
			int64_t i = 0;
			while (i < n * 16 && (h[i] == e[i] || (bf16_nan(h[i]) && bf16_nan(e[i]))))
				i++;
			ck_assert_msg(i == n * 16, "trace %d output %d, x 0x%04x: host 0x%04x, emu 0x%04x",
				      (int)t, o, x[i % (n * 16)], h[i % (n * 16)], e[i % (n * 16)]);
			free(out[0][o].data);
			free(out[1][o].data);
		}
		free(in.data);
		fz_module_free(m);
	}
	int clean = 0, f32 = 0;
	host_compile("trace f(x: bf16[64]) {\n  y = cast(mul(cast(x, dtype=f32), 3.0), dtype=bf16)\n"
		     "  return y\n}\n", NULL, count_nan_tests, &clean);
	host_compile("trace f(x: f32[64]) {\n  y = cast(mul(x, 3.0), dtype=bf16)\n"
		     "  return y\n}\n", NULL, count_nan_tests, &f32);
	if (!host_bf16_cvt()) { /* else vcvtneps2bf16 rounds, with no test */
		ck_assert_int_eq(clean, 0);
		ck_assert_int_ge(f32, 1);
	}
}
END_TEST

static int tables_in(const char *src, const int64_t *syms)
{
	return functions_named(src, syms, "", "_tables");
}

/* Costly expressions of one bf16 or f16 value (table.c): on the host
 * they are read from a table of their 65,536 results that the kernel's
 * own code filled, so the results are the computing path's (the emu
 * target's, which has no tables) bit for bit, NaN as NaN: over every bit
 * pattern of x, for an output that is the expression (silu), one that
 * uses it with another input (swiglu's silu(x) * u), gelu's tanh form
 * and an expression of a value the region computes (exp(x + u) rounded,
 * x + u the table's index), in rows of 16, 8, 4 and 2 lanes (x86's
 * zmm, ymm and xmm gathers, and lane by lane). Where the host has
 * AVX-512 the kernel must hold the tables (or this compares the
 * computing path with itself); never for a cheap expression (x * 2 + 1)
 * or a kernel smaller than a table. */
START_TEST(host_tables_match_computed)
{
	static const char *body =
		"  a = silu(x)\n  b = mul(silu(x), u)\n  c = gelu(x, approximate=tanh)\n"
		"  d = exp(add(x, u))\n  return a, b, c, d\n}\n";
	const fz_dtype dt[2] = {FZ_BF16, FZ_F16};
	const int64_t n = 65536;
	int64_t syms[1] = {n / 16};
	/* rows of 16, 8 and 4 gather with zmm, ymm and xmm; of 2, lane by lane */
	for (int t = 0; t < 8; t++) {
		fz_dtype d = dt[t & 1];
		int w = 16 >> (t >> 1);
		char src[512];
		snprintf(src, sizeof src, "trace f(x: %s[B, %d], u: %s[B, %d]) {\n%s",
			 fz_dtype_name(d), w, fz_dtype_name(d), w, body);
		syms[0] = n / w;
		if (host_avx512())
			ck_assert_msg(tables_in(src, syms) >= 1,
				      "%s, rows of %d: no tables on an AVX-512 host",
				      fz_dtype_name(d), w);
		fz_module *m = parse(src);
		fz_trace *tr = fz_module_trace(m, 0);
		fz_tensor in[2];
		for (int i = 0; i < 2; i++) {
			in[i] = (fz_tensor){.dtype = d, .rank = 2, .shape = {n / w, w},
					    .strides = {w, 1}};
			in[i].data = malloc((size_t)n * 2);
		}
		uint16_t *x = in[0].data, *u = in[1].data;
		/* 0.75, 1.25, -2 and 3 (bf16 or f16 bits) */
		static const uint16_t ub[2][4] = {{0x3f40, 0x3fa0, 0xc000, 0x4040},
						  {0x3a00, 0x3d00, 0xc000, 0x4200}};
		for (int64_t i = 0; i < n; i++) {
			x[i] = (uint16_t)i;
			u[i] = ub[t & 1][i % 4];
		}
		fz_tensor out[2][8];
		run_cpu_emu(tr, syms, in, 2, out, 4);
		for (int o = 0; o < 4; o++) {
			const unsigned char *h = out[0][o].data, *gen = out[1][o].data;
			/* the first difference, then one assertion: an assertion
			 * per element marks a point each (a write to Check's
			 * pipe), and 2 million of them ran past the timeout */
			int64_t i = 0;
			for (; i < n; i++) {
				double a = fz_load_f64(h, d, i), b = fz_load_f64(gen, d, i);
				if (!(isnan(a) && isnan(b)) && memcmp(h + 2 * i, gen + 2 * i, 2) != 0)
					break;
			}
			ck_assert_msg(i == n, "%s, rows of %d, output %d at x = 0x%04x: host %a, "
				      "computed %a", fz_dtype_name(d), w, o, (unsigned)x[i % n],
				      fz_load_f64(h, d, i % n), fz_load_f64(gen, d, i % n));
			free(out[0][o].data);
			free(out[1][o].data);
		}
		free(in[0].data);
		free(in[1].data);
		fz_module_free(m);
	}
	syms[0] = n / 16;
	int64_t small[1] = {64};
	const char *swiglu = "trace f(x: bf16[B, 16], u: bf16[B, 16]) {\n"
			     "  y = mul(silu(x), u)\n  return y\n}\n";
	if (host_avx512())
		ck_assert_int_eq(tables_in(swiglu, syms), 1);
	const char *cheap = "trace f(x: bf16[B, 16]) {\n  y = add(mul(x, 2), 1)\n  return y\n}\n";
	const char *tiny = "trace f(x: bf16[64, 16]) {\n  y = silu(x)\n  return y\n}\n";
	ck_assert_int_eq(tables_in(cheap, syms), 0);
	ck_assert_int_eq(tables_in(tiny, small), 0);
}
END_TEST

static Suite *codegen_suite(void)
{
	Suite *s = suite_create("codegen");
	TCase *pw = tcase_create("pointwise");
	tcase_add_test(pw, pointwise_f32_exact);
	tcase_add_test(pw, pointwise_odd_inner_extents);
	tcase_add_test(pw, pointwise_casts_and_ints);
	tcase_add_test(pw, cast_f64_to_half_rounds_once);
	tcase_add_test(pw, pointwise_meta);
	tcase_add_test(pw, pointwise_uniform_iota);
	tcase_add_test(pw, seed_operand_bitwise);
	tcase_add_test(pw, seed_operand_streams);
	tcase_add_test(pw, seed_operand_statistics);
	tcase_add_test(pw, seed_operand_compiles_once);
	tcase_add_test(pw, pointwise_math_close);
	tcase_add_test(pw, bf16_subnormal_conversions);
	tcase_add_test(pw, pointwise_exp_tanh_close);
	tcase_add_test(pw, pointwise_pow_constant);
	tcase_add_test(pw, pointwise_pow_within_an_ulp);
	tcase_add_test(pw, pointwise_exp_ends);
	tcase_add_test(pw, host_exp_matches_generic);
	tcase_add_test(pw, host_tables_match_computed);
	tcase_add_test(pw, host_bf16_quiet_rounding);
	tcase_add_test(pw, host_bf16_clean_nans);
	tcase_add_test(pw, bf16_rounding_edges);
	tcase_add_test(pw, host_rotary_rows);
	tcase_add_test(pw, host_even_odd_lanes);
	tcase_add_test(pw, host_row_even_odd_lanes);
	tcase_add_test(pw, host_pointwise_prefetch);
	suite_add_tcase(s, pw);
	TCase *rd = tcase_create("rows");
	tcase_add_test(rd, reduction_inner_outer);
	tcase_add_test(rd, reduction_columns);
	tcase_add_test(rd, normalization_softmax_layernorm);
	tcase_add_test(rd, var_mean_in_one_pass_host);
	tcase_add_test(rd, scan_lengths);
	tcase_add_test(rd, select_rows);
	tcase_add_test(rd, host_streaming_stores);
	tcase_add_test(rd, host_block_sums);
	tcase_add_test(rd, host_keep_first_pass);
	tcase_add_test(rd, host_independent_loops);
	tcase_add_test(rd, rows_onehot_pick);
	tcase_add_test(rd, rows_onehot_even_odd);
	tcase_add_test(rd, rows_rescale_edges);
	tcase_add_test(rd, rows_invariant_loaded_once);
	suite_add_tcase(s, rd);
	TCase *ix = tcase_create("indexing");
	tcase_add_test(ix, indexing_take_and_index_add);
	tcase_add_test(ix, indexing_out_of_range);
	tcase_add_test(ix, indexing_embedding_backward);
	tcase_add_test(ix, indexing_empty_rows);
	suite_add_tcase(s, ix);
	TCase *px = tcase_create("nvptx");
	tcase_add_test(px, ptx_layer_norm_vectorized);
	tcase_add_test(px, ptx_rotary_cat_vectorized);
	tcase_add_test(px, ptx_cross_entropy_lanes);
	tcase_add_test(px, lanes_by_target);
	tcase_add_test(px, compile_trace_folds_views);
	tcase_add_test(px, ptx_targets_and_errors);
	tcase_add_test(px, ptx_pow_square);
	tcase_add_test(px, ptx_row_in_registers);
	tcase_add_test(px, ptx_scan_select);
	tcase_add_test(px, launch_dims_properties);
	tcase_add_test(px, rows_chain_linear);
	suite_add_tcase(s, px);
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(codegen_suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
