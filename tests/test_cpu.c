/*
 * test_cpu.c: the CPU target's pieces: the thread pool (pool.c), host
 * kernels split into parts (the skeletons' host entry points), and matrix
 * products through the BLAS or the built-in loop (blas.c).
 *
 * Parts: every kernel of a set of traces (pointwise of several shape
 * groups, bf16, inner and outer reductions, normalizations, scans, top-k,
 * index_add's serial scatter and its gather by rows) is run whole, as (0, 1), and then as n parts for n = 2
 * .. 7, in reverse order and on the pool; the outputs must be the same
 * bytes. Products: fz_cpu_matmul against an f64 loop over the same
 * operands for every float dtype and i64, linear with bias, batch
 * broadcast, degenerate extents, on a pool of three threads, through the
 * BLAS that is installed and through the loop (FUSEC_BLAS=none); on an
 * Intel CPU with AVX2, OpenBLAS runs AVX2 or AVX-512 kernels. The
 * target's strided copy by tiles gives the plain gather's bytes. Row
 * kernels run in place, where a pass stashes values for the tail.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "codegen.h"
#include "fusec.h"
#include "ir.h"
#include "numeric.h"
#include "plan.h"
#include "pool.h"
#include "target.h"

/* ---- the pool --------------------------------------------------------------------- */

/* The pool tests run twice (loop tests, _i): on fusec's own threads, and
 * on the OpenMP team of a process that has libgomp loaded, as PyTorch's
 * does (pool.c). Each test runs in a process of its own. */
static const char *pool_kind_for(int i)
{
	if (i == 0) {
		setenv("FUSEC_POOL", "own", 1);
		return "own";
	}
	unsetenv("FUSEC_POOL");
	ck_assert_msg(dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL),
		      "libgomp.so.1: %s", dlerror());
	return "openmp";
}

typedef struct count_job {
	atomic_int hits[64];
	atomic_int calls;
	int nparts_seen;
} count_job;

static void count_part(void *arg, int part, int nparts)
{
	count_job *j = arg;
	atomic_fetch_add(&j->hits[part], 1);
	atomic_fetch_add(&j->calls, 1);
	j->nparts_seen = nparts;
}

START_TEST(pool_every_part_once)
{
	const char *kind = pool_kind_for(_i);
	for (int threads = 1; threads <= 4; threads++) {
		fz_pool *p = NULL;
		ck_assert_int_eq(fz_pool_new(threads, &p, NULL), FZ_OK);
		ck_assert_int_eq(fz_pool_threads(p), threads);
		ck_assert_str_eq(fz_pool_kind(p), threads > 1 ? kind : "own");
		for (int rep = 0; rep < 300; rep++) {
			int n = 1 + rep % 64;
			count_job j;
			memset(&j, 0, sizeof j);
			fz_pool_run(p, n, count_part, &j);
			ck_assert_int_eq(atomic_load(&j.calls), n);
			for (int i = 0; i < 64; i++)
				ck_assert_int_eq(atomic_load(&j.hits[i]), i < n ? 1 : 0);
			ck_assert_int_eq(j.nparts_seen, n);
		}
		count_job j;
		memset(&j, 0, sizeof j);
		fz_pool_run(p, 0, count_part, &j);
		ck_assert_int_eq(atomic_load(&j.calls), 0);
		fz_pool_free(p);
	}
	fz_pool_free(NULL);
}
END_TEST

typedef struct nest_job {
	fz_pool *p;
	atomic_int inner;
} nest_job;

static void inner_part(void *arg, int part, int nparts)
{
	(void)part;
	(void)nparts;
	atomic_fetch_add(&((nest_job *)arg)->inner, 1);
}

static void outer_part(void *arg, int part, int nparts)
{
	(void)part;
	(void)nparts;
	nest_job *j = arg;
	fz_pool_run(j->p, 5, inner_part, j); /* inline, not a deadlock */
}

START_TEST(pool_nested_runs_inline)
{
	const char *kind = pool_kind_for(_i);
	fz_pool *p = NULL;
	ck_assert_int_eq(fz_pool_new(3, &p, NULL), FZ_OK);
	ck_assert_str_eq(fz_pool_kind(p), kind);
	nest_job j = {p, 0};
	fz_pool_run(p, 7, outer_part, &j);
	ck_assert_int_eq(atomic_load(&j.inner), 35);
	fz_pool_free(p);
}
END_TEST

static void *submitter(void *arg)
{
	fz_pool *p = arg;
	for (int rep = 0; rep < 200; rep++) {
		count_job j;
		memset(&j, 0, sizeof j);
		fz_pool_run(p, 1 + rep % 17, count_part, &j);
		if (atomic_load(&j.calls) != 1 + rep % 17)
			return (void *)1;
	}
	return NULL;
}

START_TEST(pool_two_callers)
{
	const char *kind = pool_kind_for(_i);
	fz_pool *p = NULL;
	ck_assert_int_eq(fz_pool_new(3, &p, NULL), FZ_OK);
	ck_assert_str_eq(fz_pool_kind(p), kind);
	pthread_t a, b;
	void *ra, *rb;
	pthread_create(&a, NULL, submitter, p);
	pthread_create(&b, NULL, submitter, p);
	pthread_join(a, &ra);
	pthread_join(b, &rb);
	ck_assert_ptr_null(ra);
	ck_assert_ptr_null(rb);
	fz_pool_free(p);
}
END_TEST

START_TEST(pool_parts_bounds)
{
	fz_pool *p = NULL;
	ck_assert_int_eq(fz_pool_new(2, &p, NULL), FZ_OK);
	ck_assert_int_eq(fz_pool_parts(p, 0, 1), 1);
	ck_assert_int_eq(fz_pool_parts(p, 100, 1000), 1);
	ck_assert_int_eq(fz_pool_parts(p, 3000, 1000), 3);
	ck_assert_int_eq(fz_pool_parts(p, 1 << 30, 1000), 8);
	ck_assert_int_eq(fz_pool_parts(NULL, 1 << 30, 1), 1);
	fz_pool_free(p);
	ck_assert_int_ge(fz_cpu_count(), 1);
}
END_TEST

/* ---- host kernels in parts ----------------------------------------------------------- */

static const char *part_traces[] = {
	/* pointwise, bf16, 8-wide lanes, and an extent that halves them */
	"trace a(x: bf16[37, 64], b: bf16[64], z: f32[5, 12]) {\n"
	"  y = gelu(add(x, b), approximate=tanh)\n"
	"  w = exp(z)\n"
	"  return y, w\n}\n",
	/* odd sizes: lanes of 1 */
	"trace b(x: f32[13, 7]) {\n  y = mul(sigmoid(x), x)\n  return y\n}\n",
	/* inner reductions and a normalization */
	"trace c(x: f32[29, 40], w: f32[40], b: f32[40]) {\n"
	"  y = layer_norm(x, w, b, dims=[1], eps=1e-5)\n  return y\n}\n",
	"trace d(x: bf16[17, 96], w: bf16[96]) {\n"
	"  y = rms_norm(x, w, dims=[1], eps=1e-5)\n  return y\n}\n",
	"trace e(x: f32[31, 24]) {\n  y = softmax(x, dim=1)\n  m = amax(x, dims=[1])\n"
	"  return y, m\n}\n",
	/* an outer reduction: rows are columns */
	"trace f(x: f32[50, 19]) {\n  s = sum(x, dims=[0])\n  return s\n}\n",
	/* scan and selection: rows of the part */
	"trace h(x: f32[13, 40]) {\n  y = cumsum(x, dim=1)\n  return y\n}\n",
	"trace i(x: bf16[6, 9, 5]) {\n  y = cumsum(x, dim=1)\n  return y\n}\n",
	"trace j(x: f32[11, 30]) {\n  v, k = topk(x, k=4, dim=1)\n  return v, k\n}\n",
	/* index_add along dim 0: a gather, the parts split the rows of y
	 * (indices repeat: each row's adds in src's order), each sorting its
	 * own rows of idx's inverse in the shared scratch; bf16 rounds at each
	 * add; an elementwise follower in the region, and an output of
	 * another shape (the follower's x, which the gather reads too) */
	"trace g(x: f32[6, 8], i: i64[20], s: f32[20, 8]) {\n"
	"  y = index_add(x, i, s, dim=0)\n  return y\n}\n",
	"trace k(x: f64[6, 3, 4], i: i64[25], s: f64[25, 3, 4]) {\n"
	"  y = index_add(mul(x, 2.0), i, s, dim=0)\n  return y\n}\n",
	"trace m(x: bf16[6, 80], i: i32[20], s: bf16[20, 80]) {\n"
	"  y = index_add(x, i, s, dim=0)\n  return y\n}\n",
	"trace n(i: i64[30], s: bf16[30, 96], w: f32[576]) {\n"
	"  wf = mul(w, 0.5)\n  x = reshape(wf, shape=[6, 96])\n"
	"  y = cast(mul(index_add(x, i, cast(s, dtype=f32), dim=0), 0.5), dtype=bf16)\n"
	"  return y, wf\n}\n",
	/* any other index_add: the scatter runs in part 0 only */
	"trace l(x: f32[8, 6], i: i64[20], s: f32[8, 20]) {\n"
	"  y = index_add(x, i, s, dim=1)\n  return y\n}\n",
};
/* the traces whose every part writes some of each output at 2 and 3 parts
 * (6 rows: chunks of 3 and 2; at 4 and 5 parts, chunks of 2 leave parts
 * with none) */
static const bool part_all_write[] = {
	[9] = true, [10] = true, [11] = true, [12] = true,
};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

typedef struct parts_ctx {
	fz_compiler *c;
	fz_pool *pool;
	int kernels;
	bool all_write;        /* every part writes some of each output */
} parts_ctx;

typedef struct part_call {
	fz_host_fn fn;
	void **bufs;
	int32_t *bad;
} part_call;

static void call_part(void *arg, int part, int nparts)
{
	part_call *pc = arg;
	pc->fn(pc->bufs, NULL, pc->bad, part, nparts);
}

static fz_status check_parts(const fz_region *r, int op, fz_kernel *k, void *ud, char **err)
{
	(void)op;
	(void)err;
	parts_ctx *x = ud;
	ck_assert_int_eq(fz_kernel_jit(x->c, k, err), FZ_OK);
	int nb = r->n_in + r->n_out;
	void **bufs = calloc((size_t)nb + 1, sizeof *bufs), **ref = calloc((size_t)nb + 1, sizeof *ref);
	size_t *bytes = calloc((size_t)nb, sizeof *bytes);
	/* a scratch block after the outputs, where the kernel has one (as
	 * exec.c stages it), filled with garbage: the parts share it */
	int64_t sb = 0;
	for (int i = 0; i < k->n_scratch; i++)
		sb += fz_ext_eval(k->scratch[i], NULL);
	if (k->n_scratch) {
		bufs[nb] = aligned_alloc(64, (size_t)(sb + 63) / 64 * 64);
		ref[nb] = aligned_alloc(64, (size_t)(sb + 63) / 64 * 64);
		memset(bufs[nb], 0xA5, (size_t)sb);
		memset(ref[nb], 0x5A, (size_t)sb);
	}
	for (int i = 0; i < nb; i++) {
		const fz_value *v = i < r->n_in ? r->in[i] : r->out[i - r->n_in];
		int64_t n = fz_type_numel_at(&v->type, NULL);
		fz_dtype d = v->type.dtype;
		bytes[i] = (size_t)n * fz_dtype_size(d);
		bufs[i] = aligned_alloc(64, (bytes[i] + 63) / 64 * 64);
		ref[i] = aligned_alloc(64, (bytes[i] + 63) / 64 * 64);
		for (int64_t e = 0; e < n; e++) {
			if (i >= r->n_in)
				break;
			if (fz_dtype_is_float(d))
				fz_store_f64(bufs[i], d, e, 4 * urand() - 2);
			else /* an index: 0 .. 5, inside every extent above */
				fz_store_i64(bufs[i], d, e, (int64_t)(urand() * 6));
		}
		if (i < r->n_in)
			memcpy(ref[i], bufs[i], bytes[i]);
	}
	int32_t bad = 0;
	k->host(ref, NULL, &bad, 0, 1);
	ck_assert_int_eq(bad, 0);
	for (int n = 2; n <= 7; n++) {
		for (int i = r->n_in; i < nb; i++)
			memset(bufs[i], 0xA5, bytes[i]);
		for (int p = n - 1; p >= 0; p--) /* reverse order */
			k->host(bufs, NULL, &bad, p, n);
		for (int i = r->n_in; i < nb; i++)
			ck_assert_msg(!memcmp(bufs[i], ref[i], bytes[i]),
				      "region %d: %d parts differ from one", r->id, n);
		for (int i = r->n_in; i < nb; i++)
			memset(bufs[i], 0x5A, bytes[i]);
		part_call pc = {k->host, bufs, &bad};
		fz_pool_run(x->pool, n, call_part, &pc);
		for (int i = r->n_in; i < nb; i++)
			ck_assert_msg(!memcmp(bufs[i], ref[i], bytes[i]),
				      "region %d: %d parts on the pool differ", r->id, n);
	}
	/* each output byte is written by exactly one part: part p alone,
	 * over two fills, changes only its own chunk (no part redoes the
	 * work of another, which equal results would not show) */
	for (int n = 2; n <= 5; n++) {
		for (int i = r->n_in; i < nb; i++) {
			unsigned char *owner = calloc(bytes[i] + 1, 1);
			for (int p = 0; p < n; p++) {
				bool wrote_any = false;
				unsigned char *w = calloc(bytes[i] + 1, 1);
				for (int f = 0; f < 2; f++) {
					int fill = f ? 0x5A : 0xA5;
					for (int j = r->n_in; j < nb; j++)
						memset(bufs[j], fill, bytes[j]);
					k->host(bufs, NULL, &bad, p, n);
					for (size_t b = 0; b < bytes[i]; b++)
						if (((unsigned char *)bufs[i])[b] != fill)
							w[b] = 1;
				}
				for (size_t b = 0; b < bytes[i]; b++) {
					if (!w[b])
						continue;
					wrote_any = true;
					ck_assert_msg(!owner[b], "region %d: parts %d and %d of %d "
						      "both write byte %zu of output %d", r->id,
						      owner[b] - 1, p, n, b, i - r->n_in);
					owner[b] = (unsigned char)(p + 1);
				}
				ck_assert_msg(wrote_any || !x->all_write || n > 3, "region %d: part %d "
					      "of %d writes nothing of output %d", r->id, p, n,
					      i - r->n_in);
				free(w);
			}
			for (size_t b = 0; b < bytes[i]; b++)
				ck_assert_msg(owner[b], "region %d: no part of %d writes byte "
					      "%zu of output %d", r->id, n, b, i - r->n_in);
			free(owner);
		}
	}
	ck_assert_int_eq(bad, 0);
	for (int i = 0; i < nb + 1; i++) {
		free(bufs[i]);
		free(ref[i]);
	}
	free(bufs);
	free(ref);
	free(bytes);
	x->kernels++;
	return FZ_OK;
}

START_TEST(kernels_in_parts)
{
	const char *src = part_traces[_i];
	fz_module *m = NULL;
	char *err = NULL;
	ck_assert_int_eq(fz_module_parse(src, strlen(src), "<t>", &m, &err), FZ_OK);
	fz_trace *t = fz_module_trace(m, 0);
	ck_assert_int_eq(fz_trace_verify(t, &err), FZ_OK);
	fz_cg_options o;
	ck_assert_int_eq(fz_cg_options_parse("host", &o, NULL), FZ_OK);
	parts_ctx x = {0};
	x.all_write = (size_t)_i < sizeof part_all_write / sizeof *part_all_write &&
		      part_all_write[_i];
	ck_assert_int_eq(fz_compiler_new(&o, &x.c, &err), FZ_OK);
	ck_assert_int_eq(fz_pool_new(3, &x.pool, &err), FZ_OK);
	fz_status st = fz_compile_trace(x.c, t, NULL, -1, check_parts, &x, &err);
	ck_assert_msg(st == FZ_OK, "%s", err ? err : "?");
	ck_assert_int_gt(x.kernels, 0);
	fz_pool_free(x.pool);
	fz_compiler_free(x.c);
	fz_module_free(m);
}
END_TEST

/* ---- matrix products -------------------------------------------------------------------- */

/* y = a op(b) (+ bias) in f64 (i64 for integers), then stored in m's dtype. */
static void reference(const fz_matmul *m, void *y)
{
	int64_t nb = 1;
	for (int d = 0; d < m->nbd; d++)
		nb *= m->bshape[d];
	for (int64_t t = 0; t < nb; t++) {
		int64_t ao = 0, bo = 0, r = t;
		for (int d = m->nbd - 1; d >= 0; d--) {
			ao += r % m->bshape[d] * m->a_bstride[d];
			bo += r % m->bshape[d] * m->b_bstride[d];
			r /= m->bshape[d];
		}
		for (int64_t i = 0; i < m->M; i++)
			for (int64_t j = 0; j < m->N; j++) {
				double s = 0;
				int64_t si = 0;
				for (int64_t k = 0; k < m->K; k++) {
					int64_t bi = m->b_trans ? bo + j * m->K + k : bo + k * m->N + j;
					if (fz_dtype_is_float(m->dtype))
						s += fz_load_f64(m->a, m->dtype, ao + i * m->K + k) *
						     fz_load_f64(m->b, m->dtype, bi);
					else
						si += fz_load_i64(m->a, m->dtype, ao + i * m->K + k) *
						      fz_load_i64(m->b, m->dtype, bi);
				}
				int64_t o = (t * m->M + i) * m->N + j;
				if (fz_dtype_is_float(m->dtype))
					fz_store_f64(y, m->dtype, o, s + (m->bias ?
						     fz_load_f64(m->bias, m->dtype, j) : 0));
				else
					fz_store_i64(y, m->dtype, o, si + (m->bias ?
						     fz_load_i64(m->bias, m->dtype, j) : 0));
			}
	}
}

static void *filled(fz_dtype d, int64_t n)
{
	void *p = malloc((size_t)(n > 0 ? n : 1) * fz_dtype_size(d));
	for (int64_t i = 0; i < n; i++) {
		if (fz_dtype_is_float(d))
			fz_store_f64(p, d, i, 2 * urand() - 1);
		else
			fz_store_i64(p, d, i, (int64_t)(urand() * 7) - 3);
	}
	return p;
}

typedef struct mm_case {
	int64_t M, N, K;
	bool trans, bias;
	int nbd;
	int64_t bshape[2];
	bool a_bcast[2], b_bcast[2];
} mm_case;

static const mm_case mm_cases[] = {
	{70, 90, 130, false, false, 0, {0}, {0}, {0}},
	{1, 33, 65, false, false, 0, {0}, {0}, {0}},       /* a row */
	{300, 1, 17, false, false, 0, {0}, {0}, {0}},      /* a column */
	{129, 40, 64, true, true, 0, {0}, {0}, {0}},       /* linear with bias */
	{9, 11, 0, true, true, 0, {0}, {0}, {0}},          /* K = 0: the bias */
	{16, 8, 24, false, false, 2, {3, 5}, {false, false}, {true, false}},
	{20, 12, 8, false, false, 1, {9}, {true}, {false}},
	/* K = 1: every product is exact in f32, so each result is the
	 * reference's own rounding, bit for bit (the widenings and the
	 * rounding to bf16 or f16, their tails of 8 included) */
	{70, 13, 1, false, false, 0, {0}, {0}, {0}},
};

static void run_mm_cases(fz_blas *b, fz_pool *pool)
{
	static const fz_dtype dts[] = {FZ_F32, FZ_BF16, FZ_F16, FZ_F64, FZ_I64};
	for (size_t c = 0; c < sizeof mm_cases / sizeof mm_cases[0]; c++)
		for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
			const mm_case *mc = &mm_cases[c];
			fz_dtype d = dts[di];
			fz_matmul m = {.region = 1, .dtype = d, .M = mc->M, .N = mc->N,
				       .K = mc->K, .b_trans = mc->trans, .nbd = mc->nbd};
			int64_t as = mc->M * mc->K, bs = mc->K * mc->N, nb = 1;
			for (int i = mc->nbd - 1; i >= 0; i--) {
				m.bshape[i] = mc->bshape[i];
				m.a_bstride[i] = mc->a_bcast[i] ? 0 : as;
				m.b_bstride[i] = mc->b_bcast[i] ? 0 : bs;
				as *= mc->a_bcast[i] ? 1 : mc->bshape[i];
				bs *= mc->b_bcast[i] ? 1 : mc->bshape[i];
				nb *= mc->bshape[i];
			}
			void *A = filled(d, as), *B = filled(d, bs);
			void *bias = mc->bias ? filled(d, mc->N) : NULL;
			int64_t ny = nb * mc->M * mc->N;
			void *Y = filled(d, ny), *R = filled(d, ny);
			m.a = A;
			m.b = B;
			m.bias = bias;
			m.y = Y;
			char *err = NULL;
			ck_assert_int_eq(fz_cpu_matmul(b, pool, &m, &err), FZ_OK);
			reference(&m, R);
			/* f32 sums of K products of |x| <= 1: within K * 2^-22 */
			double tol = d == FZ_F64 ? 1e-12 : d == FZ_F32 ? 1e-6 * (double)(mc->K + 1) :
				     d == FZ_F16 ? 2e-3 * (double)(mc->K + 1) : 0;
			for (int64_t i = 0; i < ny; i++) {
				double g = fz_dtype_is_float(d) ? fz_load_f64(Y, d, i) :
					   (double)fz_load_i64(Y, d, i);
				double w = fz_dtype_is_float(d) ? fz_load_f64(R, d, i) :
					   (double)fz_load_i64(R, d, i);
				double lim = d == FZ_BF16 ? fabs(w) * 0x1p-7 + 1e-3 * (double)(mc->K + 1) : tol;
				if (mc->K == 1 && !mc->bias)
					lim = 0;
				ck_assert_msg(fabs(g - w) <= lim, "%s case %zu [%lld]: got %g want %g (%s)",
					      fz_dtype_name(d), c, (long long)i, g, w, fz_blas_name(b));
			}
			free(A);
			free(B);
			free(bias);
			free(Y);
			free(R);
		}
}

START_TEST(matmul_blas)
{
	fz_blas *b = NULL;
	fz_pool *p = NULL;
	unsetenv("FUSEC_BLAS");
	ck_assert_int_eq(fz_blas_open(&b, NULL), FZ_OK);
	ck_assert_int_eq(fz_pool_new(3, &p, NULL), FZ_OK);
	run_mm_cases(b, p);
	run_mm_cases(b, NULL);
	fz_pool_free(p);
	fz_blas_close(b);
}
END_TEST

START_TEST(matmul_loop)
{
	fz_blas *b = NULL;
	fz_pool *p = NULL;
	setenv("FUSEC_BLAS", "none", 1);
	ck_assert_int_eq(fz_blas_open(&b, NULL), FZ_OK);
	unsetenv("FUSEC_BLAS");
	ck_assert_str_eq(fz_blas_name(b), "none");
	ck_assert_int_eq(fz_pool_new(2, &p, NULL), FZ_OK);
	run_mm_cases(b, p);
	run_mm_cases(NULL, p);
	fz_pool_free(p);
	fz_blas_close(b);
	fz_blas_close(NULL);
}
END_TEST

/* A sequential OpenBLAS (Debian's libopenblas0-serial, where installed;
 * the system's libopenblas.so.0 or libblas.so.3 can be that build) is not
 * safe to call from two threads at once: blas.c then takes one product at
 * a time, whole. It is detected, and four threads, two through a shared
 * pool and two without, repeat their own product and get the same bytes
 * every time. (The race itself shows in a plain C harness, four threads
 * each repeating one sgemm_ on their own operands: about 1% wrong; this
 * test, with the lock taken out, did not catch it in three runs.) */
#define SERIAL_OPENBLAS "/usr/lib/x86_64-linux-gnu/openblas-serial/libopenblas.so.0"

typedef struct seq_arg {
	fz_blas *b;
	fz_pool *pool;
	int id, bad;
} seq_arg;

static void *seq_worker(void *arg)
{
	seq_arg *a = arg;
	enum { M = 64, K = 128, N = 96 };
	float *A = filled(FZ_F32, M * K), *B = filled(FZ_F32, K * N);
	float *Y = calloc(M * N, sizeof *Y), *Y0 = calloc(M * N, sizeof *Y0);
	for (int i = 0; i < M * K; i++) /* each thread its own operands */
		A[i] = A[i] * (float)(a->id + 1) + (float)a->id;
	fz_matmul m = {.region = 1, .dtype = FZ_F32, .M = M, .N = N, .K = K,
		       .a = A, .b = B, .y = Y0};
	char *err = NULL;
	ck_assert_int_eq(fz_cpu_matmul(a->b, NULL, &m, &err), FZ_OK);
	m.y = Y;
	for (int it = 0; it < 3000; it++) {
		ck_assert_int_eq(fz_cpu_matmul(a->b, a->pool, &m, &err), FZ_OK);
		a->bad += memcmp(Y, Y0, sizeof *Y * M * N) != 0;
	}
	free(A);
	free(B);
	free(Y);
	free(Y0);
	return NULL;
}

START_TEST(matmul_sequential_blas)
{
	if (access(SERIAL_OPENBLAS, R_OK) != 0) {
		fprintf(stderr, "matmul_sequential_blas: %s is not installed; "
			"nothing to check here\n", SERIAL_OPENBLAS);
		return;
	}
	fz_blas *b = NULL;
	fz_pool *p = NULL;
	setenv("FUSEC_BLAS", SERIAL_OPENBLAS, 1);
	ck_assert_int_eq(fz_blas_open(&b, NULL), FZ_OK);
	unsetenv("FUSEC_BLAS");
	ck_assert_msg(strstr(fz_blas_name(b), "sequential"), "%s", fz_blas_name(b));
	ck_assert_int_eq(fz_pool_new(2, &p, NULL), FZ_OK);
	pthread_t th[4];
	seq_arg args[4];
	for (int i = 0; i < 4; i++) {
		args[i] = (seq_arg){b, i < 2 ? p : NULL, i, 0};
		ck_assert_int_eq(pthread_create(&th[i], NULL, seq_worker, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ck_assert_msg(args[i].bad == 0, "thread %d: %d of 3000 products differ",
			      i, args[i].bad);
	}
	fz_pool_free(p);
	fz_blas_close(b);
}
END_TEST

/* Operands read where they lie (fz_matmul.lda/ldb): a's rows inside wider
 * rows (lda 10 for K 7), or a stored as its transpose [K, M] inside wider
 * rows (a_trans, a weight gradient's dYᵀ: lda 6 for M 5), b seen
 * transposed with its own row stride (ldb 9), two batches at strides of
 * their own; against the same product on dense copies, through the BLAS
 * and the plain loop, f32, f64, bf16 and f16 (whose panels keep the
 * strides; the values and sums are exact in every dtype). The tall case (M 300) is cut into
 * slices of rows across the pool, so a transposed a's slice starts at
 * column r0 of the stored matrix. */
typedef struct strided_dims {
	int M, K, N, lda, ldb, sa, sb;
	bool at;
} strided_dims;

static void strided_case(fz_blas *b, fz_pool *pool, fz_dtype d, strided_dims z)
{
	enum { NB = 2 };
	int M = z.M, K = z.K, N = z.N;
	size_t es = fz_dtype_size(d);
	char *A = calloc((size_t)(NB * z.sa), es), *Bm = calloc((size_t)(NB * z.sb), es);
	char *Ad = calloc((size_t)(NB * M * K), es), *Bd = calloc((size_t)(NB * N * K), es);
	char *Y = calloc((size_t)(NB * M * N), es), *R = calloc((size_t)(NB * M * N), es);
	for (int t = 0; t < NB; t++)
		for (int i = 0; i < M; i++)
			for (int k = 0; k < K; k++) {
				double v = 0.25 * (double)((t * 31 + i * 7 + k * 3) % 11) - 1.0;
				fz_store_f64(A, d, t * z.sa + (z.at ? k * z.lda + i : i * z.lda + k), v);
				fz_store_f64(Ad, d, (t * M + i) * K + k, v);
			}
	for (int t = 0; t < NB; t++)
		for (int j = 0; j < N; j++)
			for (int k = 0; k < K; k++) {
				double v = 0.5 * (double)((t * 13 + j * 5 + k) % 7) - 1.5;
				fz_store_f64(Bm, d, t * z.sb + j * z.ldb + k, v);
				fz_store_f64(Bd, d, (t * N + j) * K + k, v);
			}
	fz_matmul m = {.region = 1, .dtype = d, .M = M, .N = N, .K = K, .b_trans = true,
		       .a_trans = z.at, .nbd = 1, .bshape = {NB}, .a_bstride = {z.sa},
		       .b_bstride = {z.sb}, .a = A, .b = Bm, .y = Y, .lda = z.lda, .ldb = z.ldb};
	fz_matmul r = {.region = 1, .dtype = d, .M = M, .N = N, .K = K, .b_trans = true,
		       .nbd = 1, .bshape = {NB}, .a_bstride = {M * K}, .b_bstride = {N * K},
		       .a = Ad, .b = Bd, .y = R};
	char *err = NULL;
	ck_assert_int_eq(fz_cpu_matmul(b, pool, &m, &err), FZ_OK);
	ck_assert_int_eq(fz_cpu_matmul(b, pool, &r, &err), FZ_OK);
	for (int i = 0; i < NB * M * N; i++) {
		/* the exact sum (every partial sum is a multiple of 1/8 below
		 * 2^14), rounded once to d as the product rounds */
		int t = i / (M * N), row = i / N % M, col = i % N;
		double e = 0;
		for (int k = 0; k < K; k++)
			e += fz_load_f64(Ad, d, (t * M + row) * K + k) *
			     fz_load_f64(Bd, d, (t * N + col) * K + k);
		char one[8];
		fz_store_f64(one, d, 0, e);
		ck_assert_msg(fz_load_f64(Y, d, i) == fz_load_f64(R, d, i), "%s%s [%d]: %g, "
			      "dense %g (%s)", fz_dtype_name(d), z.at ? " (a transposed)" : "",
			      i, fz_load_f64(Y, d, i), fz_load_f64(R, d, i), fz_blas_name(b));
		ck_assert_msg(fz_load_f64(Y, d, i) == fz_load_f64(one, d, 0), "%s [%d]: %g, "
			      "exactly %g (%s)", fz_dtype_name(d), i, fz_load_f64(Y, d, i),
			      fz_load_f64(one, d, 0), fz_blas_name(b));
	}
	free(A), free(Bm), free(Ad), free(Bd), free(Y), free(R);
}

START_TEST(matmul_strided_operands)
{
	static const strided_dims dims[] = {
		{5, 7, 4, 10, 9, 64, 48, false},
		{5, 7, 4, 6, 9, 64, 48, true},
		{300, 33, 20, 301, 40, 33 * 301 + 5, 20 * 40, true},
		/* few rows, K 4100: bf16 and f16 widen b fifteen columns at a
		 * time (blas.c's stream_b) */
		{3, 4100, 40, 4100, 4105, 3 * 4100, 40 * 4105, false},
		/* one row (a decode step's token), an odd count of columns:
		 * bf16 takes b's rows two at a time, then the last alone */
		{1, 4100, 41, 4100, 4105, 4100, 41 * 4105, false},
		/* and 43: on an Intel CPU four at a time, then a pair, then
		 * the last alone */
		{1, 4100, 43, 4100, 4105, 4100, 43 * 4105, false},
		/* six rows: bf16 takes them four, then two, at a time */
		{6, 1030, 11, 1031, 1033, 6 * 1031, 11 * 1033, false},
	};
	fz_blas *b = NULL;
	fz_pool *p = NULL;
	unsetenv("FUSEC_BLAS");
	ck_assert_int_eq(fz_blas_open(&b, NULL), FZ_OK);
	ck_assert_int_eq(fz_pool_new(2, &p, NULL), FZ_OK);
	static const fz_dtype dts[] = {FZ_F32, FZ_F64, FZ_BF16, FZ_F16};
	for (int k = 0; k < 4; k++)
		for (size_t c = 0; c < sizeof dims / sizeof dims[0]; c++) {
			fz_dtype d = dts[k];
			strided_case(b, p, d, dims[c]);      /* the BLAS */
			strided_case(NULL, p, d, dims[c]);   /* the plain loop */
		}
	fz_pool_free(p);
	fz_blas_close(b);
}
END_TEST

START_TEST(matmul_bad_library)
{
	fz_blas *b = NULL;
	setenv("FUSEC_BLAS", "/nonexistent/libopenblas.so.0", 1);
	ck_assert_int_eq(fz_blas_open(&b, NULL), FZ_OK);
	unsetenv("FUSEC_BLAS");
	ck_assert_str_eq(fz_blas_name(b), "none"); /* not opened: the loop */
	fz_blas_close(b);
}
END_TEST

/* OpenBLAS runs the kernels the CPU can run: on an Intel CPU with AVX2
 * and FMA, never the SSE-era ones its model table falls back to on a
 * model it does not know (Prescott, at 3.4 GFLOP/s where SkylakeX's run
 * at 50-150 on this project's machine); the OPENBLAS_CORETYPE that blas.c
 * sets while the library loads is gone from the environment after. */
START_TEST(matmul_blas_kernels)
{
#if defined(__x86_64__) && defined(__GNUC__)
	unsetenv("FUSEC_BLAS");
	unsetenv("OPENBLAS_CORETYPE");
	fz_blas *b = NULL;
	ck_assert_int_eq(fz_blas_open(&b, NULL), FZ_OK);
	ck_assert_ptr_null(getenv("OPENBLAS_CORETYPE"));
	/* the core the loaded library runs, asked of it (not of the name) */
	void *dl = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
	char *(*corename)(void) = dl ? (char *(*)(void))dlsym(dl, "openblas_get_corename") : NULL;
	const char *name = corename ? corename() : fz_blas_name(b);
	__builtin_cpu_init();
	if (!corename || !strstr(fz_blas_name(b), "openblas") || !__builtin_cpu_is("intel") ||
	    !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
		fprintf(stderr, "matmul_blas_kernels: %s on this CPU: nothing to check\n", name);
		fz_blas_close(b);
		return;
	}
	static const char *old[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem",
				    "Sandybridge", "Atom", "Katmai", "Coppermine", "Northwood"};
	for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
		ck_assert_msg(!strstr(name, old[i]), "an AVX2 CPU runs OpenBLAS's %s kernels", name);
	ck_assert_msg(strstr(fz_blas_name(b), name), "%s does not name %s", fz_blas_name(b), name);
	dlclose(dl);
	fz_blas_close(b);
#endif
}
END_TEST

/* ---- strided copies ---------------------------------------------------------------- */

/* The CPU target's copy of a view whose innermost dim is strided goes by
 * tiles across the pool (cpu.c); it must give the bytes of the plain
 * gather for transposes of every element size, extents that are not
 * multiples of the tile, an offset, outer dims on either side, small
 * copies on the calling thread and large ones on the pool. */
START_TEST(copy_transposes)
{
	fz_exec_options o;
	fz_exec_options_init(&o);
	o.threads = 3;
	const fz_target *tg = fz_target_find("cpu");
	fz_device *dev = NULL;
	char *err = NULL;
	ck_assert_int_eq(tg->open(&o, &dev, &err), FZ_OK);
	static const struct {
		int rank;
		int64_t shape[4], strides[4], offset;
	} cases[] = {
		{2, {45, 70}, {1, 45}, 0},               /* a transpose */
		{2, {300, 300}, {1, 301}, 7},            /* on the pool, padded rows */
		{3, {3, 50, 40}, {2000, 1, 50}, 0},      /* batched: last two swapped */
		{3, {40, 3, 33}, {1, 40 * 33, 40}, 5},   /* the contiguous dim outermost */
		{4, {2, 64, 5, 37}, {64 * 5 * 37, 1, 64 * 37, 64}, 0},
		{2, {1, 500}, {1, 1}, 0},                /* contiguous: the plain path */
		{2, {33, 31}, {31, 1}, 0},
		{2, {600, 1}, {1, 600}, 0},
	};
	static const size_t sizes[] = {1, 2, 4, 8, 3};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
		for (size_t e = 0; e < sizeof sizes / sizeof sizes[0]; e++) {
			size_t es = sizes[e];
			fz_layout lay = {.rank = cases[c].rank, .offset = cases[c].offset};
			int64_t n = 1, span = cases[c].offset + 1;
			for (int d = 0; d < lay.rank; d++) {
				lay.shape[d] = cases[c].shape[d];
				lay.strides[d] = cases[c].strides[d];
				n *= lay.shape[d];
				span += (lay.shape[d] - 1) * lay.strides[d];
			}
			unsigned char *src = malloc((size_t)span * es);
			unsigned char *want = malloc((size_t)n * es), *got = malloc((size_t)n * es);
			for (int64_t i = 0; i < span * (int64_t)es; i++)
				src[i] = (unsigned char)(i * 131 + i / 251);
			fz_layout_gather(want, src, es, &lay);
			memset(got, 0xa5, (size_t)n * es);
			ck_assert_int_eq(tg->copy(dev, got, src, es, &lay, NULL, &err), FZ_OK);
			ck_assert_msg(!memcmp(got, want, (size_t)n * es),
				      "case %zu, %zu-byte elements: not the gather's bytes", c, es);
			free(src);
			free(want);
			free(got);
		}
	tg->close(dev);
}
END_TEST

/* ---- the stash of a row pass ------------------------------------------------------ */

/* A caller may run a kernel in place, its output over its input. Softmax's
 * last pass stashes exp(x - max) in the output for the tail to read back
 * (codegen/reduction.c): its tail reads nothing else of the row, so in
 * place it is still right. softmax(x) + x reads x in its tail: the stash
 * must not be taken there, or the tail would add exp(x - max) for x. Both
 * in place against the interpreter on the untouched input. */
static const char *stash_traces[] = {
	"trace sm(x: f32[48, 200]) {\n  y = softmax(x, dim=1)\n  return y\n}\n",
	"trace smx(x: f32[48, 200]) {\n  s = softmax(x, dim=1)\n"
	"  y = add(s, x)\n  return y\n}\n",
	"trace lse(x: f32[48, 200]) {\n  m = amax(x, dims=[1], keepdim=true)\n"
	"  e = exp(sub(x, m))\n  s = sum(e, dims=[1], keepdim=true)\n"
	"  y = mul(e, reciprocal(s))\n  return y, s\n}\n",
};

START_TEST(rows_stash_in_place)
{
	const char *src = stash_traces[_i];
	fz_module *m = NULL;
	char *err = NULL;
	ck_assert_msg(fz_module_parse(src, strlen(src), "stash", &m, &err) == FZ_OK,
		      "%s", err ? err : "");
	fz_trace *t = fz_module_trace(m, 0);
	int64_t shape[2] = {48, 200};
	size_t n = 48 * 200;
	float *x = malloc(n * sizeof *x), *buf = malloc(n * sizeof *buf);
	ck_assert_ptr_nonnull(x);
	ck_assert_ptr_nonnull(buf);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)sin((double)i * 0.37) * 6.0f;
	memcpy(buf, x, n * sizeof *x);
	fz_tensor in, ref[2], out[2];
	fz_tensor_contiguous(&in, x, FZ_F32, 2, shape);
	int n_out = fz_trace_output_count(t);
	ck_assert_int_eq(fz_trace_interpret(t, NULL, &in, 1, ref, n_out, &err), FZ_OK);

	fz_exec_options o;
	fz_exec_options_init(&o);
	o.disk_cache = 0;
	fz_exec *xe = NULL;
	ck_assert_msg(fz_exec_new(t, "cpu", &o, &xe, &err) == FZ_OK, "%s", err ? err : "");
	float s[48];
	fz_tensor_contiguous(&in, buf, FZ_F32, 2, shape);
	fz_tensor_contiguous(&out[0], buf, FZ_F32, 2, shape); /* in place */
	int64_t rshape[2] = {48, 1};
	fz_tensor_contiguous(&out[1], s, FZ_F32, 2, rshape);
	ck_assert_msg(fz_exec_run(xe, NULL, &in, 1, out, n_out, NULL, &err) == FZ_OK,
		      "%s", err ? err : "");
	const float *want = ref[0].data;
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(fabsf(buf[i] - want[i]) <= 1e-5f * fmaxf(1.0f, fabsf(want[i])),
			      "%s: element %zu is %g, the interpreter's %g", src, i,
			      (double)buf[i], (double)want[i]);
	for (int k = 0; k < n_out; k++)
		fz_free(ref[k].data);
	fz_exec_free(xe);
	fz_module_free(m);
	free(x);
	free(buf);
}
END_TEST

static Suite *cpu_suite(void)
{
	Suite *s = suite_create("cpu");
	TCase *tc = tcase_create("pool");
	tcase_add_loop_test(tc, pool_every_part_once, 0, 2);
	tcase_add_loop_test(tc, pool_nested_runs_inline, 0, 2);
	tcase_add_loop_test(tc, pool_two_callers, 0, 2);
	tcase_add_test(tc, pool_parts_bounds);
	suite_add_tcase(s, tc);
	tc = tcase_create("parts");
	tcase_add_loop_test(tc, kernels_in_parts, 0,
			    (int)(sizeof part_traces / sizeof part_traces[0]));
	suite_add_tcase(s, tc);
	tc = tcase_create("copy");
	tcase_add_test(tc, copy_transposes);
	suite_add_tcase(s, tc);
	tc = tcase_create("stash");
	tcase_add_loop_test(tc, rows_stash_in_place, 0,
			    (int)(sizeof stash_traces / sizeof stash_traces[0]));
	suite_add_tcase(s, tc);
	tc = tcase_create("matmul");
	tcase_add_test(tc, matmul_blas);
	tcase_add_test(tc, matmul_sequential_blas);
	tcase_add_test(tc, matmul_strided_operands);
	tcase_add_test(tc, matmul_loop);
	tcase_add_test(tc, matmul_bad_library);
	tcase_add_test(tc, matmul_blas_kernels);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(cpu_suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
